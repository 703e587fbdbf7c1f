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
from gpuwarden.policy.admission.pipeline import Admission, admit, enforced
from gpuwarden.policy.admission.twins import (
    in_job_terms,
    split_twins,
    twin_of,
    twin_patch,
    value_at,
)
from gpuwarden.policy.admission.validate import MAX_MESSAGE
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.pod.jobs import JobShapeError, ReplicaTemplate
from gpuwarden.policy.pod.pointer import escape, pointer, tokens
from gpuwarden.policy.pod.resources import is_gpu_resource
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
    template: Mapping[str, Any],
    path: Sequence[str],
    pod_patch: Sequence[Mapping[str, Any]],
    metadata_path: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """The pod's JSON Patch moved under the template at ``path``: the same operations on the
    template's metadata (or, with ``metadata_path``, on the metadata there, which the template's
    stands for) and spec, with the objects they need created first, and none on the fields the
    controller writes itself (name, namespace, its labels)."""
    base = pointer(list(path))
    ops = _own(pod_patch)
    if not ops:
        return []
    meta = template.get("metadata")
    parents: list[dict[str, Any]] = []
    touches = {op["path"].split("/")[1] for op in ops}
    meta_base = f"{base}/metadata" if metadata_path is None else pointer(list(metadata_path))
    if "metadata" in touches and not isinstance(meta, Mapping):
        parents.append({"op": "add", "path": meta_base, "value": {}})
        meta = {}
    if "spec" in touches and not isinstance(template.get("spec"), Mapping):
        parents.append({"op": "add", "path": f"{base}/spec", "value": {}})
    # The pod had the controller's labels, so its patch adds label keys one by one.
    labelled = any(op["path"].startswith("/metadata/labels/") for op in ops)
    if labelled and isinstance(meta, Mapping) and not isinstance(meta.get("labels"), Mapping):
        parents.append({"op": "add", "path": f"{meta_base}/labels", "value": {}})
    moved: list[dict[str, Any]] = []
    made: set[str] = set()  # paths the operations so far have written
    for op in ops:
        where = op["path"]
        if where.startswith("/metadata/") or where == "/metadata":
            moved.append({**op, "path": meta_base + where.removeprefix("/metadata")})
            continue
        # A list the controller adds to the pod (a Notebook's NB_PREFIX env) is appended to there;
        # where the template has no such list, the first append makes it.
        parent = where.removesuffix("/-")
        if (
            parent != where
            and not any(parent == m or parent.startswith(f"{m}/") for m in made)
            and value_at(template, parent) is None
        ):
            op = {"op": "add", "path": parent, "value": [op["value"]]}
        made.add(op["path"])
        moved.append({**op, "path": base + op["path"]})
    return parents + moved


_POD_CLAIMS = "/spec/resourceClaims"
# A container's resources.claims, and its GPU resources, under any container list.
_CONTAINER_CLAIMS = re.compile(r"^/spec/[A-Za-z]+/\d+/resources/claims(/|$)")
_CONTAINER_RESOURCE = re.compile(r"^/spec/[A-Za-z]+/\d+/resources/(limits|requests)/[^/]+$")


def _claim_ops(
    twins: Sequence[tuple[str, str]], pod_patch: Sequence[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], list[str]]:
    """A pod patch that gives the pod gpuwarden's claim, where the job has no field for the
    pod's claims (a TrainJob): the patch less the claim and the GPU resources it replaces, and
    their paths. The API server refuses a pod template whose containers name a claim the pod
    does not have, so each pod gets the claim when it is created instead."""
    if not any(op["path"] == _POD_CLAIMS for op in pod_patch) or twin_of(twins, _POD_CLAIMS):
        return list(pod_patch), []
    kept: list[Mapping[str, Any]] = []
    held: list[str] = []
    for op in pod_patch:
        path = str(op["path"])
        if (
            path == _POD_CLAIMS
            or path.startswith(f"{_POD_CLAIMS}/")
            or _CONTAINER_CLAIMS.match(path)
            or (
                op["op"] == "remove"
                and _CONTAINER_RESOURCE.match(path) is not None
                and is_gpu_resource(tokens(path)[-1])
            )
        ):
            held.append(path)
        else:
            kept.append(op)
    return kept, held


def _own(pod_patch: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A pod's patch less what touches the fields its controller writes."""
    return [op for op in pod_patch if op["path"] not in _CONTROLLER_FIELDS]


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
    """Admit a job of a kind :mod:`gpuwarden.policy.pod.jobs` reads (``request.pod`` holds it)
    as its controller's pods will be:
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
            patch += template_patch(
                replica.template, replica.path, admission.mutation.patch, replica.metadata_path
            )
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
    split = split_twins(
        [(r.replica.name, r.replica.twins, _own(r.admission.mutation.patch)) for r in replicas]
    )
    if split is not None and kept is None:
        kept = f"the {kind} is kept as written: {split[0]}, {split[1]} pods differ in {split[2]}"
        keep = True
    current: Mapping[str, Any] = job  # as the replicas' patches so far leave it
    for r in replicas if not keep else ():
        if r.replica.twins:
            pod_patch, held = _claim_ops(r.replica.twins, _own(r.admission.mutation.patch))
            ops, lost = twin_patch(current, r.replica.twins, pod_patch)
            lost = held + lost
            patch += ops
            current = jsonpatch.apply_patch(dict(current), ops) if ops else current
            if lost:
                notes.append(
                    warning(
                        f"{_PREFIX}{r.replica.name}: each pod gets these when it is created, "
                        f"as no field of the {kind} holds them: {', '.join(lost)}"
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
            message = f"{r.replica.name}: {in_job_terms(r.replica.twins, r.pod, denied.message)}"
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
