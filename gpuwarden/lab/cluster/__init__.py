"""The lab's cluster: a real control plane, kube-scheduler, KWOK's GPU nodes and their Stages, and
Kueue."""
