"""Checks that keep a pod inside its GPUs: the environment (env and envFrom), NVIDIA's runtime
class, host paths, privilege and the node's namespaces. They run in every namespace the webhook
sees, tenant or not."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Mapping
from typing import Any

from gpuwarden.policy.admission.checks.base import (
    CREATE,
    DEBUG,
    Check,
    CheckContext,
    Violation,
    container_path,
    request_kind,
)
from gpuwarden.policy.admission.decision import ClusterView
from gpuwarden.policy.admission.mutate import is_own_claim_entry, own_claim, plan
from gpuwarden.policy.admission.placement import Placement
from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.environment import (
    FORBIDDEN_ENV,
    NOTHING,
    Formed,
    SourceKeys,
    escape_effect,
    prefix_reaches,
    reached_name,
)
from gpuwarden.policy.pod.resources import (
    ContainerRef,
)
from gpuwarden.policy.pod.view import names_gpuwarden_claim
from gpuwarden.policy.spec.backends import DRA_CLAIM_NAME, DRA_TEMPLATE_PREFIX
from gpuwarden.policy.spec.model import HamiBackend
from gpuwarden.policy.spec.policyset import PolicySet


def _owned_env(placement: Placement) -> Mapping[str, str]:
    backend_plan = plan(placement) if placement.governed else None
    return backend_plan.env if backend_plan is not None else {}


def _written_by_hamis_webhook(
    name: str, entry: Mapping[str, Any], ref: ContainerRef, placement: Placement
) -> bool:
    """The two limiter variables HAMi's own webhook writes (it runs before any validating
    webhook): CUDA_TASK_PRIORITY from the container's nvidia.com/priority limit, and
    GPU_CORE_UTILIZATION_POLICY from HAMi's gpuCorePolicy (MutateAdmission in Project-HAMi/HAMi
    pkg/device/nvidia/device.go). Only those exact values pass."""
    value = entry.get("value")
    if "valueFrom" in entry or not isinstance(value, str):
        return False
    if name == "CUDA_TASK_PRIORITY":
        priority = ref.resources("limits").get("nvidia.com/priority")
        return priority is not None and str(priority) == value
    if name == "GPU_CORE_UTILIZATION_POLICY":
        profile = placement.profile
        backend = profile.backend if profile is not None else None
        if value == "force":  # stricter than the default: never an escape
            return True
        return isinstance(backend, HamiBackend) and backend.gpu_core_policy == value != "default"
    return False


def _environment(context: CheckContext) -> Iterator[Violation]:
    """Variables that steer NVIDIA's toolkit or HAMi-core's limiter, and envFrom sources that
    could set them (on kubectl debug, in the new ephemeral containers only)."""
    placement, cluster = context.placement, context.cluster
    fields = ("ephemeralContainers",) if request_kind(context.request) == DEBUG else ()
    owned = _owned_env(placement)
    targets = set(placement.containers)
    sources = _EnvSourceReader(cluster, context.request.namespace)
    for ref in context.view.containers(*fields):
        mine = owned if ref.field == "containers" and ref.name in targets else {}
        gpus = context.view.gpus(ref).devices
        for entry in ref.env():
            name = str(entry.get("name", ""))
            if FORBIDDEN_ENV.match(name):
                if name in mine and entry.get("value") == mine[name] and "valueFrom" not in entry:
                    continue
                if _written_by_hamis_webhook(name, entry, ref, placement):
                    continue
                yield Violation(
                    "environment",
                    "GPUIsolationEscape",
                    f"{container_path(ref)}.env[{name}]: setting {name} {escape_effect(name)}; "
                    "remove it (gpuwarden and the device plugin set what is needed)",
                )
            elif name == "CUDA_VISIBLE_DEVICES":
                problem = _visible_devices_problem(str(entry.get("value", "")), gpus)
                if problem:
                    yield Violation(
                        "environment",
                        "GPUIsolationEscape",
                        f"{container_path(ref)}.env[CUDA_VISIBLE_DEVICES]: {problem}; remove it",
                    )
        yield from _env_from_violations(ref, sources)


def _visible_devices_problem(value: str, gpus: int) -> str | None:
    devices = [d for d in value.replace(" ", "").split(",") if d]
    if value.strip().lower() in ("all", ""):
        return "it asks for every GPU on the node" if value.strip() else None
    if gpus == 0:
        return "the container requests no GPU, so it must not select GPUs"
    if len(devices) > gpus:
        return f"it lists {len(devices)} devices but the container was given {gpus}"
    return None


def _env_sources(ref: ContainerRef) -> Iterator[tuple[str, str, str]]:
    """(kind, name, prefix) of each ConfigMap and Secret the container's envFrom names."""
    sources = ref.body.get("envFrom")
    for source in sources if isinstance(sources, list) else []:
        if not isinstance(source, dict):
            continue
        prefix = str(source.get("prefix") or "")
        for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            target = source.get(field)
            if isinstance(target, dict) and target.get("name"):
                yield kind, str(target["name"]), prefix


class _EnvSourceReader:
    """The envFrom sources of one decision, each read once: a source's keys as SourceKeys (the
    webhook's cache keeps them so; a file's or a test's plain key names are indexed here, once),
    and what each (source, prefix) forms. A pod naming a source of many keys in hundreds of
    entries costs one lookup per entry (issue 29)."""

    def __init__(self, cluster: ClusterView, namespace: str) -> None:
        self._cluster = cluster
        self._namespace = namespace
        self._keys: dict[tuple[str, str], SourceKeys | None] = {}
        self._formed: dict[tuple[str, str, str], tuple[Formed, bool]] = {}

    def keys(self, kind: str, name: str) -> SourceKeys | None:
        """The source's keys, None when gpuwarden does not know them."""
        if (kind, name) not in self._keys:
            known = self._cluster.env_source_keys.get((kind, self._namespace, name))
            if known is not None and not isinstance(known, SourceKeys):
                known = SourceKeys.of(known)
            self._keys[(kind, name)] = known
        return self._keys[(kind, name)]

    def formed(self, kind: str, name: str, prefix: str) -> tuple[Formed, bool]:
        """The keys ``prefix`` turns into denied variables, and whether it could at all."""
        found = self._formed.get((kind, name, prefix))
        if found is None:
            keys = self.keys(kind, name)
            formed = keys.formed(prefix) if keys is not None else NOTHING
            found = self._formed[(kind, name, prefix)] = (formed, prefix_reaches(prefix))
        return found


def _env_from_violations(ref: ContainerRef, sources: _EnvSourceReader) -> Iterator[Violation]:
    """envFrom makes a source's keys into variables at every container start, so a source is
    judged by what it could hold, not only by what it holds now:

    * a known ConfigMap's keys that make denied variables are denied by name (the first few of
      each entry, then how many more);
    * a prefix that some key would turn into a denied variable (NVIDIA_, CUDA_MPS_, C) is denied
      whatever the source holds now: gpuwarden judges a ConfigMap's own keys when it changes,
      without the prefix of each pod that reads it;
    * without such a prefix, a source whose keys gpuwarden cannot read is denied: Secrets (the
      webhook never reads them) and ConfigMaps it does not know (not created yet). A prefix that
      reaches no denied variable (APP_) makes any source safe, whatever its keys.

    An entry that repeats an earlier one of the container (same source, same prefix) is judged
    once.
    """
    seen: set[tuple[str, str, str]] = set()
    for kind, name, prefix in _env_sources(ref):
        if (kind, name, prefix) in seen:
            continue
        seen.add((kind, name, prefix))
        where = f"{container_path(ref)}.envFrom[{name}]"
        formed, reaches = sources.formed(kind, name, prefix)
        for key in formed.first:
            yield Violation(
                "environment",
                "GPUIsolationEscape",
                f"{where}: {kind} key {key} sets {prefix + key}, which "
                f"{escape_effect(prefix + key)}; remove that key",
            )
        if formed.count > len(formed.first):
            yield Violation(
                "environment",
                "GPUIsolationEscape",
                f"{where}: {formed.count - len(formed.first)} more {kind} keys set denied "
                f"variables{f' with prefix {prefix}' if prefix else ''}; remove them",
            )
        if formed.count or not reaches:
            continue
        known = sources.keys(kind, name)
        if prefix:
            variable = reached_name(prefix)
            yield Violation(
                "environment",
                "GPUIsolationEscape",
                f"{where}: prefix {prefix} makes {kind} keys into {prefix}* variables: a key "
                f"{variable[len(prefix) :]}, now or added later, would set {variable}, which "
                f"{escape_effect(variable)}; use another prefix (APP_, say)",
            )
        elif known is None and kind == "Secret":
            yield Violation(
                "environment",
                "GPUIsolationEscape",
                f"{where}: gpuwarden does not read Secrets, so a key NVIDIA_VISIBLE_DEVICES or "
                "CUDA_MPS_* in it would escape GPU isolation unchecked; set a prefix (APP_, say) "
                "or name each key under env with valueFrom.secretKeyRef",
            )
        elif known is None:
            yield Violation(
                "environment",
                "GPUIsolationEscape",
                f"{where}: gpuwarden does not know ConfigMap {name} yet, so it cannot check its "
                "keys for NVIDIA_VISIBLE_DEVICES or CUDA_MPS_*; create the ConfigMap before the "
                "pod, or set a prefix (APP_, say)",
            )


def _runtime_class(context: CheckContext) -> Iterator[Violation]:
    """NVIDIA's runtime on a pod without GPUs: CUDA images set NVIDIA_VISIBLE_DEVICES=all in
    their own environment, which the runtime then honours. The RuntimeClasses are the GPU
    Operator's nvidia and the toolkit's per-mode nvidia-cdi and nvidia-legacy (modeRuntime in
    NVIDIA/nvidia-container-toolkit cmd/nvidia-ctk-installer/container/operator/operator.go)."""
    name = context.view.spec.get("runtimeClassName")
    if not isinstance(name, str) or not (name == "nvidia" or name.startswith("nvidia-")):
        return
    if context.view.asks_for_gpu:
        return
    yield Violation(
        "environment",
        "GPUIsolationEscape",
        f"spec.runtimeClassName {name}: the pod asks for no GPU, and under NVIDIA's runtime a "
        "CUDA image's own NVIDIA_VISIBLE_DEVICES=all exposes every GPU on the node; remove "
        "runtimeClassName, or ask for a GPU in resources.limits",
    )


#: Where NVIDIA's container toolkit reads the GPUs to expose when the device plugin uses its
#: volume-mounts device list strategy: a mount there selects devices.
DEVICE_LIST_DIRECTORY = "/var/run/nvidia-container-devices"


# A process's directory under /proc: a PID, or self and thread-self (the kubelet's own: it resolves
# hostPath volumes), or one of its threads (task/<tid>). Its root is that process's /, which for a
# host process is the host's / (proc(5), /proc/pid/root).
_PROC_PROCESS = re.compile(r"^/proc/(\d+|self|thread-self)(/task/\d+)?(?=/|$)")
_PROCESS = re.compile(r"\d+|self|thread-self")


def _host_path(raw: str) -> str:
    """A host path as the host resolves it: normalised, /proc/<pid>/root/X as /X (the host's X),
    and /var/run as /run (a symlink on every systemd host)."""
    if "proc" in raw:
        path = _through_proc(raw)
    else:
        path = posixpath.normpath("/" + raw.lstrip("/")) if raw else "/"
    if path == "/var/run" or path.startswith("/var/run/"):
        path = "/run" + path[len("/var/run") :]
    return path


def _through_proc(raw: str) -> str:
    """The path, walked a name at a time as the kernel walks it: a process's root starts again
    at the host's /, where .. stays (normpath would read /proc/1/root/../../dev as /proc/dev)."""
    parts: list[str] = []
    for part in raw.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        if part == "root" and _is_process_directory(parts):
            parts = []
            continue
        parts.append(part)
    return "/" + "/".join(parts)


def _is_process_directory(parts: list[str]) -> bool:
    """Whether the names are /proc/<pid> or /proc/<pid>/task/<tid>."""
    if len(parts) not in (2, 4) or parts[0] != "proc" or not _PROCESS.fullmatch(parts[1]):
        return False
    return len(parts) == 2 or (parts[2] == "task" and parts[3].isdigit())


_DEVICE_LIST_PATH = _host_path(DEVICE_LIST_DIRECTORY)


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


def _host_aliases(path: str) -> list[str]:
    """What a resolved host path reaches by another name than the directories themselves."""
    if path == "/proc" or (_PROC_PROCESS.match(path) is not None):
        # /proc holds every process's root, cwd and open files; their targets are host paths
        # gpuwarden cannot resolve (a /proc/<pid>/root/X is resolved above).
        return ["every host path (through /proc/<pid>/root, cwd and fd)"]
    if any(_under(path, d) for d in ("/dev/char", "/dev/block")):
        # Device nodes by major:minor: 195 is NVIDIA's (/dev/nvidia0 is 195:0, nvidiactl 195:255);
        # nvidia-uvm's and nvidia-caps' majors are given out at load, so the whole directory goes.
        return ["/dev/nvidia* (by major:minor)"]
    if path.startswith("/dev/nvidia") or path in ("/", "/dev"):
        return ["/dev/nvidia*"]
    return []


def _protected_paths(policies: PolicySet) -> tuple[str, ...]:
    """The host directories of every policy's MPS daemons (their pipes and logs)."""
    return tuple(
        _host_path(directory)
        for policy in policies.policies
        for directory in (policy.spec.mps.pipe_directory, policy.spec.mps.log_directory)
    )


def _device_list_mounts(context: CheckContext) -> Iterator[Violation]:
    device_list = _DEVICE_LIST_PATH
    for ref in context.view.all_containers:
        for index, mount in enumerate(ref.body.get("volumeMounts") or []):
            if not isinstance(mount, Mapping):
                continue
            target = _host_path(str(mount.get("mountPath", "")))
            if target == device_list or target.startswith(device_list + "/"):
                yield Violation(
                    "host_paths",
                    "GPUIsolationEscape",
                    f"{container_path(ref)}.volumeMounts[{index}].mountPath {mount.get('mountPath')}: "
                    "mounts there select GPUs for NVIDIA's container toolkit (volume-mounts "
                    "device list); remove this mount",
                )


def _host_path_volumes(context: CheckContext) -> Iterator[Violation]:
    volumes = context.view.spec.get("volumes")
    if not isinstance(volumes, list):
        return
    protected = _protected_paths(context.policies)
    for volume in volumes:
        if not isinstance(volume, dict) or not isinstance(volume.get("hostPath"), Mapping):
            continue
        raw = str(volume["hostPath"].get("path", ""))
        path = _host_path(raw)
        name = str(volume.get("name", "?"))
        # The path itself, a parent (it holds the directory) or a child (the device plugin keeps
        # each daemon's pipes in <root>/<resource>/pipe) all reach the daemons.
        reached = [
            p
            for p in protected
            if path == p or p.startswith(path.rstrip("/") + "/") or path.startswith(p + "/")
        ]
        reached += _host_aliases(path)
        if reached:
            yield Violation(
                "host_paths",
                "GPUIsolationEscape",
                f"spec.volumes[{name}].hostPath {raw}: reaches {', '.join(reached)} "
                "(other tenants' MPS daemons or GPU devices); remove this volume",
            )


# Added capabilities that reach every GPU like privileged does; names as the runtimes read them
# (containerd and CRI-O upper-case a name and add CAP_ where it is missing; ALL adds every one).
_ESCAPING_CAPABILITIES = {
    "SYS_ADMIN": "SYS_ADMIN, like privileged, can reach every GPU on the node (it mounts "
    "filesystems and changes device access)",
    "ALL": "ALL adds every capability, SYS_ADMIN included, so the container can reach every GPU "
    "on the node",
}


def _capability_violations(ref: ContainerRef, context: Mapping[str, Any]) -> Iterator[Violation]:
    capabilities = context.get("capabilities")
    added = capabilities.get("add") if isinstance(capabilities, dict) else None
    for raw in added if isinstance(added, list) else []:
        name = str(raw).strip().upper()
        why = _ESCAPING_CAPABILITIES.get(name[4:] if name.startswith("CAP_") else name)
        if why is not None:
            yield Violation(
                "privileged",
                "GPUIsolationEscape",
                f"{container_path(ref)}.securityContext.capabilities.add[{raw}]: {why}; remove it",
            )


def _privilege(context: CheckContext) -> Iterator[Violation]:
    for ref in context.view.all_containers:
        security = ref.body.get("securityContext")
        if not isinstance(security, dict):
            continue
        if security.get("privileged") is True:
            yield Violation(
                "privileged",
                "GPUIsolationEscape",
                f"{container_path(ref)}.securityContext.privileged: privileged containers see every GPU "
                "on the node; remove privileged: true",
            )
        yield from _capability_violations(ref, security)


def _host_namespaces(context: CheckContext) -> Iterator[Violation]:
    spec = context.view.spec
    for field in ("hostIPC", "hostPID"):
        if spec.get(field) is True:
            yield Violation(
                "host_namespaces",
                "GPUIsolationEscape",
                f"spec.{field}: sharing the node's {field[4:]} namespace reaches other tenants' "
                f"GPU processes; remove {field}: true",
            )


def config_map_violations(config_map: Mapping[str, Any]) -> list[Violation]:
    """A ConfigMap's keys that a pod's envFrom (without a prefix) would make into variables the
    environment check denies."""
    data = config_map.get("data")
    return [
        Violation(
            "environment",
            "GPUIsolationEscape",
            f"data[{key}]: a pod's envFrom would set {key}, which {escape_effect(key)}; rename "
            "or remove the key",
        )
        for key in sorted(str(k) for k in (data if isinstance(data, Mapping) else {}))
        if FORBIDDEN_ENV.match(key)
    ]


ENVIRONMENT = Check("environment", "environment", frozenset({CREATE, DEBUG}), _environment)
RUNTIME_CLASS = Check("runtime class", "environment", frozenset({CREATE}), _runtime_class)
DEVICE_LIST_MOUNT = Check(
    "device list mounts", "host_paths", frozenset({CREATE, DEBUG}), _device_list_mounts
)
HOST_PATH_VOLUMES = Check(
    "host path volumes", "host_paths", frozenset({CREATE}), _host_path_volumes
)


def _claim_entry_problem(entry: Mapping[str, Any], own: str | None, who: str) -> str | None:
    """Why a pod-level claim entry passes for gpuwarden's when it is not this pod's; None when
    it is not gpuwarden's (gpuwarden-gpu, or a gpuwarden-* template) or is this pod's own."""
    name, template = entry.get("name"), entry.get("resourceClaimTemplateName")
    ours = isinstance(template, str) and template.startswith(DRA_TEMPLATE_PREFIX)
    if (name != DRA_CLAIM_NAME and not ours) or is_own_claim_entry(entry, own):
        return None
    field = f"spec.resourceClaims[{name}]"
    if own is None:
        what = f"template {template}" if ours else f"claim {DRA_CLAIM_NAME}"
        return (
            f"{field}: {what} is gpuwarden's, for pods of a shared profile on the dra backend, "
            f"and {who} takes no claim; remove the entry and its resources.claims, and ask for "
            f"the GPU in resources or choose a profile with the label {keys.PROFILE_LABEL}"
        )
    return (
        f"{field}: only gpuwarden sets {DRA_CLAIM_NAME} and gpuwarden-* templates, and {who} "
        f"takes claim {DRA_CLAIM_NAME} from template {own}; remove the entry and let gpuwarden "
        "set it"
    )


def _uses_gpuwarden_claim(ref: ContainerRef) -> bool:
    """Whether a container's resources.claims names gpuwarden's claim."""
    resources = ref.body.get("resources")
    return isinstance(resources, dict) and names_gpuwarden_claim(resources.get("claims"))


def _gpuwarden_claims(context: CheckContext) -> Iterator[Violation]:
    """A claim that passes for gpuwarden's: the name gpuwarden-gpu or a gpuwarden-* template on
    a pod gpuwarden gives no such claim, or another profile's template. Those templates hold a
    profile's share of a device, so a pod naming one would get another profile's GPU share."""
    placement, view = context.placement, context.view
    entries = view.spec.get("resourceClaims")
    entries = entries if isinstance(entries, list) else []
    holders = [ref for ref in view.all_containers if _uses_gpuwarden_claim(ref)]
    if not entries and not holders:
        return  # the common pod: nothing that could pass for gpuwarden's claim
    own = own_claim(placement)
    profile = placement.profile
    who = f"profile {profile.name} ({placement.origin})" if profile else "a pod of no profile"
    for entry in entries:
        if isinstance(entry, dict):
            problem = _claim_entry_problem(entry, own, who)
            if problem is not None:
                yield Violation("annotations", "ForgedClaim", problem)
    targets = set(placement.containers) if own is not None else set()
    for ref in holders:
        if not (ref.field == "containers" and ref.name in targets):
            yield Violation(
                "annotations",
                "ForgedClaim",
                f"{container_path(ref)}.resources.claims[{DRA_CLAIM_NAME}]: gpuwarden gives "
                f"that claim's GPU share only to the containers {who} gives GPUs to; remove it",
            )


GPUWARDEN_CLAIMS = Check("gpuwarden claims", "annotations", frozenset({CREATE}), _gpuwarden_claims)
PRIVILEGE = Check("privilege", "privileged", frozenset({CREATE, DEBUG}), _privilege)
HOST_NAMESPACES = Check("host namespaces", "host_namespaces", frozenset({CREATE}), _host_namespaces)
