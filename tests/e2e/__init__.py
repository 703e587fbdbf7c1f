"""End-to-end tests against a real etcd and kube-apiserver (see controlplane.py)."""
