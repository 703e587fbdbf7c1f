"""`gpuwarden explain`: which tenant, rule and profile a pod gets, and why the others did not match."""

from __future__ import annotations

import argparse
import sys
from typing import Protocol

from gpuwarden.commands._inputs import PodInput, add_dry_run_arguments, load_dry_run
from gpuwarden.policy import AdmissionRequest, ClusterView, PolicySet, admit
from gpuwarden.policy.admission.jobs import admit_job
from gpuwarden.policy.admission.placement import place
from gpuwarden.policy.pod.quantity import format_bytes
from gpuwarden.policy.spec.model import EnforcementAction
from gpuwarden.policy.spec.precedence import beaten_tenants

HELP = (
    "Explain which tenant, rule and profile a pod (or each replica of a Kubeflow job) gets, and "
    "why other rules did not match"
)


def register(parser: argparse.ArgumentParser) -> None:
    add_dry_run_arguments(parser, metavar="POD")


class Writer(Protocol):
    def write(self, text: str, /) -> int: ...


def _explain_pod(
    out: Writer,
    request: AdmissionRequest,
    policies: PolicySet,
    cluster: ClusterView,
    default_action: EnforcementAction,
) -> bool:
    """Explain one pod's placement and verdict; whether it is denied."""
    denied = False
    placement = place(
        request.pod, request.namespace, cluster.labels_for(request.namespace), policies
    )
    result = admit(request, policies, cluster, default_action=default_action)
    out.write(f"  tenant:   {placement.tenant_reason}\n")
    labels = cluster.labels_for(request.namespace)
    for line in beaten_tenants(policies.tenants, request.namespace, labels):
        out.write(f"            {line}\n")
    workload = placement.workload
    out.write(
        f"  workload: {workload.describe() + ' [' + workload.evidence + ']' if workload else 'not a Kubeflow workload'}\n"
    )
    out.write("  rules:\n")
    for name, verdict, lost in placement.outcomes:
        mark = "  -  " if not verdict.matched else "LOST " if lost else "MATCH"
        why = f"{verdict.reason}; {lost}" if lost else verdict.reason
        out.write(f"    {mark} {name}: {why}\n")
    if not placement.outcomes:
        out.write("    (no rule was tried)\n")
    profile = placement.profile
    if profile is None:
        what = {"skip": "untouched (the rule says skip)", "label": "none"}.get(
            placement.source, "none: the pod is left untouched"
        )
        out.write(f"  profile:  {what}\n")
    else:
        cap = format_bytes(profile.max_memory) if profile.max_memory is not None else "-"
        out.write(f"  profile:  {profile.name} via {placement.origin} (policy {profile.policy})\n")
        out.write(
            f"            {'shared' if profile.gpu_share else 'exclusive'}, cap {cap}, "
            f"overcommit {profile.overcommit_ratio:g}, backend {profile.backend.type}, "
            f"priority {profile.priority_class_name}={profile.priority}\n"
        )
        if profile.overridden:
            out.write(f"            tenant overrides: {', '.join(profile.overridden)}\n")
        out.write(f"  containers: {', '.join(placement.containers) or '-'}\n")
        for granted in placement.container_grants:
            out.write(f"  gpus:     {granted.name} {granted.gpus}: {granted.count_reason()}\n")
    for problem in placement.problems:
        out.write(f"  problem:  {problem}\n")
    out.write(f"  changes:  {len(result.mutation.patch)} patch operation(s)\n")
    # What the API server would show the user: the backend's limits, caps and reservations.
    for line in result.mutation.warnings:
        out.write(f"  warning:  {line.removeprefix('gpuwarden: ')}\n")
    would_deny = result.validation.audit_annotations.get("would-deny-message")
    if result.allowed and would_deny:
        # Under audit or dryrun: admitted, and what enforcing would have said.
        action = policies.action_for(result.validation.tenant, default_action)
        out.write(f"  verdict:  allowed ({action}); enforced: {would_deny}\n")
    elif result.allowed:
        out.write("  verdict:  allowed\n")
    else:
        denied = True
        out.write(f"  verdict:  denied: {result.validation.message}\n")
    return denied


def _explain_job(
    out: Writer,
    item: PodInput,
    policies: PolicySet,
    cluster: ClusterView,
    default_action: EnforcementAction,
) -> bool:
    """Explain each replica of a job as the pod its controller will create; whether the job is
    denied."""
    result = admit_job(item.request, policies, cluster, default_action=default_action)
    out.write(f"{item.request.pod.get('kind')} {item.label} ({item.source})\n")
    for replica in result.replicas:
        pod = replica.pod
        meta = pod["metadata"]
        # A batch Job's pods are named by generateName (<job>-<random>).
        name = meta.get("name") or f"{meta.get('generateName', '')}<random>"
        out.write(f"  replica {replica.replica.name}: pod {name}\n")
        request = item.request._replace(operation="CREATE", pod=pod, old_pod=None)
        _explain_pod(_Indented(out), request, policies, cluster, default_action)
    out.write(f"  changes:  {len(result.mutation.patch)} patch operation(s) to the job\n")
    if result.allowed:
        out.write("  verdict:  allowed\n")
        return False
    out.write(f"  verdict:  denied: {result.validation.message}\n")
    return True


class _Indented:
    """A writer that indents every line it is given by two spaces (a replica inside its job)."""

    def __init__(self, out: Writer) -> None:
        self.out = out

    def write(self, text: str) -> int:
        return self.out.write("  " + text)


def run(args: argparse.Namespace) -> int:
    loaded = load_dry_run(args)
    if loaded is None:
        return 2
    policies, cluster, inputs = loaded.policies, loaded.cluster, loaded.pods
    out = sys.stdout
    denied = False
    for item in inputs:
        if item.is_job:
            denied = _explain_job(out, item, policies, cluster, args.enforcement_action) or denied
            continue
        out.write(f"pod {item.label} ({item.source})\n")
        denied = (
            _explain_pod(out, item.request, policies, cluster, args.enforcement_action) or denied
        )
    return 1 if denied else 0
