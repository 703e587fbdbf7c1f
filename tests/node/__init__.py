"""Tests of the node agent (gpuwarden.node) and its Kubernetes side (gpuwarden.kube.node_pods)."""
