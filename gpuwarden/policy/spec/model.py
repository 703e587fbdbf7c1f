"""The declarative GPU policy model (``gpuwarden.io/v1alpha1`` ``GPUPolicy``).

These pydantic models are the one source of truth: the loader validates with them, the CRD's
OpenAPI schema and the field table of docs/reference.md are generated from them.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.quantity import QuantityError, parse_non_negative
from gpuwarden.policy.pod.resources import GPU_COUNT_RESOURCES

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class StrictModel(BaseModel):
    """Frozen, camelCase on the wire, and no unknown fields: a typo is an error, not a no-op."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        str_strip_whitespace=True,
    )


def _check_quantity(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("must be a Kubernetes quantity such as 8Gi")
    text = str(value).strip()
    try:
        parse_non_negative(text)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    return text


def _check_dns_label(value: str) -> str:
    if len(value) > 53 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} must be a lowercase DNS label of at most 53 characters "
            "(letters, digits and '-'), since it names Kubernetes objects"
        )
    return value


def _check_label_key(value: str) -> str:
    if len(value) > 317 or not _LABEL_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid Kubernetes label or annotation key")
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_check_quantity),
    Field(
        description="a Kubernetes quantity (8Gi, 500m)",
        json_schema_extra={"x-kubernetes-int-or-string": True},
    ),
]
ProfileName = Annotated[str, AfterValidator(_check_dns_label)]
# A GPU model as Volcano and HAMi match it: a case-insensitive substring of the device type
# they register (checkGPUtype in volcano-sh/volcano pkg/scheduler/api/devices/nvidia/vgpu/
# utils.go); a comma would split it into two.
GpuType = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,62}$")]
LabelKey = Annotated[str, AfterValidator(_check_label_key)]


def quantity_value(quantity: str) -> Decimal:
    """The numeric value of an already-validated quantity field."""
    return parse_non_negative(quantity)


class LabelSelectorRequirement(StrictModel):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class LabelSelector(StrictModel):
    """A Kubernetes label selector: every matchLabels pair and every expression must hold."""

    match_labels: dict[LabelKey, str] = Field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()


class Toleration(StrictModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


# --- Scheduler backends (tagged by `type`) -------------------------------------------------


class _BackendBase(StrictModel):
    foreign_scheduler: Literal["keep", "replace"] = Field(
        default="keep",
        description=(
            "What to do when another controller already set a schedulerName other than "
            "default-scheduler (e.g. for gang scheduling): keep it (and warn) or replace it"
        ),
    )


class VolcanoBackend(_BackendBase):
    """Volcano scheduler with the volcano-vgpu device plugin for shared GPUs."""

    type: Literal["volcano"] = "volcano"
    scheduler_name: str = "volcano"
    queue: str | None = Field(
        default=None, description="Volcano queue for pods whose tenant names none"
    )
    whole_gpus: Literal["device-plugin", "vgpu"] = Field(
        default="device-plugin",
        description=(
            "How exclusive profiles ask for whole GPUs: device-plugin, nvidia.com/gpu from "
            "NVIDIA's device plugin; vgpu, volcano.sh/vgpu-number with vgpu-memory-percentage "
            "and vgpu-cores at 100, for nodes where only the volcano-vgpu device plugin runs"
        ),
    )
    # Project-HAMi/volcano-vgpu-device-plugin advertises deviceSplitCount devices per GPU
    # (pkg/plugin/server.go) from nvidia.deviceSplitCount in its volcano-vgpu-device-config
    # ConfigMap, 10 in the deployments it ships (doc/config.md, deployments/static/
    # volcano-vgpu-device-plugin.yml, the chart's values.yaml).
    device_split_count: int = Field(
        default=10,
        ge=1,
        description="The volcano-vgpu device plugin's nvidia.deviceSplitCount: "
        "volcano.sh/vgpu-number per GPU, as a tenant's quota of shared GPUs counts them",
    )


class HamiBackend(_BackendBase):
    """HAMi scheduler extender and device plugin."""

    type: Literal["hami"] = "hami"
    scheduler_name: str = "hami-scheduler"
    # HAMi's webhook writes GPU_CORE_UTILIZATION_POLICY into GPU containers when its
    # devices.nvidia.gpuCorePolicy is not "default" (MutateAdmission in Project-HAMi/HAMi
    # pkg/device/nvidia/device.go); gpuwarden denies that variable otherwise.
    gpu_core_policy: Literal["default", "force", "disable"] = Field(
        default="default",
        description="HAMi's devices.nvidia.gpuCorePolicy: the GPU_CORE_UTILIZATION_POLICY "
        "value HAMi's webhook writes, the only one gpuwarden admits",
    )
    # HAMi's device plugin advertises deviceSplitCount devices per GPU (Project-HAMi/HAMi
    # pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go) from nvidia.deviceSplitCount
    # in the hami-scheduler-device ConfigMap: chart value devicePlugin.deviceSplitCount, 10
    # (charts/hami/values.yaml, templates/scheduler/device-configmap.yaml).
    device_split_count: int = Field(
        default=10,
        ge=1,
        description="HAMi's devicePlugin.deviceSplitCount: nvidia.com/gpu per GPU, as a "
        "tenant's quota of shared GPUs counts them",
    )


# The device plugin's config-manager sidecar reads the config name from this node label (flag
# --node-label, NVIDIA/k8s-device-plugin cmd/config-manager/main.go); the value must name a config
# of the plugin's ConfigMap, so it is a label value (at most 63 characters).
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
ConfigName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
]


class NvidiaPools(StrictModel):
    """Which nodes may move and how the pools are sized (docs/pools.md)."""

    config_label: LabelKey = Field(
        default=DEVICE_PLUGIN_CONFIG_LABEL,
        description="The node label the device plugin's config-manager reads its config name from",
    )
    whole_config: ConfigName = Field(
        description="The device plugin config (a key of its ConfigMap) that gives whole GPUs"
    )
    shared_config: ConfigName = Field(
        description="The device plugin config that shares each GPU among mpsReplicas through MPS"
    )
    node_selector: dict[LabelKey, str] = Field(
        default_factory=dict,
        description="Labels a node must have to be moved between the pools (its config label "
        "must also name one of the two configs)",
    )
    shared_headroom: int = Field(
        default=0,
        ge=0,
        description="Free shared replicas kept ready beyond those that pods hold and wait for",
    )
    min_shared_nodes: int = Field(
        default=0, ge=0, description="Nodes the shared pool keeps whatever the demand"
    )
    min_whole_nodes: int = Field(
        default=0, ge=0, description="Nodes the whole pool keeps whatever the demand"
    )
    hold_seconds: float = Field(
        default=600,
        ge=0,
        allow_inf_nan=False,
        description="Least time a node stays in a pool after it moved, so that pools do not flap",
    )
    max_draining_nodes: int = Field(
        default=1,
        ge=1,
        description="Shared nodes that still hold GPU pods draining toward the whole pool at "
        "once (empty nodes always move at once)",
    )

    @model_validator(mode="after")
    def _configs_differ(self) -> NvidiaPools:
        if self.whole_config == self.shared_config:
            raise ValueError(
                f"wholeConfig and sharedConfig must name two configs, both are "
                f"{self.whole_config!r}"
            )
        return self


class NvidiaBackend(_BackendBase):
    """Default scheduler with NVIDIA's device plugin sharing GPUs through MPS."""

    type: Literal["nvidia"] = "nvidia"
    scheduler_name: str = Field(
        default="default-scheduler",
        description="The kube-scheduler profile for governed pods (gpuwarden-binpack: the "
        "chart's packing profile); default-scheduler leaves the pod's own",
    )
    shared_resource_name: str = Field(
        default="nvidia.com/gpu",
        description="Resource that shared replicas are advertised as (nvidia.com/gpu.shared "
        "when the device plugin's sharing config sets renameByDefault)",
    )
    # NVIDIA/k8s-device-plugin api/config/v1/config.go sets sharing.mps.failRequestsGreaterThanOne
    # to true when the config leaves it unset, and internal/rm/rm.go ValidateRequest then refuses
    # a container more than one replica.
    fail_requests_greater_than_one: bool = Field(
        default=True,
        description="The device plugin's sharing.mps.failRequestsGreaterThanOne (true unless "
        "its config sets false): a shared container asking for more than one replica is denied; "
        "false gives it the replicas it asks for",
    )
    # NVIDIA/k8s-device-plugin api/config/v1/replicas.go (ReplicatedResource.UnmarshalJSON):
    # sharing.mps.resources[].replicas has no default ("no replicas specified") and must be at
    # least 2; a node advertises replicas x its GPUs of the shared resource.
    mps_replicas: int | None = Field(
        default=None,
        ge=2,
        description="The device plugin's sharing.mps.resources[].replicas: replicas per GPU, "
        "as a tenant's quota of shared GPUs counts them; unset: render warns and assumes 2, "
        "the least the device plugin accepts",
    )
    pools: NvidiaPools | None = Field(
        default=None,
        description="Pools that follow demand: gpuwarden pool-controller moves drained nodes "
        "between the device plugin's whole-GPU and MPS configs (needs mpsReplicas). No "
        "admission decision reads it",
    )

    @model_validator(mode="after")
    def _pools_need_replicas(self) -> NvidiaBackend:
        if self.pools is not None and self.mps_replicas is None:
            raise ValueError(
                "pools needs mpsReplicas: the pool controller sizes the shared pool in "
                "replicas per GPU (the device plugin's sharing.mps.resources[].replicas)"
            )
        return self


class NativeBackend(_BackendBase):
    """Default scheduler, whole GPUs only through nvidia.com/gpu."""

    type: Literal["native"] = "native"
    scheduler_name: str = Field(
        default="default-scheduler",
        description="The kube-scheduler profile for governed pods (gpuwarden-binpack: the "
        "chart's packing profile); default-scheduler leaves the pod's own",
    )


# A DeviceClass name and a ResourceSlice capacity name (a QualifiedName: an optional DNS-subdomain
# prefix and a C identifier, kubernetes pkg/apis/resource/validation, validateQualifiedName;
# DeviceClass names are DNS subdomains).
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DeviceClassName = Annotated[str, StringConstraints(pattern=_DNS_SUBDOMAIN)]
CapacityName = Annotated[
    str,
    StringConstraints(
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"[A-Za-z_][A-Za-z0-9_]{0,63}$"
    ),
]


class DraBackend(_BackendBase):
    """Dynamic Resource Allocation with consumable capacity: a share of one device per shared pod."""

    type: Literal["dra"] = "dra"
    scheduler_name: str = Field(
        default="default-scheduler",
        description="The kube-scheduler profile for governed pods (gpuwarden-binpack: the "
        "chart's packing profile); default-scheduler leaves the pod's own",
    )
    device_class_name: DeviceClassName = Field(
        description="The DeviceClass of shareable GPUs: the deviceClassName of the "
        "ResourceClaimTemplates gpuwarden renders for shared profiles "
        "(ResourceClaim spec.devices.requests[].exactly.deviceClassName). Its driver's "
        "ResourceSlices must publish the devices with allowMultipleAllocations: true"
    )
    memory_capacity: CapacityName = Field(
        default="memory",
        description="The device capacity holding GPU memory (a key of the ResourceSlice "
        "devices' capacity); a shared claim requests maxMemory of it "
        "(spec.devices.requests[].exactly.capacity.requests)",
    )
    cores_capacity: CapacityName | None = Field(
        default=None,
        description="A device capacity of 100 per GPU that a shared claim reserves "
        "threadPercentage of (Volcano's and HAMi's core share); unset: claims reserve no cores",
    )
    whole_resource_name: str = Field(
        default="nvidia.com/gpu",
        description="The extended resource whole-GPU pods ask for, which the DeviceClass maps "
        "to its devices (DeviceClass spec.extendedResourceName); one of the GPU counts "
        "gpuwarden governs (nvidia.com/gpu, nvidia.com/gpu.shared, volcano.sh/vgpu-number, "
        "volcano.sh/gpu-number)",
    )

    shared_node_labels: dict[LabelKey, str] = Field(
        default_factory=dict,
        description="Node labels that shared claims prefer (a preferred node affinity of "
        "weight 100, spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution): "
        "kube-scheduler scores a pod whose GPU is a claim by CPU and memory alone, so without "
        "it shares land on any node and leave none whole for multi-GPU pods. A preference, not "
        "a pool: a share goes elsewhere when those nodes are full. Empty: no preference",
    )

    @field_validator("whole_resource_name")
    @classmethod
    def _a_governed_gpu_count(cls, name: str) -> str:
        # A name gpuwarden does not count as GPUs would leave whole-GPU pods ungoverned on
        # re-admission, and outside the webhooks' scope.
        if name not in GPU_COUNT_RESOURCES:
            raise ValueError(
                f"{name!r} is not a GPU count gpuwarden governs; use one of "
                f"{', '.join(sorted(GPU_COUNT_RESOURCES))} as the DeviceClass's "
                "extendedResourceName"
            )
        return name


BackendName = Literal["volcano", "hami", "nvidia", "native", "dra"]

# What a decision does (docs/rollout.md): enforce, as ever; audit, a pod the policies would deny
# is admitted with warnings, audit annotations and a metric (Kyverno's validationFailureAction
# Audit, Gatekeeper's enforcementAction warn), mutations still applied; dryrun, the same and the
# pod left as it was sent, its patch only reported.
EnforcementAction = Literal["enforce", "audit", "dryrun"]
_ENFORCEMENT_ACTION = (
    "enforce: deny and mutate; audit: admit what would be denied, with warnings, audit "
    "annotations and the gpuwarden_admission_audit_total metric, mutations still applied; "
    "dryrun: audit, and the pod left unchanged, its patch only reported in warnings"
)


def _backend_shorthand(value: Any) -> Any:
    return {"type": value} if isinstance(value, str) else value


Backend = Annotated[
    VolcanoBackend | HamiBackend | NvidiaBackend | NativeBackend | DraBackend,
    BeforeValidator(_backend_shorthand),
    Field(discriminator="type"),
]


# --- Profiles ------------------------------------------------------------------------------


class _ProfileSettings(StrictModel):
    """Settings a tenant may override; every field is optional here."""

    gpu_share: bool | None = Field(
        default=None,
        description="true: a fraction of a shared GPU; false: whole GPUs used exclusively",
    )
    gpus: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="GPUs per container: whole GPUs when exclusive, shared slices when shared; "
        "0 gives the step no GPU",
    )
    max_memory: Quantity | None = Field(
        default=None, description="GPU-memory (VRAM) cap per container, on each GPU it gets"
    )
    overcommit_ratio: float | None = Field(
        default=None,
        ge=1.0,
        le=16.0,
        description="GPU-memory overcommit: the cap stays maxMemory and a tenant's quota admits "
        "caps up to quota x ratio; on volcano and hami the nodes' deviceMemoryScaling (pods "
        "request their cap). Must be 1.0 for exclusive profiles",
    )
    thread_percentage: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="MPS active thread percentage (share of the GPU's SMs) for shared profiles",
    )
    host_memory: Quantity | None = Field(
        default=None, description="Container memory request and limit (host RAM)"
    )
    cpu: Quantity | None = Field(default=None, description="Container CPU request")
    node_selector: dict[LabelKey, str] | None = Field(
        default=None, description="Node labels of the GPU pool"
    )
    tolerations: tuple[Toleration, ...] | None = Field(
        default=None, description="Tolerations for tainted GPU nodes"
    )
    gpu_types: tuple[GpuType, ...] | None = Field(
        default=None,
        description="GPU models the pods may use (A100, H100): a case-insensitive substring "
        "of the device type, as nvidia.com/use-gputype on volcano and hami; on nvidia and "
        "native, select nodes by nvidia.com/gpu.product in nodeSelector instead",
    )


_DURATION_PART = re.compile(r"([0-9]{1,6})(h|m|s)")
_DURATION = re.compile(r"(?:[0-9]{1,6}[hms])+")
_PERCENT = re.compile(r"([0-9]{1,3}(?:\.[0-9]{1,3})?)%")


def parse_duration(value: Any) -> int:
    """Seconds of a duration such as ``2h``, ``90m`` or ``1h30m`` (hours, minutes, seconds)."""
    text = value.strip() if isinstance(value, str) else None
    if not text or _DURATION.fullmatch(text) is None:
        raise ValueError(f"{value!r} must be a duration such as 2h, 90m or 1h30m (h, m, s)")
    factor = {"h": 3600, "m": 60, "s": 1}
    seconds = sum(int(n) * factor[unit] for n, unit in _DURATION_PART.findall(text))
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


def _check_duration(value: Any) -> str:
    parse_duration(value)
    return str(value).strip()


def parse_percent(value: str) -> Decimal:
    """The number of an already-validated percentage such as ``5%``."""
    return Decimal(value.strip().removesuffix("%"))


def _check_percent(value: Any) -> str:
    text = value.strip() if isinstance(value, str) else None
    match = _PERCENT.fullmatch(text) if text else None
    if match is None or not 0 < Decimal(match[1]) <= 100:
        raise ValueError(f"{value!r} must be a percentage above 0% and at most 100%, such as 5%")
    return str(text)


Duration = Annotated[
    str,
    BeforeValidator(_check_duration),
    Field(description="a duration: hours, minutes, seconds (2h, 90m, 1h30m)"),
]
Percent = Annotated[
    str,
    BeforeValidator(_check_percent),
    Field(description="a percentage (5%)"),
]


class IdleRule(StrictModel):
    """When the node agent counts a pod's GPUs idle, and what it does then."""

    after: Duration = Field(
        description="How long the pod's GPUs must stay idle before the agent acts (2h, 90m)"
    )
    below: Percent = Field(
        default="5%",
        description="Idle means the pod's GPU busy time (SM utilization) stays below this share "
        "of the GPUs it is allocated",
    )
    action: Literal["stop", "notify"] = Field(
        default="notify",
        description="stop: stop a Kubeflow Notebook (its kubeflow-resource-stopped annotation; "
        "volumes kept); any other pod is notified instead. notify: an Event on the pod and its "
        "owner, and a metric. Training and serving pods are never stopped",
    )


class ProfileOverride(_ProfileSettings):
    """A tenant's changes to one profile."""


class Profile(_ProfileSettings):
    """A named GPU profile: how much GPU a matched workload gets, and how it is scheduled."""

    name: ProfileName
    gpu_share: bool | None = Field(
        default=True,
        description="true: a fraction of a shared GPU; false: whole GPUs used exclusively",
    )
    gpus: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="GPUs per container: whole GPUs when exclusive, shared slices when shared; "
        "0 gives the step no GPU. Unset: the count the container asks for (1 if it names none)",
    )
    overcommit_ratio: float | None = Field(
        default=1.0,
        ge=1.0,
        le=16.0,
        description="GPU-memory overcommit: the cap stays maxMemory and a tenant's quota admits "
        "caps up to quota x ratio; on volcano and hami the nodes' deviceMemoryScaling (pods "
        "request their cap). Must be 1.0 for exclusive profiles",
    )
    priority: int = Field(
        default=0,
        ge=-2147483648,
        le=1000000000,
        description="PriorityClass value (user classes may not exceed 1000000000)",
    )
    preemptible: bool = Field(
        default=False,
        description="May be preempted; its PriorityClass then never preempts others",
    )
    preemption_policy: Literal["PreemptLowerPriority", "Never"] | None = Field(
        default=None,
        description="Whether its pods may evict lower-priority pods to be placed; unset: Never "
        "when preemptible, else PreemptLowerPriority. Never with a high priority puts pods "
        "first in the scheduling queue without evicting anything",
    )
    priority_class_name: ProfileName | None = Field(
        default=None,
        description="PriorityClass to use instead of the derived gpuwarden-<profile>",
    )
    backend: Backend | None = Field(
        default=None, description="Scheduler backend for this profile instead of the policy's"
    )
    idle: IdleRule | None = Field(
        default=None,
        description="Give back GPUs that sit idle: after how long, below what utilization, and "
        "whether to stop the pod (Kubeflow Notebooks) or notify",
    )

    @field_validator("backend", mode="before")
    @classmethod
    def _backend_shorthand(cls, value: Any) -> Any:
        # The Annotated validator is lost inside `Backend | None`; apply the shorthand here.
        return _backend_shorthand(value)

    @property
    def derived_priority_class(self) -> str:
        return self.priority_class_name or f"gpuwarden-{self.name}"


# --- Workload matchers (tagged by `kind`) --------------------------------------------------


class KfpStepMatch(StrictModel):
    """A Kubeflow Pipelines v2 user-code step (Argo template system-container-impl)."""

    kind: Literal["kfp-step"] = "kfp-step"
    task_names: tuple[str, ...] = Field(
        default=(), description="Pipeline task names or shell-style globs; empty matches any step"
    )


class KfpSystemMatch(StrictModel):
    """A Kubeflow Pipelines v2 driver or importer pod: never user code, never a GPU."""

    kind: Literal["kfp-system"] = "kfp-system"


class TrainingJobMatch(StrictModel):
    """A Training Operator (v1) job replica: PyTorchJob, TFJob, MPIJob, XGBoostJob, ..."""

    kind: Literal["training-job"] = "training-job"
    replica_types: tuple[str, ...] = Field(
        default=(), description="Replica types (master, worker, ...); empty matches all"
    )


class TrainJobMatch(StrictModel):
    """A Kubeflow Trainer v2 TrainJob pod (a JobSet replicated job)."""

    kind: Literal["trainjob"] = "trainjob"
    replicated_jobs: tuple[str, ...] = Field(
        default=("node",), description="JobSet replicated-job names to match"
    )


class KatibTrialMatch(StrictModel):
    """A Katib trial pod."""

    kind: Literal["katib-trial"] = "katib-trial"
    experiments: tuple[str, ...] = Field(
        default=(), description="Experiment names or globs; empty matches all"
    )


class NotebookMatch(StrictModel):
    """A Kubeflow Notebook server pod."""

    kind: Literal["notebook"] = "notebook"


class KservePredictorMatch(StrictModel):
    """A KServe InferenceService predictor pod."""

    kind: Literal["kserve-predictor"] = "kserve-predictor"
    inference_services: tuple[str, ...] = Field(
        default=(), description="InferenceService names or globs; empty matches all"
    )


class SelectorMatch(StrictModel):
    """Generic match on pod labels, pod annotations and namespaces; every given part must hold."""

    kind: Literal["selector"] = "selector"
    labels: LabelSelector | None = None
    annotations: dict[str, str] = Field(default_factory=dict)
    namespaces: tuple[str, ...] = ()
    namespace_selector: LabelSelector | None = None


Matcher = Annotated[
    KfpStepMatch
    | KfpSystemMatch
    | TrainingJobMatch
    | TrainJobMatch
    | KatibTrialMatch
    | NotebookMatch
    | KservePredictorMatch
    | SelectorMatch,
    Field(discriminator="kind"),
]


class WorkloadRule(StrictModel):
    """Maps matching pods to a profile; the narrowest matching rule of a kind wins, else the first."""

    name: ProfileName
    match: Matcher
    profile: ProfileName | None = Field(default=None, description="Profile to apply")
    skip: bool = Field(default=False, description="Leave matching pods untouched")
    containers: tuple[str, ...] = Field(
        default=(),
        description="Containers that get the GPU; default: the workload's main container",
    )
    require_gpu_request: bool = Field(
        default=False,
        description="Match only pods that already ask for a GPU (a CPU-only notebook keeps "
        "no GPU); false gives the profile to every matching pod, as pipeline steps by name",
    )
    max_gpu_request: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Match only pods whose containers each ask for at most this many GPUs (a "
        "1-GPU predictor shares, a 2-GPU one falls through to the next rule); implies "
        "requireGpuRequest",
    )

    @model_validator(mode="after")
    def _profile_or_skip(self) -> WorkloadRule:
        if self.skip and self.profile:
            raise ValueError("a rule either names a profile or sets skip: true, not both")
        if not self.skip and not self.profile:
            raise ValueError("a rule needs a profile (or skip: true)")
        return self


# --- Tenants -------------------------------------------------------------------------------


class Enforcement(StrictModel):
    """Which validating checks apply to a tenant; all are on by default."""

    tenant_limits: bool = True
    environment: bool = Field(
        default=True,
        description="Deny user-set NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES, CUDA_MPS_*",
    )
    host_paths: bool = Field(
        default=True,
        description="Deny hostPath volumes to MPS directories and /dev/nvidia* under any name "
        "the host resolves (/var/run, /proc/PID/root; /proc, /dev/char and /dev/block whole), "
        "and mounts at NVIDIA's device-list path /var/run/nvidia-container-devices",
    )
    privileged: bool = Field(default=True, description="Deny privileged containers")
    host_namespaces: bool = Field(default=True, description="Deny hostIPC and hostPID")
    scheduling: bool = Field(
        default=True,
        description="Deny a schedulerName or GPU-share settings that contradict the policy",
    )
    gpu_memory_quota: bool = True


class TenantLimits(StrictModel):
    allowed_profiles: tuple[ProfileName, ...] | None = Field(
        default=None, description="Profiles the tenant may use; unset allows all"
    )
    max_gpus_per_pod: int | None = Field(default=None, ge=0)
    max_gpu_memory_per_pod: Quantity | None = None
    require_shared: bool = Field(default=False, description="Deny whole-GPU (exclusive) requests")
    gpu_memory_quota: Quantity | None = Field(
        default=None,
        description="GPU memory the tenant's live pods may reserve together; the admitted "
        "total may reach quota x the profile's overcommitRatio",
    )
    allow_resource_claims: bool = Field(
        default=False,
        description="Admit pods with Dynamic Resource Allocation claims (spec.resourceClaims, "
        "resources.claims). gpuwarden cannot see which devices a claim gets, so no profile, "
        "limit or quota applies to them; false: the tenant's GPUs go through device plugins. "
        "The same holds for DRA's extended resources (deviceclass.resource.kubernetes.io/"
        "CLASS), which the scheduler turns into claims; where they are allowed, those "
        "of spec.gpuDeviceClasses count against maxGpusPerPod",
    )
    denied_resources: tuple[str, ...] = Field(
        default=("amd.com/*", "gpu.intel.com/*"),
        description="Resources the tenant's pods may not name: accelerators no profile governs "
        "(AMD's and Intel's GPUs; a DeviceClass's extendedResourceName other than "
        "nvidia.com/gpu). A resource name, or a prefix ending in *. The chart's webhooks are "
        "called for names under nvidia.com/gpu, nvidia.com/mig-, volcano.sh/, amd.com/, "
        "gpu.intel.com/ and deviceclass.resource.kubernetes.io/ (others are checked only on "
        "pods sent for another reason)",
    )
    allowed_runtime_classes: tuple[str, ...] | None = Field(
        default=("nvidia", "nvidia-cdi", "nvidia-legacy"),
        description="RuntimeClasses the tenant's pods may name; null allows any. gpuwarden "
        "cannot see a RuntimeClass's handler, and one of another name may run NVIDIA's runtime, "
        "which exposes GPUs no profile gave; the default is NVIDIA's own classes",
    )
    allow_cdi_annotations: bool = Field(
        default=False,
        description="Admit pods with cdi.k8s.io/* annotations, with which a CDI-aware container "
        "runtime injects the devices they name past every profile, limit and quota",
    )

    @field_validator("denied_resources")
    @classmethod
    def _prefix_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            if not pattern or "*" in pattern[:-1]:
                raise ValueError(
                    f"{pattern!r}: a resource name, or a prefix ending in * (amd.com/*)"
                )
        return patterns


class TenantQuota(StrictModel):
    """The ResourceQuota `gpuwarden render` writes into each namespace the tenant lists by name."""

    gpus: int | None = Field(
        default=None,
        ge=0,
        description="GPUs the namespace may hold at once; charged as requests.<count "
        "resource> of every GPU pool the tenant's profiles use (nvidia.com/gpu, "
        "volcano.sh/vgpu-number, nvidia.com/gpu.shared), a shared pool in slices: GPUs x the "
        "backend's mpsReplicas or deviceSplitCount",
    )
    shared_gpus: int | None = Field(
        default=None,
        ge=0,
        description="How many of gpus the tenant's shared pool serves (MPS replicas, Volcano "
        "vGPU, HAMi slices), the rest going to whole GPUs: the shared quota is sharedGpus x "
        "the slices per GPU, the whole-GPU quota gpus - sharedGpus. Unset: each pool gets all "
        "of gpus",
    )
    hard: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Further ResourceQuota spec.hard entries, copied as given (requests.cpu, "
        "pods, ...); render warns about keys that are accepted but never charged",
    )


class VolcanoQueueSpec(StrictModel):
    """The Volcano Queue (scheduling.volcano.sh/v1beta1) named by the tenant's queue.

    Volcano has no per-queue overcommit field: its overcommit factor is the `overcommit`
    scheduler plugin's `overcommit-factor` argument.
    """

    weight: int = Field(default=1, ge=1, le=65535)
    capability: dict[str, Quantity] = Field(default_factory=dict)
    guarantee: dict[str, Quantity] = Field(
        default_factory=dict, description="Queue spec.guarantee.resource"
    )
    deserved: dict[str, Quantity] = Field(
        default_factory=dict, description="Queue spec.deserved (the capacity plugin)"
    )
    reclaimable: bool = True


class Tenant(StrictModel):
    """One or more namespaces governed together."""

    name: ProfileName
    namespaces: tuple[str, ...] = ()
    namespace_selector: LabelSelector | None = Field(
        default=None,
        description="Kubeflow Profile namespaces carry app.kubernetes.io/part-of: kubeflow-profile",
    )
    overrides: dict[ProfileName, ProfileOverride] = Field(default_factory=dict)
    limits: TenantLimits = Field(default_factory=TenantLimits)
    enforcement: Enforcement = Field(default_factory=Enforcement)
    allow_profile_label: bool = Field(
        default=True, description=f"Honour the pod label {keys.PROFILE_LABEL}"
    )
    queue: str | None = Field(default=None, description="Volcano queue for this tenant's pods")
    job_templates: Literal["mutate", "keep"] = Field(
        default="mutate",
        description="Kubeflow jobs (PyTorchJob...): mutate each replica's pod template to what "
        "its pods will get, or keep the job as written and say it in warnings (GitOps)",
    )
    quota: TenantQuota | None = Field(
        default=None, description="ResourceQuota to render per namespace; unset renders none"
    )
    queue_spec: VolcanoQueueSpec | None = Field(
        default=None, description="The Volcano Queue to render for `queue`; unset renders a default"
    )
    enforcement_action: EnforcementAction | None = Field(
        default=None,
        description=f"{_ENFORCEMENT_ACTION}. Unset: the policy set's spec.enforcementAction",
    )

    @model_validator(mode="after")
    def _has_scope(self) -> Tenant:
        if not self.namespaces and self.namespace_selector is None:
            raise ValueError("a tenant needs namespaces or a namespaceSelector")
        if self.queue_spec is not None and not self.queue:
            raise ValueError("queueSpec needs queue: the name of the Volcano queue")
        quota = self.quota
        if quota is not None and quota.shared_gpus is not None:
            shared, gpus = quota.shared_gpus, quota.gpus
            if gpus is None:
                raise ValueError(
                    f"tenant {self.name}: quota.sharedGpus needs quota.gpus, the GPUs it is a "
                    "part of"
                )
            if shared > gpus:
                raise ValueError(
                    f"tenant {self.name}: quota.sharedGpus {shared} is more than quota.gpus "
                    f"{gpus}; it is the part of quota.gpus the shared pool serves"
                )
        return self


class MpsSettings(StrictModel):
    pipe_directory: str = keys.DEFAULT_MPS_PIPE_DIRECTORY
    log_directory: str = keys.DEFAULT_MPS_LOG_DIRECTORY


class PolicySpec(StrictModel):
    backend: Backend = Field(
        default_factory=VolcanoBackend, description="Default scheduler backend"
    )
    profiles: tuple[Profile, ...] = ()
    workloads: tuple[WorkloadRule, ...] = ()
    tenants: tuple[Tenant, ...] = ()
    default_profile: ProfileName | None = Field(
        default=None,
        description="Profile for pods that request a GPU but match no rule",
    )
    mps: MpsSettings = Field(default_factory=MpsSettings)
    # NVIDIA/k8s-dra-driver-gpu deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-
    # {gpu,mig,vfio-gpu}.yaml (its compute-domain classes hand out IMEX channels, not GPUs);
    # gpu.nvidia.com also sets extendedResourceName: nvidia.com/gpu, which profiles govern.
    gpu_device_classes: tuple[str, ...] = Field(
        default=("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"),
        description="DRA DeviceClasses whose devices are GPUs (NVIDIA's DRA driver registers "
        "these): a pod's deviceclass.resource.kubernetes.io/CLASS asks for that many GPUs, "
        "which the denial names and, for tenants with allowResourceClaims, maxGpusPerPod and "
        "the rendered ResourceQuota count",
    )
    enforcement_action: EnforcementAction | None = Field(
        default=None,
        description=f"{_ENFORCEMENT_ACTION}. For every tenant that sets none, and pods of no "
        "tenant; the first policy in load order that sets it holds for the set. Unset: the "
        "webhook's --enforcement-action (the chart's webhook.enforcementAction), else enforce",
    )


class ObjectMeta(StrictModel):
    """The part of ObjectMeta a policy uses; server-set fields (uid, resourceVersion) are dropped."""

    model_config = ConfigDict(extra="ignore")

    name: ProfileName
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class GPUPolicy(BaseModel):
    """A GPUPolicy document. Unknown metadata fields are ignored as Kubernetes does."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    api_version: Literal["gpuwarden.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GPUPolicy"]
    metadata: ObjectMeta
    spec: PolicySpec
