"""What the lab replays: workload traces (its own format, Alibaba's GPU cluster trace, the built-in
weeks) and the pods each workload kind becomes."""
