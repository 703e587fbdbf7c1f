"""`gpuwarden lint`: validate policies and report risky settings; with ``--objects``, the
GPUPolicy objects served with them and what each one overrides in the files."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuwarden.commands._inputs import (
    InputError,
    add_policy_paths,
    eprint,
    list_items,
    load_policies,
    located_items,
    read_documents,
)
from gpuwarden.policy import PolicySet
from gpuwarden.policy.lint import (
    OBJECT_PREFIX,
    lint_errors,
    lint_findings,
    object_overrides,
    object_scope_warnings,
    object_tenant_namespace_warnings,
)
from gpuwarden.policy.pod import keys
from gpuwarden.policy.render.nodefit import (
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    gpu_nodes,
    node_fit_warnings,
)

if TYPE_CHECKING:
    from gpuwarden.policy.spec.composition import PolicyObject

HELP = (
    "Validate policy files; report errors (exit 1: invalid, or a tenant or rule that can never "
    "apply) and risky settings"
)


def register(parser: argparse.ArgumentParser) -> None:
    add_policy_paths(parser)  # PATH ... and/or -p PATH, into args.paths
    parser.add_argument(
        "--strict", action="store_true", help="Treat warnings as errors (not the info: notes)"
    )
    parser.add_argument(
        "--objects",
        action="append",
        default=[],
        metavar="PATH",
        help="GPUPolicy objects as the cluster holds them (`kubectl get gpupolicies -o yaml`, "
        "or their manifests; repeatable): lint them with the policy files as the webhook serves "
        "them, and show what each one overrides in the files (the files are the chart's "
        "policies)",
    )
    parser.add_argument(
        "--nodes",
        action="append",
        default=[],
        metavar="PATH",
        help="Nodes as the cluster holds them (`kubectl get nodes -o yaml`; repeatable): warn "
        "about profiles whose pods no node can hold (a GPU-memory reservation larger than the "
        "GPUs, more GPUs than a node has) and tenants whose maxGpusPerPod no node has (read "
        f"from GPU Feature Discovery's {GPU_MEMORY_LABEL} and {GPU_COUNT_LABEL} labels)",
    )


def run(args: argparse.Namespace) -> int:
    policies = load_policies(args.paths)
    if policies is None:
        return 1
    served = policies
    overrides: list[str] = []
    errors: list[str] = []
    warnings: list[str] = []
    try:
        # Only --objects needs the GPUPolicy reader (gpuwarden.kube), imported when given.
        objects = _read_objects(args.objects) if args.objects else {}
        nodes = _read_nodes(args.nodes)
    except InputError as exc:
        eprint(f"error: {exc}")
        return 1
    if args.objects:
        served, errors = _serve(policies, objects)
        overrides = object_overrides(policies, served)
        warnings = object_scope_warnings(policies, served)
        warnings += object_tenant_namespace_warnings(policies, served)
    errors += lint_errors(served)
    found, notes = lint_findings(served)
    warnings = found + warnings
    checked = 0
    if args.nodes:
        gpus = gpu_nodes(nodes)
        checked = len(gpus)
        if gpus:
            warnings += node_fit_warnings(served, gpus)
        else:
            notes.append(
                f"--nodes: none of the {len(nodes)} nodes given has {GPU_MEMORY_LABEL} or "
                f"{GPU_COUNT_LABEL} (GPU Feature Discovery's labels), so nothing was checked "
                "against them"
            )
    for line in errors:
        eprint(f"error: {line}")
    for line in warnings:
        eprint(f"warning: {line}")
    for line in notes:
        eprint(f"info: {line}")
    for line in overrides:
        print(f"override: {line}")
    profiles, rules, tenants = len(served.profiles), len(served.rules), len(served.tenants)
    counts = (
        f"{len(served.policies)} policies, {profiles} profiles, {rules} rules, "
        f"{tenants} tenants, {len(warnings)} warnings"
    )
    if notes:
        counts += f", {len(notes)} notes (info: what the nodes or namespaces must provide)"
    if args.objects:
        counts += f", {len(overrides)} overrides by GPUPolicy objects"
    if args.nodes:
        counts += f", {checked} GPU nodes checked"
    if errors:
        print(f"failed: {counts}, {len(errors)} errors")
        return 1
    print(f"ok: {counts}")
    return 1 if warnings and args.strict else 0


def _read_objects(sources: Sequence[str]) -> dict[str, PolicyObject]:
    """GPUPolicy objects by name, from manifests or a List (kubectl's ``-o yaml``)."""
    from gpuwarden.kube.gpupolicies import policy_object

    found: dict[str, PolicyObject] = {}
    for source in sources:
        for index, doc in enumerate(list_items(read_documents(source))):
            where = f"{source}: document {index + 1}"
            if not isinstance(doc, Mapping) or doc.get("kind") != keys.POLICY_KIND:
                kind = doc.get("kind") if isinstance(doc, Mapping) else type(doc).__name__
                raise InputError(f"{where}: not a {keys.POLICY_KIND} (kind {kind!r})")
            obj = policy_object(doc)
            if obj is None:
                raise InputError(f"{where}: a {keys.POLICY_KIND} object needs metadata.name")
            if obj.name in found:
                raise InputError(f"{where}: {OBJECT_PREFIX}{obj.name} is given twice")
            found[obj.name] = obj
    return found


def _read_nodes(sources: Sequence[str]) -> list[Mapping[str, Any]]:
    """Node objects, from manifests or a List (kubectl's ``-o yaml``)."""
    found: list[Mapping[str, Any]] = []
    for source in sources:
        for where, doc in located_items(source, read_documents(source)):
            if not isinstance(doc, Mapping) or doc.get("kind") != "Node":
                kind = doc.get("kind") if isinstance(doc, Mapping) else type(doc).__name__
                raise InputError(f"{where}: not a Node (kind {kind!r})")
            found.append(doc)
    return found


def _serve(files: PolicySet, objects: Mapping[str, PolicyObject]) -> tuple[PolicySet, list[str]]:
    """The set the webhook serves (gpuwarden.policy.spec.composition.compose: the files, then every
    object that can join them in name order), and an error for each object it would refuse."""
    from gpuwarden.policy.spec.composition import compose

    composed = compose(files, objects)
    errors = [
        f"{OBJECT_PREFIX}{name} is not served: "
        + "; ".join(
            line.removeprefix(f"{OBJECT_PREFIX}{name}: ") for line in verdict.message.splitlines()
        )
        for name, verdict in sorted(composed.verdicts.items())
        if not verdict.valid
    ]
    return composed.policies, errors
