"""`gpuwarden apply`: what the webhooks would do to pods, offline."""

from __future__ import annotations

import argparse
import difflib
import json
import sys

import yaml

from gpuwarden.commands._inputs import add_dry_run_arguments, eprint, load_dry_run
from gpuwarden.policy import admit

HELP = "Show what gpuwarden would do to pods (the mutated pod, the patch or a diff) and the verdict"


def register(parser: argparse.ArgumentParser) -> None:
    add_dry_run_arguments(parser)
    parser.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json", "patch", "diff"),
        default="yaml",
        help="the mutated pod (yaml, the default, or json), the JSON Patch the webhook would "
        "send, or a diff of the pod",
    )
    parser.add_argument(
        "--show-denied",
        action="store_true",
        help="print a denied pod's output too (by default a denied pod prints nothing on "
        "stdout, so `gpuwarden apply ... | kubectl apply -f -` never creates it)",
    )


def dump_yaml(obj: object) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, allow_unicode=True)


def run(args: argparse.Namespace) -> int:
    loaded = load_dry_run(args)
    if loaded is None:
        return 2
    policies, cluster, inputs = loaded.policies, loaded.cluster, loaded.pods
    denied = False
    pods: list[object] = []
    for item in inputs:
        result = admit(item.request, policies, cluster, default_action=args.enforcement_action)
        for line in result.warnings:
            eprint(f"warning: {item.label}: {line}")
        decision = result.mutation
        how = f"profile {decision.profile} via {decision.rule}" if decision.profile else "untouched"
        if result.allowed:
            eprint(f"{item.label}: allowed ({how})")
        else:
            denied = True
            eprint(f"{item.label}: denied: {result.validation.message}")
            if not args.show_denied:
                continue
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
        else:
            pods.append(dict(result.pod))
    if args.output == "json" and pods:
        out = pods[0] if len(pods) == 1 else {"apiVersion": "v1", "kind": "List", "items": pods}
        sys.stdout.write(json.dumps(out, indent=2, sort_keys=False) + "\n")
    elif args.output == "yaml":
        sys.stdout.write("---\n".join(dump_yaml(pod) for pod in pods))
    return 1 if denied else 0
