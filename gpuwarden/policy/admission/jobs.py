"""Admission of Kubeflow job objects: each replica decided as the pod its controller will create.

A job is denied when a replica's pod would be, with that pod's message prefixed by the replica
(``Worker: ...``). Otherwise the mutation rewrites each replica's pod template into what the pod
webhook would make of the pod, so the controller's pods need no further change and queues that
charge templates (Kueue, Volcano's PodGroup minResources) charge what the pods use. A tenant's
``jobTemplates: keep`` leaves the job as written and says in warnings what the pods will get.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jsonpatch

from gpuwarden.policy.admission.decision import (
    AdmissionRequest,
    ClusterView,
    Decision,
    bounded_warnings,
    warning,
)
from gpuwarden.policy.admission.patch import escape, pointer
from gpuwarden.policy.admission.pipeline import Admission, admit, enforced
from gpuwarden.policy.admission.validate import MAX_MESSAGE
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.pod.jobs import JobShapeError, ReplicaTemplate
from gpuwarden.policy.spec.model import EnforcementAction
from gpuwarden.policy.spec.policyset import PolicySet

_PREFIX = "gpuwarden: "
# Pod fields the controller writes itself: a pod patch that touched them has no template twin.
_CONTROLLER_FIELDS = frozenset(
    {"/metadata/name", "/metadata/generateName", "/metadata/namespace"}
    | {f"/metadata/labels/{escape(key)}" for key in jobs.CONTROLLER_LABELS}
)


class ReplicaAdmission(NamedTuple):
    """One replica: the pod its controller will create (the first; the second where only that
    one is denied) and that pod's admission."""

    replica: ReplicaTemplate
    pod: Mapping[str, Any]
    admission: Admission


@dataclass(frozen=True)
class JobAdmission(Admission):
    """A job's answers: what /mutate and /validate say, the job as the mutation leaves it
    (``pod``, the object under review), and each replica's admission."""

    replicas: tuple[ReplicaAdmission, ...] = ()


def _replica_line(replica: str, line: str) -> str:
    return warning(f"{_PREFIX}{replica}: {line.removeprefix(_PREFIX)}")


def template_patch(
    template: Mapping[str, Any], path: Sequence[str], pod_patch: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The pod's JSON Patch moved under the template at ``path``: the same operations on the
    template's metadata and spec, with the objects they need created first, and none on the
    fields the controller writes itself (name, namespace, its labels)."""
    base = pointer(list(path))
    ops = [op for op in pod_patch if op["path"] not in _CONTROLLER_FIELDS]
    if not ops:
        return []
    meta = template.get("metadata")
    parents: list[dict[str, Any]] = []
    touches = {op["path"].split("/")[1] for op in ops}
    if "metadata" in touches and not isinstance(meta, Mapping):
        parents.append({"op": "add", "path": f"{base}/metadata", "value": {}})
        meta = {}
    if "spec" in touches and not isinstance(template.get("spec"), Mapping):
        parents.append({"op": "add", "path": f"{base}/spec", "value": {}})
    # The pod had the controller's labels, so its patch adds label keys one by one.
    labelled = any(op["path"].startswith("/metadata/labels/") for op in ops)
    if labelled and isinstance(meta, Mapping) and not isinstance(meta.get("labels"), Mapping):
        parents.append({"op": "add", "path": f"{base}/metadata/labels", "value": {}})
    return parents + [{**op, "path": base + op["path"]} for op in ops]


_MISSING = object()


def _tokens(path: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _resolve(document: Any, tokens: Sequence[str]) -> Any:
    for token in tokens:
        if isinstance(document, Mapping):
            document = document.get(token, _MISSING)
        elif isinstance(document, list) and token.isdigit() and int(token) < len(document):
            document = document[int(token)]
        else:
            return _MISSING
    return document


def twin_of(twins: Sequence[tuple[str, str]], path: str) -> str | None:
    """The job's JSON pointer that holds the pod's field at ``path``, or None."""
    found = [(pod, job) for pod, job in twins if path == pod or path.startswith(pod + "/")]
    if not found:
        return None
    pod, job = max(found, key=lambda pair: len(pair[0]))
    return job + path[len(pod) :]


def twin_patch(
    job: Mapping[str, Any],
    twins: Sequence[tuple[str, str]],
    pod_patch: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[str]]:
    """The pod's JSON Patch written onto the job's fields that make the pod (``twins``), valid
    against ``job``: the maps an operation needs created first, a map added where the job has
    one merged key by key; and the pod paths that have no twin (not the controller's own)."""
    document: Any = job
    ops: list[dict[str, Any]] = []
    lost: list[str] = []

    def emit(op: dict[str, Any]) -> None:
        nonlocal document
        ops.append(op)
        document = jsonpatch.apply_patch(document, [op])

    for op in pod_patch:
        if op["path"] in _CONTROLLER_FIELDS:
            continue
        target = twin_of(twins, op["path"])
        if target is None:
            lost.append(op["path"])
            continue
        tokens = _tokens(target)
        current = _resolve(document, tokens)
        if op["op"] == "remove":
            if current is _MISSING:
                lost.append(op["path"])
            else:
                emit({"op": "remove", "path": target})
            continue
        parent_ok = True
        for depth in range(1, len(tokens)):
            here = _resolve(document, tokens[:depth])
            if here is _MISSING:
                emit({"op": "add", "path": pointer(tokens[:depth]), "value": {}})
            elif not isinstance(here, (Mapping, list)):
                parent_ok = False
                break
        if not parent_ok:
            lost.append(op["path"])
        elif isinstance(op.get("value"), Mapping) and isinstance(current, Mapping):
            for key, value in op["value"].items():
                emit({"op": "add", "path": f"{target}/{escape(str(key))}", "value": value})
        else:
            verb = "add" if current is _MISSING else op["op"]
            emit({"op": verb, "path": target, "value": op.get("value")})
    return ops, lost


def _writes_under(
    twins: Sequence[tuple[str, str]], pod_patch: Sequence[Mapping[str, Any]], prefix: str
) -> dict[str, Any]:
    """What a pod's patch writes under the job's ``prefix`` through ``twins``, key by key."""
    writes: dict[str, Any] = {}
    for op in pod_patch:
        target = twin_of(twins, op["path"])
        if op["path"] in _CONTROLLER_FIELDS or target is None:
            continue
        value = op.get("value") if op["op"] != "remove" else _MISSING
        if isinstance(value, Mapping):
            items = {f"{target}/{escape(str(k))}": v for k, v in value.items()}
        else:
            items = {target: value}
        writes |= {t: v for t, v in items.items() if t == prefix or t.startswith(prefix + "/")}
    return writes


def _split_twins(replicas: Sequence[ReplicaAdmission]) -> tuple[str, str, str] | None:
    """Two replicas whose pods share a field of the job (the labels of an LLMInferenceService's
    leader and workers) but would get different values in it: their names and the field."""
    holders: dict[str, list[ReplicaAdmission]] = {}
    for r in replicas:
        for _, target in r.replica.twins:
            holders.setdefault(target, []).append(r)
    for prefix, sharing in holders.items():
        if len(sharing) < 2:
            continue
        first, *others = sharing
        seen = _writes_under(first.replica.twins, first.admission.mutation.patch, prefix)
        for other in others:
            writes = _writes_under(other.replica.twins, other.admission.mutation.patch, prefix)
            if writes != seen:
                field = prefix.lstrip("/").replace("/", ".")
                return first.replica.name, other.replica.name, field
    return None


def field_name(pointer: str) -> str:
    """A JSON pointer as messages name fields: ``/spec/containers/0`` is spec.containers[0]."""
    return re.sub(r"/(\d+)(?=/|$)", r"[\1]", pointer).replace("/", ".").lstrip(".")


def _in_job_terms(replica: ReplicaTemplate, pod: Mapping[str, Any], message: str) -> str:
    """A pod's denial naming the job's fields where the pod was built from them: the
    container ``spec.containers[kserve-container]`` as ``spec.predictor.model``."""
    spec = pod.get("spec")
    if not replica.twins or not isinstance(spec, Mapping):
        return message
    for field in ("containers", "initContainers"):
        items = spec.get(field)
        for i, c in enumerate(items if isinstance(items, list) else ()):
            name = c.get("name") if isinstance(c, Mapping) else None
            twin = twin_of(replica.twins, f"/spec/{field}/{i}")
            if isinstance(name, str) and twin is not None:
                message = message.replace(f"spec.{field}[{name}]", field_name(twin))
    return message


def _changed(replica: ReplicaTemplate, old: Mapping[str, Any] | None) -> bool:
    """Whether an update changed what the replica's pods are made of (a new replica counts)."""
    if old is None:
        return True
    try:
        before = {r.name: r for r in jobs.replica_templates(old)}
    except JobShapeError:
        return True
    was = before.get(replica.name)
    return was is None or (was.template, was.restart_policy) != (
        replica.template,
        replica.restart_policy,
    )


def unreadable_job(kind: str, error: str) -> Decision:
    """A job whose replicas no Kubernetes object could have: refused, naming the field."""
    return Decision(
        allowed=False,
        code=400,
        reason="BadRequest",
        message=f"gpuwarden cannot read the {kind}'s replicas: {error}",
        rule="job-shape",
    )


def _keeps_templates(request: AdmissionRequest, policies: PolicySet, cluster: ClusterView) -> bool:
    tenant = policies.tenant_for(request.namespace, cluster.labels_for(request.namespace))
    return tenant is not None and tenant.job_templates == "keep"


def _named(decision: Decision, decisions: Sequence[Decision]) -> Decision:
    """``decision`` naming the tenant, profile and rule of the first replica that has one."""
    for d in decisions:
        if d.profile is not None:
            return decision._replace(tenant=d.tenant, profile=d.profile, rule=d.rule)
    tenant = next((d.tenant for d in decisions if d.tenant is not None), None)
    return decision._replace(tenant=tenant)


def admit_job(
    request: AdmissionRequest,
    policies: PolicySet,
    cluster: ClusterView,
    *,
    default_action: EnforcementAction = "enforce",
    enforcing: bool = False,
) -> JobAdmission:
    """Admit a Kubeflow job (``request.pod`` holds it) as its controller's pods will be:
    each replica's pod through the pod pipeline (mutate, then validate the mutated pod), under
    the enforcementAction each pod would get; with ``enforcing``, as enforcing would, whatever
    the enforcementAction (what `gpuwarden audit` asks)."""

    def admit_pod(pod_request: AdmissionRequest) -> Admission:
        if enforcing:
            return enforced(pod_request, policies, cluster)
        return admit(pod_request, policies, cluster, default_action=default_action)

    job = request.pod
    kind = str(job.get("kind"))
    if request.operation not in ("CREATE", "UPDATE") or request.sub_resource:
        return JobAdmission(Decision(), Decision(), job)
    try:
        templates = jobs.replica_templates(job)
    except JobShapeError as exc:
        denial = unreadable_job(kind, str(exc))
        return JobAdmission(denial, denial, job)
    kept = jobs.kept_as_written(job)
    keep = kept is not None or _keeps_templates(request, policies, cluster)
    replicas: list[ReplicaAdmission] = []
    patch: list[dict[str, Any]] = []
    notes: list[str] = []
    # Replicas built from the job's own fields may share some (their pods' labels): where one
    # changed, all are judged, so that what they share is decided together.
    twins_changed = any(r.twins and _changed(r, request.old_pod) for r in templates)
    for replica in templates:
        if request.operation == "UPDATE" and not (
            _changed(replica, request.old_pod) or (replica.twins and twins_changed)
        ):
            continue
        pod = jobs.replica_pod(job, replica, request.namespace)
        pod_request = AdmissionRequest(
            "CREATE", request.namespace, pod, uid=request.uid, dry_run=request.dry_run
        )
        admission = admit_pod(pod_request)
        replicas.append(ReplicaAdmission(replica, pod, admission))
        notes += [_replica_line(replica.name, line) for line in admission.warnings]
        if not keep and not replica.twins:
            patch += template_patch(replica.template, replica.path, admission.mutation.patch)
        for index in jobs.distinct_indices(job, replica)[1:]:
            # The pods after the first lack its master role: where the policy tells them apart,
            # they are judged too, and the template can carry only the first one's changes.
            other = jobs.replica_pod(job, replica, request.namespace, index)
            later = admit_pod(pod_request._replace(pod=other))
            if later.mutation.patch != admission.mutation.patch:
                notes.append(
                    warning(
                        f"{_PREFIX}{replica.name}: pods after the first get profile "
                        f"{later.mutation.profile} (the template has the first's)"
                    )
                )
            if not later.validation.allowed and admission.validation.allowed:
                replicas[-1] = ReplicaAdmission(replica, other, later)
    split = _split_twins(replicas)
    if split is not None and kept is None:
        kept = f"the {kind} is kept as written: {split[0]}, {split[1]} pods differ in {split[2]}"
        keep = True
    current: Mapping[str, Any] = job  # as the replicas' patches so far leave it
    for r in replicas if not keep else ():
        if r.replica.twins:
            ops, lost = twin_patch(current, r.replica.twins, r.admission.mutation.patch)
            patch += ops
            current = jsonpatch.apply_patch(dict(current), ops) if ops else current
            if lost:
                notes.append(
                    warning(
                        f"{_PREFIX}{r.replica.name}: {', '.join(lost)} of its pods not written "
                        f"to the {kind} (no field of it holds them); each pod gets them when "
                        "it is created"
                    )
                )
    decisions = [r.admission.mutation for r in replicas]
    if keep and any(d.patch for d in decisions):
        if kept is not None:
            # First, where the bound on warnings cannot cut it off.
            notes.insert(0, warning(f"{_PREFIX}{kept}"))
        else:
            notes.append(
                warning(
                    f"{_PREFIX}the {kind} is kept as written (tenant jobTemplates: keep); each "
                    "pod gets the above when it is created"
                )
            )
    mutation = _named(Decision(patch=tuple(patch), warnings=bounded_warnings(notes)), decisions)
    mutated: Mapping[str, Any] = job
    if patch:
        mutated = jsonpatch.apply_patch(dict(job), patch)
    validation = _named(Decision(), decisions)
    for r in replicas:
        denied = r.admission.validation
        if not denied.allowed:
            message = f"{r.replica.name}: {_in_job_terms(r.replica, r.pod, denied.message)}"
            if len(message) > MAX_MESSAGE:
                message = message[: MAX_MESSAGE - 3] + "..."
            validation = denied._replace(message=message, warnings=())
            break
    else:
        # Under audit: the first replica enforcing would deny, for the audit annotations and
        # metric (its warnings are already among the job's, above).
        audited = next((r for r in replicas if r.admission.validation.audited), None)
        if audited is not None:
            validation = audited.admission.validation._replace(warnings=())
    return JobAdmission(mutation, validation, mutated, tuple(replicas))
