"""Which pods the webhooks must see: the CEL ``matchConditions`` derived from a policy set.

The API server calls gpuwarden only for pods the policies can change or must check; every other
pod in a governed namespace is admitted without a call, so it is neither slowed down nor refused
while gpuwarden is unreachable. The condition is a superset, never a subset, of what the policy
core acts on:

* what gpuwarden checks in every pod (GPU resources, other accelerators' and DRA's device
  classes, DRA claims, NVIDIA and CUDA variables and ``envFrom``, hostPath volumes and mounts
  under NVIDIA's paths, privileged containers and added capabilities, host namespaces, a runtime
  class, ``gpuwarden.io/*`` labels and annotations, CDI's ``cdi.k8s.io/*`` annotations);
* what the policies decide from a workload's labels alone: a rule that may give GPUs to a pod
  that asks for none brings in the labels and annotations that identify its kind.

On UPDATE (the validating webhook) only the updates gpuwarden checks are sent: subresources
(ephemeral containers, resize) and pods that carry, or carried, its annotations or the backend
annotations it writes.

The API server's work on a condition stays small and linear in the object, whatever a tenant
sends (issue 29 item 6). Each CEL comprehension (``exists``, ``map``) makes the API server's cost
tracker (cel-go interpreter/runtimecost.go) push values that it never pops and search that stack
for every attribute it reads, so iterating ``n`` elements costs it ``n`` squared: a dry run of a
ConfigMap of 40,000 keys took seconds, and a large enough object runs out of the conditions' cost
budget, an error that fails the request. So the conditions iterate only bounded collections: an
object with more than :data:`MAX_CONTAINERS` containers, :data:`MAX_CONTAINER_ITEMS` env
variables, mounts and resource names in them, or :data:`MAX_ITEMS` volumes, labels or
annotations (:data:`MAX_CONFIG_MAP_KEYS` keys for a ConfigMap) is sent without being looked into,
which only a size test costs (gpuwarden then decides it in linear time). Keys the policies name are
tested with ``in``, never by iterating.

:func:`review_scope` gives the same condition twice: as CEL for the API server and as a Python
predicate, so tests can hold the predicate to the policy core and the e2e suite the CEL to the
predicate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.policy.pod import jobs, keys
from gpuwarden.policy.pod.resources import (
    ACCELERATOR_PREFIXES,
    CDI_ANNOTATION_PREFIX,
    CONTAINER_FIELDS,
    annotations_of,
    labels_of,
    metadata_of,
    spec_of,
)
from gpuwarden.policy.pod.workloads import (
    JOBSET_REPLICATED_JOB,
    K8S_PART_OF,
    KATIB_TRIAL,
    KFP_RUNTIME_ROLE,
    KFP_V2_COMPONENT,
    KSERVE_ISVC,
    NOTEBOOK_NAME,
    TRAINING_JOB_NAME,
    WORKSPACE_NAME,
)
from gpuwarden.policy.spec.backends import BACKEND_ANNOTATIONS
from gpuwarden.policy.spec.model import (
    LabelSelector,
    SelectorMatch,
    WorkloadRule,
)
from gpuwarden.policy.spec.policyset import PolicySet

# Resource names that may reach an accelerator, by prefix: NVIDIA's (resources.is_gpu_resource's),
# DRA's deviceclass.resource.kubernetes.io/ and other vendors' GPUs.
GPU_RESOURCE_PREFIXES = ACCELERATOR_PREFIXES
# Variables the isolation checks read: NVIDIA's container toolkit, CUDA/MPS, HAMi-core.
ENV_PREFIXES = ("NVIDIA_", "CUDA_")
ENV_NAMES = ("GPU_CORE_UTILIZATION_POLICY",)
# Mount paths under which NVIDIA's device lists and MPS pipes live.
MOUNT_MARKER = "nvidia"
OWN_PREFIX = keys.PROFILE_LABEL.split("/", 1)[0] + "/"  # gpuwarden.io/
# Annotation prefixes the checks read on a new pod: gpuwarden's own, and CDI device requests.
ANNOTATION_PREFIXES = (OWN_PREFIX, CDI_ANNOTATION_PREFIX)
# Annotations protected on UPDATE besides gpuwarden's own: those its backends write.
PROTECTED_ANNOTATIONS = BACKEND_ANNOTATIONS

#: The most containers (of every kind together), of env variables, volume mounts and resource
#: names in them (all together), and of volumes, labels or annotations, that the conditions look
#: into; a pod with more is sent. Together they bound what one evaluation iterates (about 900
#: elements), so the API server's quadratic comprehension cost stays a few milliseconds.
MAX_CONTAINERS = 16
MAX_CONTAINER_ITEMS = 512
MAX_ITEMS = 128
#: The most replica types of a Training Operator job the job condition looks into (the kinds
#: have at most four); a job with more is sent, as are templates past the bounds above.
MAX_REPLICA_TYPES = 8
#: The most keys of a ConfigMap the ConfigMap condition looks into; a larger one is sent.
MAX_CONFIG_MAP_KEYS = 1024

# What identifies each Kubeflow kind on a pod (gpuwarden.policy.pod.workloads.identify reads these
# first): label keys, then annotation keys.
KIND_EVIDENCE: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "kfp-step": ((KFP_V2_COMPONENT,), (KFP_V2_COMPONENT, KFP_RUNTIME_ROLE)),
    "kfp-system": ((KFP_V2_COMPONENT,), (KFP_V2_COMPONENT, KFP_RUNTIME_ROLE)),
    "training-job": ((TRAINING_JOB_NAME,), ()),
    "trainjob": ((JOBSET_REPLICATED_JOB,), ()),
    "katib-trial": ((KATIB_TRIAL,), ()),
    "notebook": ((NOTEBOOK_NAME, WORKSPACE_NAME), ()),
    "kserve-predictor": ((KSERVE_ISVC, K8S_PART_OF), ()),
}


@dataclass(frozen=True)
class ReviewScope:
    """The pods the webhooks must see, beyond what every policy set needs."""

    label_keys: tuple[str, ...] = ()  # sorted; a pod with any of them is sent
    annotation_keys: tuple[str, ...] = ()  # sorted
    every_pod: bool = False  # a rule may match any pod (a selector gpuwarden cannot narrow)

    def needs_review(
        self,
        pod: Mapping[str, Any],
        *,
        operation: str = "CREATE",
        sub_resource: str = "",
        old_pod: Mapping[str, Any] | None = None,
    ) -> bool:
        """The Python twin of :meth:`cel`: whether the API server calls gpuwarden."""
        if operation == "UPDATE":
            return bool(sub_resource) or _protected(pod) or _protected(old_pod or {})
        if self.every_pod:
            return True
        labels, annotations = labels_of(pod), annotations_of(pod)
        if any(key in labels for key in self.label_keys):
            return True
        if any(key in annotations for key in self.annotation_keys):
            return True
        return not _bounded(pod) or _checked_everywhere(pod)

    def cel(self) -> str:
        """One CEL expression for a webhook's ``matchConditions``."""
        create = (
            "true"
            if self.every_pod
            else " || ".join(
                [
                    *(
                        f'(has(object.metadata.labels) && "{k}" in object.metadata.labels)'
                        for k in self.label_keys
                    ),
                    *(
                        f'(has(object.metadata.annotations) && "{k}" in object.metadata.annotations)'
                        for k in self.annotation_keys
                    ),
                    _POD_CEL,
                ]
            )
        )
        return f'request.operation == "UPDATE" ? ({_UPDATE_CEL}) : ({create})'

    def match_conditions(self) -> list[dict[str, str]]:
        """The webhooks' matchConditions (ANDed by the API server)."""
        return [
            {
                "name": "pods-only",
                "expression": 'request.kind.group == "" && request.kind.kind == "Pod"',
            },
            {"name": "gpuwarden-may-act", "expression": self.cel()},
        ]


def review_scope(policies: PolicySet) -> ReviewScope:
    """The scope of a policy set: rules that may give GPUs to pods that ask for none widen it."""
    labels: set[str] = set()
    annotations: set[str] = set()
    every_pod = False
    for rule, _ in policies.rules:
        if not _may_give_unasked_gpus(rule):
            continue
        match = rule.match
        if isinstance(match, SelectorMatch):
            narrowed = _selector_keys(match.labels)
            if narrowed is None and not match.annotations:
                every_pod = True
                continue
            labels.update(narrowed or ())
            annotations.update(match.annotations)
            continue
        kind_labels, kind_annotations = KIND_EVIDENCE[match.kind]
        labels.update(kind_labels)
        annotations.update(kind_annotations)
    return ReviewScope(tuple(sorted(labels)), tuple(sorted(annotations)), every_pod)


def _may_give_unasked_gpus(rule: WorkloadRule) -> bool:
    """Whether a rule could act on a pod that names no GPU resource (its profile is not read:
    a tenant override may give GPUs where the profile gives none)."""
    return not rule.skip and not rule.require_gpu_request and rule.max_gpu_request is None


def _selector_keys(selector: LabelSelector | None) -> tuple[str, ...] | None:
    """Label keys of which a matching pod has at least one; None when a pod with none of them
    can match (no selector, or only NotIn / DoesNotExist expressions)."""
    if selector is None:
        return None
    wanted = [*selector.match_labels]
    wanted += [r.key for r in selector.match_expressions if r.operator in ("In", "Exists")]
    return tuple(wanted) or None


# --- how much the conditions may iterate ----------------------------------------------------


def _size_cel(path: str) -> str:
    return f"(has({path}) ? size({path}) : 0)"


_CONTAINER_ITEMS_CEL = " + ".join(
    [
        _size_cel("c.env"),
        _size_cel("c.volumeMounts"),
        f"(has(c.resources) ? {_size_cel('c.resources.limits')} + "
        f"{_size_cel('c.resources.requests')} : 0)",
    ]
)
#: Whether the pod is small enough for the conditions to look into: the container count first
#: (size() alone), so that counting the items in them iterates at most MAX_CONTAINERS.
_BOUNDED_CEL = " && ".join(
    [
        f"{' + '.join(_size_cel(f'object.spec.{f}') for f in CONTAINER_FIELDS)} <= {MAX_CONTAINERS}",
        " + ".join(
            f"(has(object.spec.{f}) ? object.spec.{f}.map(c, {_CONTAINER_ITEMS_CEL}).sum() : 0)"
            for f in CONTAINER_FIELDS
        )
        + f" <= {MAX_CONTAINER_ITEMS}",
        *(
            f"{_size_cel(path)} <= {MAX_ITEMS}"
            for path in (
                "object.spec.volumes",
                "object.metadata.labels",
                "object.metadata.annotations",
            )
        ),
    ]
)


def _count(value: object) -> int:
    return len(value) if isinstance(value, (list, dict)) else 0


def _container_items(body: object) -> int:
    if not isinstance(body, dict):
        return 0
    resources = body.get("resources")
    sections = (
        _count(resources.get("limits")) + _count(resources.get("requests"))
        if isinstance(resources, dict)
        else 0
    )
    return _count(body.get("env")) + _count(body.get("volumeMounts")) + sections


def _bounded(pod: Mapping[str, Any]) -> bool:
    """The Python twin of _BOUNDED_CEL."""
    spec, meta = spec_of(pod), metadata_of(pod)
    fields = [spec.get(f) for f in CONTAINER_FIELDS]
    if sum(_count(items) for items in fields) > MAX_CONTAINERS:
        return False
    items = sum(_container_items(c) for f in fields if isinstance(f, list) for c in f)
    if items > MAX_CONTAINER_ITEMS:
        return False
    return all(
        _count(value) <= MAX_ITEMS
        for value in (spec.get("volumes"), meta.get("labels"), meta.get("annotations"))
    )


# --- what every policy set checks ----------------------------------------------------------


_GPU_KEYS = " || ".join(f'k.startsWith("{p}")' for p in GPU_RESOURCE_PREFIXES)
_ENV_TEST = " || ".join(
    [*(f'e.name.startsWith("{p}")' for p in ENV_PREFIXES), *(f'e.name == "{n}"' for n in ENV_NAMES)]
)
_CONTAINER_CEL = (
    "(has(c.resources) && ("
    f"(has(c.resources.limits) && c.resources.limits.exists(k, {_GPU_KEYS})) || "
    f"(has(c.resources.requests) && c.resources.requests.exists(k, {_GPU_KEYS})) || "
    "has(c.resources.claims))) || "
    f"(has(c.env) && c.env.exists(e, {_ENV_TEST})) || "
    "has(c.envFrom) || "
    f'(has(c.volumeMounts) && c.volumeMounts.exists(m, m.mountPath.contains("{MOUNT_MARKER}"))) || '
    "(has(c.securityContext) && ("
    "(has(c.securityContext.privileged) && c.securityContext.privileged) || "
    "(has(c.securityContext.capabilities) && has(c.securityContext.capabilities.add))))"
)
_POD_CEL = " || ".join(
    [
        f"!({_BOUNDED_CEL})",
        *(
            f"(has(object.spec.{field}) && object.spec.{field}.exists(c, {_CONTAINER_CEL}))"
            for field in CONTAINER_FIELDS
        ),
        "(has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath)))",
        *(
            f"(has(object.spec.{f}) && object.spec.{f})"
            for f in ("hostPID", "hostIPC", "hostNetwork")
        ),
        "has(object.spec.runtimeClassName)",
        "has(object.spec.resourceClaims)",
        "(has(object.metadata.labels) && "
        f'object.metadata.labels.exists(k, k.startsWith("{OWN_PREFIX}")))',
        "(has(object.metadata.annotations) && object.metadata.annotations.exists(k, "
        + " || ".join(f'k.startsWith("{p}")' for p in ANNOTATION_PREFIXES)
        + "))",
    ]
)


def _protected_cel(var: str) -> str:
    tests = " || ".join(
        [f'k.startsWith("{OWN_PREFIX}")', *(f'k == "{a}"' for a in PROTECTED_ANNOTATIONS)]
    )
    annotations = f"{var}.metadata.annotations"
    return (
        f"(has({annotations}) && (size({annotations}) > {MAX_ITEMS} || "
        f"{annotations}.exists(k, {tests})))"
    )


_UPDATE_CEL = (
    '(has(request.subResource) && request.subResource != "") || '
    f"{_protected_cel('object')} || "
    f"(oldObject != null && {_protected_cel('oldObject')})"
)


def _protected(pod: Mapping[str, Any]) -> bool:
    annotations = annotations_of(pod)
    return len(annotations) > MAX_ITEMS or any(
        key.startswith(OWN_PREFIX) or key in PROTECTED_ANNOTATIONS for key in annotations
    )


def _is_gpu_key(name: object) -> bool:
    return isinstance(name, str) and name.startswith(GPU_RESOURCE_PREFIXES)


def _container_needs(body: Mapping[str, Any]) -> bool:
    resources = body.get("resources")
    if isinstance(resources, dict):
        for section in ("limits", "requests"):
            values = resources.get(section)
            if isinstance(values, dict) and any(_is_gpu_key(k) for k in values):
                return True
        if "claims" in resources:
            return True
    env = body.get("env")
    if isinstance(env, list) and any(
        isinstance(e, dict)
        and isinstance(e.get("name"), str)
        and (e["name"].startswith(ENV_PREFIXES) or e["name"] in ENV_NAMES)
        for e in env
    ):
        return True
    if "envFrom" in body:
        return True
    mounts = body.get("volumeMounts")
    if isinstance(mounts, list) and any(
        isinstance(m, dict) and MOUNT_MARKER in str(m.get("mountPath", "")) for m in mounts
    ):
        return True
    context = body.get("securityContext")
    if isinstance(context, dict):
        if context.get("privileged") is True:
            return True
        capabilities = context.get("capabilities")
        if isinstance(capabilities, dict) and "add" in capabilities:
            return True
    return False


def _checked_everywhere(pod: Mapping[str, Any]) -> bool:
    spec = spec_of(pod)
    for field in CONTAINER_FIELDS:
        items = spec.get(field)
        if isinstance(items, list) and any(
            isinstance(c, dict) and _container_needs(c) for c in items
        ):
            return True
    volumes = spec.get("volumes")
    if isinstance(volumes, list) and any(isinstance(v, dict) and "hostPath" in v for v in volumes):
        return True
    if any(spec.get(f) is True for f in ("hostPID", "hostIPC", "hostNetwork")):
        return True
    if "runtimeClassName" in spec or "resourceClaims" in spec:
        return True
    meta = metadata_of(pod)
    for section, prefixes in (("labels", (OWN_PREFIX,)), ("annotations", ANNOTATION_PREFIXES)):
        values = meta.get(section)
        if isinstance(values, dict) and any(str(k).startswith(prefixes) for k in values):
            return True
    return False


# --- ConfigMaps -----------------------------------------------------------------------------

#: Only ConfigMaps holding a key that an envFrom could turn into a variable the isolation checks
#: read are sent (validate.validate_config_map judges them), and those with more keys than the
#: condition looks into; other ConfigMap writes never wait on gpuwarden.
CONFIG_MAP_CEL = (
    'request.kind.group == "" && request.kind.kind == "ConfigMap" && has(object.data) && '
    f"(size(object.data) > {MAX_CONFIG_MAP_KEYS} || "
    f"object.data.exists(k, {_ENV_TEST.replace('e.name', 'k')}))"
)


def config_map_needs_review(config_map: Mapping[str, Any]) -> bool:
    """The Python twin of :data:`CONFIG_MAP_CEL`."""
    data = config_map.get("data")
    return isinstance(data, dict) and (
        len(data) > MAX_CONFIG_MAP_KEYS
        or any(isinstance(k, str) and (k.startswith(ENV_PREFIXES) or k in ENV_NAMES) for k in data)
    )


# --- Kubeflow jobs --------------------------------------------------------------------------


def _job_groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for kind in jobs.ALL_KINDS:
        kinds = groups.setdefault(kind.group, [])
        if kind.kind not in kinds:
            kinds.append(kind.kind)
    return groups


#: The job webhooks' first condition: only the kinds gpuwarden reads (:data:`jobs.ALL_KINDS`).
JOBS_ONLY_CEL = " || ".join(
    f'(request.kind.group == "{group}" && request.kind.kind in {json.dumps(kinds)})'
    for group, kinds in _job_groups().items()
)


def job_rules() -> list[dict[str, Any]]:
    """The job webhooks' rules: one per API group and version, naming every kind's plural."""
    by_version: dict[tuple[str, str], list[str]] = {}
    for kind in jobs.ALL_KINDS:
        by_version.setdefault((kind.group, kind.version), []).append(kind.plural)
    return [
        {
            "apiGroups": [group],
            "apiVersions": [version],
            "operations": ["CREATE", "UPDATE"],
            "resources": plurals,
            "scope": "Namespaced",
        }
        for (group, version), plurals in by_version.items()
    ]


def _names_gpu(section: str) -> str:
    return (
        f"(has({section}) && (size({section}) > {MAX_ITEMS} || {section}.exists(k, {_GPU_KEYS})))"
    )


def _resources_cel(resources: str) -> str:
    """Resource requirements name a GPU resource (or more resource names than are looked into)."""
    return f"{_names_gpu(f'{resources}.limits')} || {_names_gpu(f'{resources}.requests')}"


def _container_cel(c: str) -> str:
    """The container ``c`` names a GPU resource (or more resource names than are looked into)."""
    return f"(has({c}.resources) && ({_resources_cel(f'{c}.resources')}))"


def _pod_spec_cel(spec: str, *, present: bool = False) -> list[str]:
    """A PodSpec's containers name a GPU resource (or are more than are looked into);
    ``present`` where ``spec`` is known to be there (has() takes only a field, not ``x[s]``)."""
    there = "" if present else f"has({spec}) && "
    return [
        f"({there}has({spec}.{field}) && (size({spec}.{field}) > "
        f"{MAX_CONTAINERS} || {spec}.{field}.exists(c, {_container_cel('c')})))"
        for field in ("containers", "initContainers")
    ]


def _meta_cel(meta: str, *, present: bool = False) -> list[str]:
    there = "" if present else f"has({meta}) && "
    return [
        f"({there}has({meta}.{part}) && (size({meta}.{part}) > {MAX_ITEMS} || "
        f'{meta}.{part}.exists(k, k.startsWith("{OWN_PREFIX}"))))'
        for part in ("labels", "annotations")
    ]


def _template_cel(template: str, meta: str | None = None) -> str:
    """A replica's pod template names a GPU resource, or carries gpuwarden's own keys (in its
    metadata, or at ``meta`` where the object keeps the pods' metadata); or is too large to look
    into (more than MAX_CONTAINERS containers of a kind, MAX_ITEMS resource names, labels or
    annotations), and is sent unread."""
    return " || ".join(
        [*_pod_spec_cel(f"{template}.spec"), *_meta_cel(meta or f"{template}.metadata")]
    )


def _field(path: Sequence[str]) -> str:
    return ".".join(("object", *path))


def _site_body(
    site: jobs.TemplateSite, field: str, meta: str | None, *, present: bool = False
) -> str:
    """Whether the template (or the shape ``site`` names) at ``field`` may need gpuwarden, the
    pods' metadata at ``meta`` where the object keeps it apart; ``present`` where ``field`` is
    known to be there."""
    if site.per_replica:
        return (
            f"(size({field}) > {MAX_REPLICA_TYPES} || {field}.exists(r, "
            f"has({field}[r].template) && ({_template_cel(f'{field}[r].template')})))"
        )
    if site.shape == "podSpec":
        clauses = [
            *_pod_spec_cel(field, present=present),
            *(_meta_cel(meta, present=present and meta == field) if meta else []),
        ]
        return f"({' || '.join(clauses)})"
    if site.shape == "container":
        return f"({_container_cel(field)})"
    if site.shape == "resources":
        return f"({_resources_cel(field)})"
    return f"({_template_cel(field, meta)})"


def _present(paths: Sequence[Sequence[str]]) -> list[str]:
    """has() of every field on the way to each path, each once, outermost first."""
    present: list[str] = []
    for path in paths:
        for depth in range(1, len(path) + 1):
            test = f"has({_field(path[:depth])})"
            if test not in present:
                present.append(test)
    return present


def _site_cel(kind: jobs.JobKind, site: jobs.TemplateSite) -> str:
    """One template site of a kind: the fields on the way exist, its guards hold, and the
    template (or, per replica, any replica's template) may need gpuwarden."""
    guards = [f'{_field(path)} == "{value}"' for path, value in site.when]
    meta = _field(site.meta) if site.meta else None
    return " && ".join(
        [
            f'request.kind.group == "{kind.group}"',
            f'request.kind.kind == "{kind.kind}"',
            *_present([*(p for p, _ in site.when), site.path]),
            *guards,
            _site_body(site, _field(site.path), meta),
        ]
    )


def _alike(site: jobs.TemplateSite) -> tuple[tuple[str, ...], str, bool] | None:
    """What sites of a kind must share to be tested in one clause: the map that holds them, their
    shape, and whether each keeps the pods' metadata itself (a PodSpec's: has() cannot test the
    map itself at ``x[s]``, only a field in it); None for a site with guards or replicas, or whose
    metadata is elsewhere."""
    if site.when or site.per_replica or site.meta not in ((), site.path):
        return None
    if site.meta and site.shape != "podSpec":
        return None
    return site.path[:-1], site.shape, bool(site.meta)


def _guarded_alike(site: jobs.TemplateSite) -> tuple[object, ...] | None:
    """What guarded replica sites of a kind must share to be tested in one clause (Katib's
    trials of each Training Operator kind): the map that holds them and the fields their guards
    read; None for any other site."""
    if not site.when or not site.per_replica or site.meta:
        return None
    return ("guarded", site.path[:-1], tuple(path for path, _ in site.when))


def _guarded_sites_cel(kind: jobs.JobKind, sites: Sequence[jobs.TemplateSite]) -> str:
    """Guarded replica sites alike but for their guards' values and the last field of their
    path as one clause: a comprehension over a constant list of rows, each the guards' values
    and that field, so a request matches it exactly when it matches one site's own clause."""
    parent = sites[0].path[:-1]
    guarded = [path for path, _ in sites[0].when]
    rows = json.dumps([[*(value for _, value in site.when), site.path[-1]] for site in sites])
    last = len(guarded)
    field = f"{_field(parent)}[p[{last}]]"
    guards = [f"{_field(path)} == p[{index}]" for index, path in enumerate(guarded)]
    body = _site_body(sites[0], field, None, present=True)
    return " && ".join(
        [
            f'request.kind.group == "{kind.group}"',
            f'request.kind.kind == "{kind.kind}"',
            *_present([*guarded, parent]),
            f"{rows}.exists(p, {' && '.join(guards)} && p[{last}] in {_field(parent)} && {body})",
        ]
    )


def _sites_cel(kind: jobs.JobKind, sites: Sequence[jobs.TemplateSite]) -> str:
    """Sites of a kind alike but for the last field of their path (KServe's model shorthands,
    its components) as one clause, a comprehension over those fields' names (a constant list,
    so what it iterates does not grow with the object): a request matches it exactly when it
    matches one of the sites' own clauses."""
    if len(sites) == 1:
        return _site_cel(kind, sites[0])
    if _guarded_alike(sites[0]) is not None:
        return _guarded_sites_cel(kind, sites)
    parent = sites[0].path[:-1]
    field = f"{_field(parent)}[s]"
    names = json.dumps([site.path[-1] for site in sites])
    body = _site_body(sites[0], field, field if sites[0].meta else None, present=True)
    return " && ".join(
        [
            f'request.kind.group == "{kind.group}"',
            f'request.kind.kind == "{kind.kind}"',
            *_present([parent]),
            f"{names}.exists(s, s in {_field(parent)} && {body})",
        ]
    )


def _kind_clauses(kind: jobs.JobKind) -> list[str]:
    """A kind's clauses: one per site, sites alike (:func:`_alike`, :func:`_guarded_alike`)
    together."""
    groups: dict[object, list[jobs.TemplateSite]] = {}
    for site in kind.sites:
        groups.setdefault(_alike(site) or _guarded_alike(site) or site, []).append(site)
    return [f"({_sites_cel(kind, sites)})" for sites in groups.values()]


#: Only jobs whose replica templates name a GPU resource or carry gpuwarden's keys are sent to
#: the job webhooks: a job of CPU pods is created while gpuwarden is down. Narrower than the pod
#: scope on purpose: the pod webhooks still judge every pod the job's controller creates (its
#: escapes, and GPUs a rule gives to pods that ask for none); the job webhooks foretell and
#: refuse early what GPU jobs will get. Each kind's templates are where its
#: :attr:`~gpuwarden.policy.pod.jobs.JobKind.sites` say.
JOB_CEL = " || ".join(
    # A kind served in two versions has the same sites in each.
    dict.fromkeys(clause for kind in jobs.ALL_KINDS for clause in _kind_clauses(kind))
)


def _resources_need(resources: Any) -> bool:
    return isinstance(resources, dict) and any(
        isinstance(section := resources.get(s), dict)
        and (len(section) > MAX_ITEMS or any(map(_is_gpu_key, section)))
        for s in ("limits", "requests")
    )


def _job_container_needs(c: Any) -> bool:
    return isinstance(c, dict) and _resources_need(c.get("resources"))


def _pod_spec_needs(spec: Any) -> bool:
    if not isinstance(spec, dict):
        return False
    for field in ("containers", "initContainers"):
        items = spec.get(field)
        if not isinstance(items, list):
            continue
        if len(items) > MAX_CONTAINERS or any(map(_job_container_needs, items)):
            return True
    return False


def _meta_needs(meta: Any) -> bool:
    if isinstance(meta, dict):
        for part in ("labels", "annotations"):
            values = meta.get(part)
            if isinstance(values, dict) and (
                len(values) > MAX_ITEMS or any(str(k).startswith(OWN_PREFIX) for k in values)
            ):
                return True
    return False


def _template_needs(template: Any, meta: Any = None) -> bool:
    """:func:`_template_cel`'s twin; ``meta`` the pods' metadata where not the template's."""
    if not isinstance(template, dict):
        return False
    return _pod_spec_needs(template.get("spec")) or _meta_needs(
        template.get("metadata") if meta is None else meta
    )


def _at(obj: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _site_needs(job: Mapping[str, Any], site: jobs.TemplateSite) -> bool:
    if any(_at(job, path) != value for path, value in site.when):
        return False
    found = _at(job, site.path)
    if found is None:  # the CEL's has() on the way fails first
        return False
    meta = (_at(job, site.meta) or {}) if site.meta else None
    if site.per_replica:
        if not isinstance(found, dict):
            return False
        if len(found) > MAX_REPLICA_TYPES:
            return True
        return any(
            isinstance(r, dict) and _template_needs(r.get("template")) for r in found.values()
        )
    if site.shape == "podSpec":
        return _pod_spec_needs(found) or _meta_needs(meta)
    if site.shape == "container":
        return _job_container_needs(found)
    if site.shape == "resources":
        return _resources_need(found)
    return _template_needs(found, meta)


def job_needs_review(job: Mapping[str, Any]) -> bool:
    """The Python twin of :data:`JOB_CEL`: whether the API server calls the job webhooks."""
    kind = jobs.job_kind(job)
    return kind is not None and any(_site_needs(job, site) for site in kind.sites)


def job_match_conditions() -> list[dict[str, str]]:
    """The job webhooks' matchConditions (ANDed by the API server), as the chart renders them
    with webhook.scope policies."""
    return [
        {"name": "kubeflow-jobs-only", "expression": JOBS_ONLY_CEL},
        {"name": "gpuwarden-may-act", "expression": JOB_CEL},
    ]


# --- the chart ------------------------------------------------------------------------------

CHART_TEMPLATE_HEADER = (
    "{{- /* Generated by hack/update-docs.py from gpuwarden/policy/render/scope.py: the parts of the "
    "webhooks' matchConditions that do not depend on the policies. Do not edit. */ -}}\n"
)


def chart_template() -> str:
    """charts/gpuwarden/templates/_scope.tpl: the fixed parts of :meth:`ReviewScope.cel`, which
    the chart's webhooks.yaml joins with the keys of the policies in its values."""
    evidence = {
        kind: {"labels": list(labels), "annotations": list(annotations)}
        for kind, (labels, annotations) in sorted(KIND_EVIDENCE.items())
    }
    return (
        CHART_TEMPLATE_HEADER
        + '{{- define "gpuwarden.scope.evidence" -}}\n'
        + json.dumps(evidence, sort_keys=True)
        + "\n{{- end -}}\n"
        + '{{- define "gpuwarden.scope.pod" -}}\n'
        + _POD_CEL
        + "\n{{- end -}}\n"
        + '{{- define "gpuwarden.scope.update" -}}\n'
        + _UPDATE_CEL
        + "\n{{- end -}}\n"
        + '{{- define "gpuwarden.scope.configMaps" -}}\n'
        + CONFIG_MAP_CEL
        + "\n{{- end -}}\n"
        + '{{- define "gpuwarden.scope.jobs" -}}\n'
        + JOB_CEL
        + "\n{{- end -}}\n"
        + '{{- define "gpuwarden.scope.jobsOnly" -}}\n'
        + JOBS_ONLY_CEL
        + "\n{{- end -}}\n"
        + '{{- define "gpuwarden.scope.jobRules" -}}\n'
        + json.dumps(job_rules())
        + "\n{{- end -}}\n"
    )
