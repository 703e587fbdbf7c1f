"""The node agent: MPS limits from pod policies, GPU-memory enforcement, metrics (``gpuwarden node-agent``).

Modules: ``nvml`` (the NVML interface and the real pynvml implementation), ``fake`` (an in-process
NVML for tests), ``mps`` (the MPS control interface and the implementation that spawns
``nvidia-cuda-mps-control``), ``procfs`` (PID -> cgroup -> pod UID), ``pods`` (the annotations the
webhook writes), ``limits`` (pure decisions), ``agent`` (the tick and the loop), ``metrics``,
``hardlimits`` (detecting ``nvidia-smi memory-limits``).

Which isolation this gives, and which it does not
==================================================

MPS gives soft isolation. What the agent achieves with it:

* **A node-side ceiling.** On each GPU the control daemon's default pinned-memory limit is the
  largest cap among the pods that use (or may yet use) that GPU, and the default active thread
  percentage is the largest thread percentage among governed pods. A client can only lower these
  through its environment (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
  which the webhook sets to the pod's own cap); a tenant who unsets them gets the ceiling, never
  more. Defaults apply to servers started later and are lost on ``quit``: the agent sets them again
  after every daemon restart (health check failing then recovering, a new daemon PID, or defaults
  found reset).
* **Above NVIDIA's equal share.** NVIDIA's device plugin starts its daemon with every client at
  memory / replicas and 100 / replicas percent of threads (NVIDIA/k8s-device-plugin
  ``cmd/mps-control-daemon/mps/daemon.go``), which a client's environment cannot raise. The
  agent's defaults and per-server limits replace those, whether it runs that daemon
  (``--mps-daemon manage``) or the plugin does (``external``), so a cap above the share holds.
  It finds the daemon at ``<root>/<resource>/pipe``, where the plugin puts it (``mps.py``).
* **Per-server limits.** MPS runs one server per user ID. For each running server the agent sets
  ``set_device_pinned_mem_limit`` / ``set_active_thread_percentage`` to the largest cap among the pods
  it serves (pods with a client on it, and pods whose GPU containers declare ``runAsUser`` equal to
  the server's UID). These apply to clients the server creates afterwards, so a pod whose UID's
  server is already running is held to its own cap from its first client even with its
  environment unset, provided a tick ran in between. When every pod on a GPU runs as one UID (a
  Kubeflow notebook image's usual 1000), that server's limit is the largest cap among them, i.e.
  the ceiling: caps below it then rest on the client environment plus detection.
* **Detection and enforcement.** Each tick maps NVML's compute and MPS client processes to pods
  (``/proc/<pid>/cgroup``), sums their memory per container per GPU (the cap is per GPU container
  per GPU; MPS limits are per client process, so a container with several CUDA processes can hold
  several times the limit) and, above the cap, writes an Event on the pod, counts a metric and, as
  ``--on-violation`` says, sends ``terminate_client`` for its MPS clients or evicts the pod through
  the eviction subresource (PodDisruptionBudgets apply). A GPU process in a container that was
  granted no GPU (no GPU resource, DRA claim or gpuwarden record: an image's
  ``ENV NVIDIA_VISIBLE_DEVICES`` does that, docs/node-agent.md) gets the same treatment. GPU
  processes of no known pod and GPUs whose caps exceed memory x overcommit ratio are reported too.
* **Optional hard limits.** Where the driver offers ``nvidia-smi memory-limits`` (r615+), the agent
  sets an NVML cgroup hard limit (cap x GPU containers) keyed on each governed pod's cgroup as soon
  as kubelet creates it, before the first CUDA context (cgroup v2 hosts only). This path is not
  exercised on real hardware here: no r615 driver was available.

What it does not achieve:

* No fault or performance isolation: clients of one server share it; a fatal GPU fault can take
  down every client of that server; memory bandwidth, L2 cache and copy engines are shared; the
  thread percentage bounds SMs per client, not time.
* Pods running as different UIDs do not share a GPU at the same time: a client of a new UID waits
  until the running server's clients have finished, and the new server starts with the daemon
  defaults (the ceiling) until the next tick sets its own limits.
* A process that does not use MPS (its ``CUDA_MPS_PIPE_DIRECTORY`` unset or unreachable) gets a
  context of its own with no MPS limit, unless the GPU is in EXCLUSIVE_PROCESS compute mode; the
  agent warns when it is not, and still sees and reports the process.
* Detection is after the fact: every ``--interval`` seconds, from NVML's per-process used memory.
* Mapping needs the host's PIDs and cgroups (hostPID, host cgroup namespace, host ``/proc``); with
  user namespaces ``runAsUser`` is not the host UID and per-server limits apply only once a client
  is seen.
* MPS device ordinals are taken to be NVML indices (the daemon starts with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
* On a multi-GPU node a pod's GPU is known only once one of its processes appears (the kubelet
  PodResources API is not used): until then it counts towards every GPU's ceiling and towards no
  GPU's oversubscription.
* MIG GPUs: MPS is refused; share them through MIG instances.
* CPU and host memory are left to pod resources: the agent never writes kubepods cgroups, and it
  never calls a per-process memory-limit flag of nvidia-smi (there is none).
"""
