"""Names gpuwarden writes on pods and reads back: the contract between the webhook and the node agent.

The decision annotations are written and read only through PodRecord (pod/record.py)."""

from typing import Final

API_GROUP: Final = "gpuwarden.io"
API_VERSION: Final = "gpuwarden.io/v1alpha1"
POLICY_KIND: Final = "GPUPolicy"

# Pod label a user sets to ask for a profile by name (honoured only where the tenant allows it).
PROFILE_LABEL: Final = "gpuwarden.io/profile"
# Pod or namespace label that takes the object out of gpuwarden's scope (the chart's webhooks skip it).
OPT_OUT_LABEL: Final = "gpuwarden.io/ignore"

# The pod-level DRA claim (spec.resourceClaims[].name) through which a shared profile on the dra
# backend gives its container a share of one GPU; a container using it holds one GPU.
DRA_CLAIM_NAME: Final = "gpuwarden-gpu"

# Annotations recording the resolved decision on the pod; the node agent reads these.
ANNOTATION_PROFILE: Final = "gpuwarden.io/profile"
ANNOTATION_TENANT: Final = "gpuwarden.io/tenant"
ANNOTATION_POLICY: Final = "gpuwarden.io/policy"
ANNOTATION_RULE: Final = "gpuwarden.io/rule"
ANNOTATION_BACKEND: Final = "gpuwarden.io/backend"
ANNOTATION_GPU_COUNT: Final = "gpuwarden.io/gpu-count"
ANNOTATION_GPU_SHARED: Final = "gpuwarden.io/gpu-shared"
# Enforced GPU-memory cap per container, as a Kubernetes quantity (e.g. "8Gi").
ANNOTATION_GPU_MEMORY_LIMIT: Final = "gpuwarden.io/gpu-memory-limit"
# GPU memory the scheduler reserves per container: the cap divided by the overcommit ratio.
ANNOTATION_GPU_MEMORY_RESERVED: Final = "gpuwarden.io/gpu-memory-reserved"
ANNOTATION_OVERCOMMIT_RATIO: Final = "gpuwarden.io/overcommit-ratio"
# MPS active thread percentage (1-100) for the pod's GPU containers.
ANNOTATION_THREAD_PERCENTAGE: Final = "gpuwarden.io/mps-thread-percentage"
# Comma-separated names of the containers the decision applies to.
ANNOTATION_CONTAINERS: Final = "gpuwarden.io/containers"
ANNOTATION_PREEMPTIBLE: Final = "gpuwarden.io/preemptible"
# The profile's idle rule for the node agent: "action=stop,after=7200s,below=5%".
ANNOTATION_IDLE: Final = "gpuwarden.io/idle"
#: Every annotation a decision writes: the node agent and the quota charge trust them.
DECISION_ANNOTATIONS: Final = (
    ANNOTATION_PROFILE,
    ANNOTATION_TENANT,
    ANNOTATION_POLICY,
    ANNOTATION_RULE,
    ANNOTATION_BACKEND,
    ANNOTATION_GPU_COUNT,
    ANNOTATION_GPU_SHARED,
    ANNOTATION_GPU_MEMORY_LIMIT,
    ANNOTATION_GPU_MEMORY_RESERVED,
    ANNOTATION_OVERCOMMIT_RATIO,
    ANNOTATION_THREAD_PERCENTAGE,
    ANNOTATION_CONTAINERS,
    ANNOTATION_PREEMPTIBLE,
    ANNOTATION_IDLE,
)

# CUDA MPS client environment (see NVIDIA's MPS documentation); a client can lower, never raise,
# what the control daemon allows.
ENV_MPS_THREAD_PERCENTAGE: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_PINNED_MEM_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_PIPE_DIRECTORY: Final = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_LOG_DIRECTORY: Final = "CUDA_MPS_LOG_DIRECTORY"

DEFAULT_MPS_PIPE_DIRECTORY: Final = "/run/nvidia/mps"
DEFAULT_MPS_LOG_DIRECTORY: Final = "/var/log/nvidia-mps"
