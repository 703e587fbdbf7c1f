"""`gpuwarden check-pipeline`: each step of a compiled KFP pipeline decided as the webhook would
decide its pod, before the run (no kfp needed: the IR YAML is read as it is)."""

from __future__ import annotations

import argparse
import sys

from gpuwarden.commands._inputs import (
    InputError,
    add_policies_option,
    eprint,
    load_cluster,
    load_policies,
    namespace_name,
    read_documents,
)
from gpuwarden.pipelines import IRError, check_steps, read_ir

HELP = "Check a compiled Kubeflow pipeline's GPU profiles and requests against the policies"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pipeline", metavar="PIPELINE", help="compiled pipeline YAML (- for stdin)")
    add_policies_option(parser)
    parser.add_argument(
        "--namespace",
        "-n",
        required=True,
        metavar="NS",
        help="the namespace the pipeline runs in (its Kubeflow Profile): it picks the tenant",
    )
    parser.add_argument(
        "--namespaces",
        metavar="FILE",
        help="Namespace manifests, as kubectl get -o yaml writes them: the namespace's labels, "
        "for tenants chosen by namespaceSelector",
    )


def run(args: argparse.Namespace) -> int:
    try:
        namespace = namespace_name(args.namespace)
    except InputError as exc:
        eprint(f"error: {exc}")
        return 2
    assert namespace is not None  # required
    policies = load_policies(args.policies)
    if policies is None:
        return 2
    try:
        cluster = load_cluster([args.namespaces] if args.namespaces else [])
        ir = read_ir(read_documents(args.pipeline), args.pipeline)
        check = check_steps(ir, policies, namespace, cluster)
    except (InputError, IRError) as exc:
        eprint(f"error: {exc}")
        return 2
    out = sys.stdout
    out.write(f"pipeline {check.pipeline} in namespace {namespace}\n")
    for step in check.steps:
        if step.ok:
            got = f"profile {step.profile}" if step.profile else "no profile (left untouched)"
            out.write(f"  ok       {step.step.label}: {got}\n")
        for problem in step.problems:
            out.write(f"  REFUSED  {problem}\n")
        for warning in step.warnings:
            out.write(f"  warning  {warning}\n")
    if not check.steps:
        out.write("  (no container steps)\n")
    return 0 if check.ok else 1
