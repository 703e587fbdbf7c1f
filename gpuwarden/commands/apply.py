"""`gpuwarden apply`: what the webhooks would do to pods, offline."""

from __future__ import annotations

import argparse
import difflib
import json
import sys

import yaml

from gpuwarden.commands._inputs import add_dry_run_arguments, eprint, load_dry_run
from gpuwarden.policy.admission.jobs import JobAdmission
from gpuwarden.policy.admission.pipeline import Admission

HELP = (
    "Show what gpuwarden would do to pods and Kubeflow jobs (the mutated object, the patch or a "
    "diff) and the verdict (each replica's, for a job)"
)


def register(parser: argparse.ArgumentParser) -> None:
    add_dry_run_arguments(parser)
    parser.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json", "patch", "diff", "pods"),
        default="yaml",
        help="the mutated pod or job (yaml, the default, or json), the JSON Patch the webhook "
        "would send, a diff, or (pods) the pods as admitted: for a job, the first pod of each "
        "replica as its controller creates it (the Training Operator's labels and name)",
    )
    parser.add_argument(
        "--show-denied",
        action="store_true",
        help="print a denied pod's output too (by default a denied pod prints nothing on "
        "stdout, so `gpuwarden apply ... | kubectl apply -f -` never creates it)",
    )


def dump_yaml(obj: object) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _verdict(result: Admission) -> str:
    decision = result.mutation
    how = f"profile {decision.profile} via {decision.rule}" if decision.profile else "untouched"
    return f"allowed ({how})" if result.allowed else f"denied: {result.validation.message}"


def run(args: argparse.Namespace) -> int:
    loaded = load_dry_run(args)
    if loaded is None:
        return 2
    policies, cluster, inputs = loaded.policies, loaded.cluster, loaded.pods
    denied = False
    pods: list[object] = []
    for item in inputs:
        result = item.admit(policies, cluster, default_action=args.enforcement_action)
        for line in result.warnings:
            eprint(f"warning: {item.label}: {line}")
        if isinstance(result, JobAdmission):
            # Each replica's decision, as its controller's pod will get it.
            for replica in result.replicas:
                eprint(f"{item.label} {replica.replica.name}: {_verdict(replica.admission)}")
            if not result.allowed:
                denied = True
                eprint(f"{item.label}: denied: {result.validation.message}")
        else:
            eprint(f"{item.label}: {_verdict(result)}")
            denied = denied or not result.allowed
        if not result.allowed and not args.show_denied:
            continue
        decision = result.mutation
        if args.output == "patch":
            sys.stdout.write(decision.patch_bytes().decode() + "\n")
        elif args.output == "diff":
            before = dump_yaml(dict(item.request.pod)).splitlines(keepends=True)
            after = dump_yaml(dict(result.pod)).splitlines(keepends=True)
            sys.stdout.writelines(
                difflib.unified_diff(
                    before, after, f"{item.source} (original)", f"{item.source} (mutated)"
                )
            )
        elif args.output == "pods" and isinstance(result, JobAdmission):
            pods += [dict(replica.admission.pod) for replica in result.replicas]
        else:
            pods.append(dict(result.pod))
    if args.output == "json" and pods:
        out = pods[0] if len(pods) == 1 else {"apiVersion": "v1", "kind": "List", "items": pods}
        sys.stdout.write(json.dumps(out, indent=2, sort_keys=False) + "\n")
    elif args.output in ("yaml", "pods"):
        sys.stdout.write("---\n".join(dump_yaml(pod) for pod in pods))
    return 1 if denied else 0
