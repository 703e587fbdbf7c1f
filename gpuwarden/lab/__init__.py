"""The scheduling lab: a real kube-apiserver, kube-scheduler and KWOK's simulated GPU nodes.

gpuwarden decides what a pod asks for; the real kube-scheduler decides where it lands, which pod
it preempts and why one stays Pending. Nothing here places pods.

In stages, each importing only those below it (``.importlinter``, ``lab-stages``): ``simulate``
runs every strategy's replay and reports them; ``reporting`` computes what they measured;
``replay`` drives one strategy's lab; ``planning`` decides each strategy's pods and layout
before its replay; ``inputs`` reads traces into rows and pods; ``cluster`` is the control plane,
kube-scheduler, KWOK's nodes and Kueue.
"""
