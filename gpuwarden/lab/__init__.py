"""The scheduling lab: a real kube-apiserver, kube-scheduler and KWOK's simulated GPU nodes.

gpuwarden decides what a pod asks for; the real kube-scheduler decides where it lands, which pod
it preempts and why one stays Pending. Nothing here places pods.
"""
