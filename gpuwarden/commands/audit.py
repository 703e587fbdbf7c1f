"""`gpuwarden audit`: what enforcing the policies would deny or change in the pods and Kubeflow
jobs already running.

Each pod is judged as a CREATE of its spec as it is now, each job as the CREATE of its replicas'
pods (docs/rollout.md says why that is what
the webhooks would have answered at its admission, and what it cannot tell), under enforce
whatever the policies' enforcementAction: the question is what switching to enforce would do.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic.alias_generators import to_camel

from gpuwarden.commands._inputs import (
    InputError,
    add_policies_option,
    eprint,
    load_cluster,
    load_policies,
    read_documents,
)
from gpuwarden.kube.client import KubeConfigError, api_client
from gpuwarden.kube.snapshot import SnapshotError, read_snapshot
from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    Decision,
    PolicySet,
    admitted_gpu_memory,
)
from gpuwarden.policy.admission import manifests
from gpuwarden.policy.admission.jobs import admit_job
from gpuwarden.policy.admission.pipeline import enforced
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.pod.resources import FINISHED_PHASES

HELP = "Report what the policies would deny or change in the pods and jobs already running"
DESCRIPTION = """\
Report, per tenant and namespace, what enforcing the policies would deny or change in the pods
already running, and in the Kubeflow Training Operator jobs: from `kubectl get pods -A -o yaml`
(and `kubectl get pytorchjobs,tfjobs,... -A -o yaml`) dumps (FILE), or read with --cluster.
Each pod is judged as a CREATE of its spec as it is now, each job as the CREATE of its replicas'
pods, under enforce. Exit status 1 when some pod or job would be denied. See docs/rollout.md."""

Result = Literal["fail", "warn", "pass", "skip"]
# Pods in FINISHED_PHASES are judged as skipped.
# The conditions of jobs that run no pod any more: a Training Operator job's or a Katib
# Experiment's Succeeded and Failed, a batch Job's Complete and Failed.
_JOB_FINISHED = FINISHED_PHASES | {"Complete"}
# Patch paths a table line names before it counts the rest.
_PATHS_SHOWN = 3
POLICY_REPORT_VERSION = "wgpolicyk8s.io/v1alpha2"
SOURCE = "gpuwarden"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="pods as `kubectl get pods -A -o yaml` writes them (a List, or Pod documents; "
        "- for stdin)",
    )
    add_policies_option(parser)
    parser.add_argument(
        "--namespaces",
        metavar="FILE",
        help="Namespace and PriorityClass manifests (kubectl get namespaces,priorityclasses "
        "-o yaml): the labels that choose tenants by namespaceSelector",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="read the pods, Namespaces and PriorityClasses from the cluster of the current "
        "kubeconfig (or --kubeconfig) instead of files",
    )
    parser.add_argument("--kubeconfig", type=Path, metavar="FILE", help="with --cluster")
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "policyreport"),
        default="table",
        help="a table per tenant and namespace with the pods that would change (default), "
        f"JSON, or {POLICY_REPORT_VERSION} PolicyReports, one per namespace",
    )


@dataclass(frozen=True)
class PodAudit:
    """What enforcing would do to one running pod."""

    namespace: str
    name: str
    uid: str
    tenant: str | None
    profile: str | None
    rule: str | None
    policy: str
    skipped: str = ""  # why the object was not judged
    check: str = ""  # the check that would deny it
    reason: str = ""
    message: str = ""  # the denial, as the user would have read it
    patch: tuple[Mapping[str, Any], ...] = ()
    # A Kubeflow job's kind and apiVersion; a pod's are Pod, v1.
    kind: str = "Pod"
    api_version: str = "v1"

    @property
    def is_job(self) -> bool:
        return self.kind != "Pod"

    @property
    def label(self) -> str:
        """How the table names it: namespace/name, with the kind for a job."""
        kind = f"{self.kind}/" if self.is_job else ""
        return f"{self.namespace}/{kind}{self.name}"

    @property
    def denied(self) -> bool:
        return bool(self.check)

    @property
    def verdict(self) -> str:
        if self.skipped:
            return "skip"
        if self.denied:
            return "deny"
        return "change" if self.patch else "pass"

    def change_text(self) -> str:
        paths = [str(op.get("path")) for op in self.patch]
        more = f" and {len(paths) - _PATHS_SHOWN} more" if len(paths) > _PATHS_SHOWN else ""
        how = f" (profile {self.profile} via {self.rule})" if self.profile else ""
        return (
            f"would apply {len(paths)} patch operation{'s' if len(paths) != 1 else ''}{how}: "
            f"{', '.join(paths[:_PATHS_SHOWN])}{more}"
        )


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _phase(pod: Mapping[str, Any]) -> str:
    status = pod.get("status")
    return str(status.get("phase") or "") if isinstance(status, Mapping) else ""


def read_pod_files(sources: Sequence[str]) -> list[Mapping[str, Any]]:
    """The pods and Kubeflow jobs of ``sources``: their documents, or Lists of them (kubectl
    get -o yaml)."""
    objects: list[Mapping[str, Any]] = []
    for source in sources:
        for index, doc in enumerate(read_documents(source), start=1):
            where = f"{source}: document {index}"
            if not isinstance(doc, Mapping):
                raise InputError(f"{where}: expected a Pod, a Kubeflow job or a List of them")
            items = doc.get("items") if str(doc.get("kind", "")).endswith("List") else [doc]
            for number, item in enumerate(items if isinstance(items, list) else (), start=1):
                kind = item.get("kind", "Pod") if isinstance(item, Mapping) else None
                known = kind == "Pod" or (isinstance(item, Mapping) and jobs.is_job(item))
                if not known or not isinstance(item.get("spec"), Mapping):
                    raise InputError(
                        f"{where}: item {number}: expected a Pod or a Kubeflow job "
                        f"({', '.join(k.kind for k in jobs.ALL_KINDS)}) with a spec, got {kind!r}"
                    )
                objects.append(item)
    return objects


def _job_finished(job: Mapping[str, Any]) -> str:
    """The condition (Succeeded, Failed) of a job that runs no pod any more, or ""."""
    status = job.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for condition in conditions if isinstance(conditions, list) else ():
        if (
            isinstance(condition, Mapping)
            and condition.get("type") in _JOB_FINISHED
            and condition.get("status") == "True"
        ):
            return str(condition["type"])
    return ""


def _memory_by_namespace(pods: Iterable[Mapping[str, Any]]) -> dict[str, Decimal]:
    """GPU memory gpuwarden admitted to the live pods of each namespace (pods admitted before
    it carry no record and count nothing)."""
    out: dict[str, Decimal] = {}
    for pod in pods:
        if _phase(pod) in FINISHED_PHASES:
            continue
        namespace = str(_meta(pod).get("namespace") or "default")
        out[namespace] = out.get(namespace, Decimal(0)) + admitted_gpu_memory(pod)
    return out


def audit_pods(
    pods: Sequence[Mapping[str, Any]], policies: PolicySet, cluster: ClusterView
) -> list[PodAudit]:
    """Each pod judged as the CREATE of its spec as it is now, under enforce; each against its
    namespace's GPU memory without its own."""
    memory = _memory_by_namespace(p for p in pods if not jobs.is_job(p))
    out: list[PodAudit] = []
    for pod in pods:
        if jobs.is_job(pod):
            out.append(_audit_job(pod, policies, cluster))
            continue
        meta = _meta(pod)
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or meta.get("generateName") or "<unnamed>")
        uid = str(meta.get("uid") or "")
        phase = _phase(pod)
        if phase in FINISHED_PHASES:
            tenant = policies.tenant_for(namespace, cluster.labels_for(namespace))
            out.append(
                PodAudit(
                    namespace,
                    name,
                    uid,
                    tenant.name if tenant else None,
                    None,
                    None,
                    ",".join(policies.names),
                    skipped=f"phase {phase}: holds no GPU any more",
                )
            )
            continue
        others = memory.get(namespace, Decimal(0)) - admitted_gpu_memory(pod)
        view = replace(
            cluster, namespace_gpu_memory={**cluster.namespace_gpu_memory, namespace: others}
        )
        result = enforced(AdmissionRequest("CREATE", namespace, pod), policies, view)
        mutation, validation = result.mutation, result.validation
        profile = mutation.profile or validation.profile
        owner = policies.profile_policy.get(profile) if profile else None
        audit = PodAudit(
            namespace,
            name,
            uid,
            mutation.tenant or validation.tenant,
            profile,
            mutation.rule or validation.rule,
            owner.metadata.name if owner is not None else ",".join(policies.names),
            patch=mutation.patch,
        )
        out.append(_with_denial(audit, validation))
    return out


def _with_denial(audit: PodAudit, validation: Decision) -> PodAudit:
    """``audit`` with what enforcing would deny, if the validation denies."""
    if validation.allowed:
        return audit
    return replace(
        audit,
        check=to_camel(validation.audit_annotations.get("denied-by", "placement")),
        reason=validation.reason,
        message=validation.message,
    )


def _audit_job(job: Mapping[str, Any], policies: PolicySet, cluster: ClusterView) -> PodAudit:
    """A job judged as the CREATE of its replicas' pods, under enforce."""
    meta = _meta(job)
    namespace = str(meta.get("namespace") or "default")
    tenant = policies.tenant_for(namespace, cluster.labels_for(namespace))
    audit = PodAudit(
        namespace,
        str(meta.get("name") or "<unnamed>"),
        str(meta.get("uid") or ""),
        tenant.name if tenant else None,
        None,
        None,
        ",".join(policies.names),
        kind=str(job.get("kind")),
        api_version=str(job.get("apiVersion") or "kubeflow.org/v1"),
    )
    finished = _job_finished(job)
    if finished:
        return replace(audit, skipped=f"condition {finished}: runs no pod any more")
    result = admit_job(
        AdmissionRequest("CREATE", namespace, job), policies, cluster, enforcing=True
    )
    mutation, validation = result.mutation, result.validation
    owner = policies.profile_policy.get(mutation.profile) if mutation.profile else None
    audit = replace(
        audit,
        tenant=mutation.tenant or validation.tenant or audit.tenant,
        profile=mutation.profile,
        rule=mutation.rule,
        policy=owner.metadata.name if owner is not None else audit.policy,
        patch=mutation.patch,
    )
    return _with_denial(audit, validation)


def _key(audit: PodAudit) -> tuple[str, str]:
    return (audit.tenant or "-", audit.namespace)


def summary_rows(audits: Sequence[PodAudit]) -> list[dict[str, Any]]:
    """Per tenant and namespace: pods, jobs, and how many of them enforcing would deny, change,
    pass, skip."""
    rows: dict[tuple[str, str], Counter[str]] = {}
    for audit in audits:
        counts = rows.setdefault(_key(audit), Counter())
        counts["jobs" if audit.is_job else "pods"] += 1
        counts["wouldDeny"] += audit.denied
        counts["wouldChange"] += bool(audit.patch) and not audit.skipped
        counts["pass"] += audit.verdict == "pass"
        counts["skip"] += bool(audit.skipped)
    return [
        {
            "tenant": tenant,
            "namespace": namespace,
            **{k: counts[k] for k in ("pods", "jobs", "wouldDeny", "wouldChange", "pass", "skip")},
        }
        for (tenant, namespace), counts in sorted(rows.items())
    ]


def table(audits: Sequence[PodAudit]) -> str:
    head = ("TENANT", "NAMESPACE", "PODS", "JOBS", "WOULD DENY", "WOULD CHANGE", "PASS", "SKIP")
    rows = [head] + [tuple(str(v) for v in row.values()) for row in summary_rows(audits)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    details = []
    for audit in sorted(audits, key=lambda a: (_key(a), a.label)):
        where = audit.label
        if audit.denied:
            details.append(f"{where}: would deny ({audit.check}): {audit.message}")
        if audit.patch and not audit.skipped:
            details.append(f"{where}: {audit.change_text()}")
    return "\n".join(lines + (["", *details] if details else [])) + "\n"


def as_json(audits: Sequence[PodAudit]) -> dict[str, Any]:
    return {
        "summary": summary_rows(audits),
        "pods": [_json_entry(a) for a in audits if not a.is_job],
        "jobs": [{"kind": a.kind, **_json_entry(a)} for a in audits if a.is_job],
    }


def _json_entry(a: PodAudit) -> dict[str, Any]:
    return {
        "namespace": a.namespace,
        "name": a.name,
        "tenant": a.tenant,
        "profile": a.profile,
        "rule": a.rule,
        "verdict": a.verdict,
        "skipped": a.skipped or None,
        "wouldDeny": (
            {"check": a.check, "reason": a.reason, "message": a.message} if a.denied else None
        ),
        "wouldChange": [dict(op) for op in a.patch] if not a.skipped else [],
    }


def _results(audit: PodAudit) -> list[dict[str, Any]]:
    """The PolicyReport results of one pod (wgpolicyk8s.io/v1alpha2 PolicyReportResult): a
    fail per denial, a warn per change, else one pass or skip."""
    resource = {
        "apiVersion": audit.api_version,
        "kind": audit.kind,
        "name": audit.name,
        "namespace": audit.namespace,
    }
    if audit.uid:
        resource["uid"] = audit.uid
    properties = {
        key: value
        for key, value in (
            ("tenant", audit.tenant),
            ("profile", audit.profile),
            ("rule", audit.rule),
        )
        if value
    }

    def result(rule: str, outcome: Result, message: str, **more: str) -> dict[str, Any]:
        return {
            "policy": audit.policy,
            "rule": rule,
            "result": outcome,
            "message": message,
            "source": SOURCE,
            "scored": True,
            "resources": [resource],
            "properties": {**properties, **more},
        }

    if audit.skipped:
        return [result("admission", "skip", audit.skipped)]
    found = []
    if audit.denied:
        found.append(result(audit.check, "fail", audit.message, reason=audit.reason))
    if audit.patch:
        found.append(
            result(
                "mutation",
                "warn",
                audit.change_text(),
                patchOperations=str(len(audit.patch)),
            )
        )
    what = f"the {audit.kind}" if audit.is_job else "the pod"
    return found or [result("admission", "pass", f"enforcing would admit {what} unchanged")]


def policy_reports(audits: Sequence[PodAudit]) -> dict[str, Any]:
    """A List of PolicyReports, one per namespace, as wgpolicyk8s.io/v1alpha2 defines them
    (kubernetes-sigs/wg-policy-prototypes policy-report/crd/v1alpha2)."""
    by_namespace: dict[str, list[dict[str, Any]]] = {}
    for audit in sorted(audits, key=lambda a: (a.namespace, a.name)):
        by_namespace.setdefault(audit.namespace, []).extend(_results(audit))
    reports = []
    for namespace, results in sorted(by_namespace.items()):
        counts = Counter(r["result"] for r in results)
        reports.append(
            {
                "apiVersion": POLICY_REPORT_VERSION,
                "kind": "PolicyReport",
                "metadata": {
                    "name": "gpuwarden-audit",
                    "namespace": namespace,
                    "labels": {"app.kubernetes.io/managed-by": SOURCE},
                },
                "results": results,
                "summary": {k: counts[k] for k in ("pass", "fail", "warn", "error", "skip")},
            }
        )
    return {"apiVersion": "v1", "kind": "List", "items": reports}


def _unlabelled(audits: Sequence[PodAudit], cluster: ClusterView, policies: PolicySet) -> list[str]:
    """Namespaces whose labels are unknown while some tenant chooses namespaces by labels."""
    if not policies.selector_tenants:
        return []
    seen = sorted({a.namespace for a in audits} - set(cluster.namespace_labels))
    return [
        f"namespace {ns}: its labels are unknown, so no tenant's namespaceSelector chooses it; "
        "give --namespaces FILE (kubectl get namespaces -o yaml) or --cluster"
        for ns in seen
    ]


def _inputs(args: argparse.Namespace) -> tuple[list[Mapping[str, Any]], ClusterView]:
    if args.cluster:
        if args.files or args.namespaces:
            raise InputError(
                "--cluster reads the pods and namespaces itself: give no FILE or --namespaces"
            )
        try:
            snapshot = read_snapshot(api_client(args.kubeconfig))
        except (KubeConfigError, SnapshotError) as exc:
            raise InputError(str(exc)) from None
        try:
            view = manifests.cluster_view(snapshot.manifests, "the cluster")
        except manifests.ManifestError as exc:
            raise InputError(str(exc)) from None
        for line in snapshot.left_out:
            eprint(f"warning: {line}")
        return [*snapshot.pods, *snapshot.jobs], view
    if not args.files:
        raise InputError(
            "no pods given: name `kubectl get pods -A -o yaml` dumps, or use --cluster"
        )
    cluster = load_cluster([args.namespaces] if args.namespaces else [])
    return read_pod_files(args.files), cluster


def run(args: argparse.Namespace) -> int:
    policies = load_policies(args.policies)
    if policies is None:
        return 2
    try:
        pods, cluster = _inputs(args)
    except InputError as exc:
        eprint(f"error: {exc}")
        return 2
    audits = audit_pods(pods, policies, cluster)
    for line in _unlabelled(audits, cluster, policies):
        eprint(f"warning: {line}")
    if args.output == "json":
        sys.stdout.write(json.dumps(as_json(audits), indent=2) + "\n")
    elif args.output == "policyreport":
        sys.stdout.write(json.dumps(policy_reports(audits), indent=2) + "\n")
    else:
        sys.stdout.write(table(audits))
    return 1 if any(a.denied for a in audits) else 0
