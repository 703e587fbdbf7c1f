"""What each strategy replays: its policies, its layout of nodes (MPS pool sized to its shared
demand) and every trace row's pod decided once by the policy core."""
