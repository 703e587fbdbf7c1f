"""Reading a pod: quantities, container resources, Kubeflow workloads and the annotation contract."""
