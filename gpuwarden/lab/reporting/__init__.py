"""What the replays measured: per-strategy figures, the comparison table and the plot."""
