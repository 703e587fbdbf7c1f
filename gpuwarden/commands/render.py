"""`gpuwarden render`: the cluster objects a policy set implies, checked against their schemas."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from gpuwarden.commands._inputs import InputError, load_policies, read_documents
from gpuwarden.policy.render.claims import with_claim_templates
from gpuwarden.policy.render.objects import Rendering, RenderOptions, quota_key_warnings, render
from gpuwarden.policy.spec.schema import SchemaError, crd_manifest, crd_yaml, policy_field_table

HELP = (
    "Print the PriorityClasses, tenant ResourceQuotas, Volcano Queues and the dra backend's "
    "ResourceClaimTemplates a policy set implies, "
    "with --kueue Kueue's queues too (or the GPUPolicy CRD, or the policy field table)."
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Newest schema set kubernetes-validate ships that is not newer than the clusters we test on.
DEFAULT_KUBERNETES_VERSION = "1.37"
# Kinds whose schema kubernetes-validate does not have: said, never silently passed.
UNCHECKED_KINDS = {
    "Queue": "Volcano's Queue CRD schema is not bundled",
    **{
        kind: "Kueue's CRD schemas are not bundled (tests check them against Kueue v0.17.0's)"
        for kind in ("ClusterQueue", "ResourceFlavor", "LocalQueue")
    },
}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies",
        "-p",
        action="append",
        metavar="PATH",
        help="policy file or directory; repeatable (not needed with --crd or --field-table)",
    )
    parser.add_argument(
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="format (default yaml)"
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--crd", action="store_true", help="print the GPUPolicy CustomResourceDefinition"
    )
    what.add_argument(
        "--field-table",
        action="store_true",
        help="print every GPUPolicy field as a Markdown table (docs/reference.md)",
    )
    parser.add_argument(
        "--no-priority-classes",
        action="store_true",
        help="leave out PriorityClasses (the Helm chart renders them itself)",
    )
    parser.add_argument("--no-quotas", action="store_true", help="leave out ResourceQuotas")
    parser.add_argument("--no-queues", action="store_true", help="leave out Volcano Queues")
    parser.add_argument(
        "--no-claim-templates",
        action="store_true",
        help="leave out the ResourceClaimTemplates of shared profiles on the dra backend",
    )
    parser.add_argument(
        "--kueue",
        action="store_true",
        help="also print Kueue objects: a ClusterQueue per tenant with a quota or queueSpec (one "
        "cohort), its GPU pools' ResourceFlavors and a LocalQueue 'default' per tenant namespace",
    )
    parser.add_argument(
        "--job-webhooks",
        action="store_true",
        help="with --kueue: the job webhooks run (the chart's webhook.jobs, on by default), so "
        "Training Operator jobs and Katib trials reach Kueue with their pod templates mutated to "
        "what the pods ask; without it, rules that rewrite those pods' GPUs are refused",
    )
    parser.add_argument(
        "--check-quotas",
        action="append",
        default=[],
        metavar="FILE",
        help="also lint ResourceQuotas and Kubeflow Profiles (spec.resourceQuotaSpec) in FILE "
        "for quota keys that are accepted but never charged; repeatable",
    )
    parser.add_argument(
        "--kubernetes-version",
        default=DEFAULT_KUBERNETES_VERSION,
        metavar="X.Y",
        help=f"schema version objects are validated against (default {DEFAULT_KUBERNETES_VERSION})",
    )


def _eprint(text: str) -> None:
    print(text, file=sys.stderr)


def _validator() -> Any | None:
    try:
        import kubernetes_validate
    except ImportError:
        return None
    return kubernetes_validate


def schema_problems(obj: Mapping[str, Any], version: str) -> list[str] | None:
    """What kubernetes-validate finds wrong with one object; None if it cannot check it."""
    validator = _validator()
    if validator is None:
        return None
    try:
        validator.validate(dict(obj), version, strict=True)
    except validator.SchemaNotFoundError:
        return None
    except validator.ValidationError as exc:
        where = ".".join(str(part) for part in exc.path) or "<root>"
        return [f"{where}: {exc.message}"]
    return []


def _label(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name", "?")
    if meta.get("namespace"):
        name = f"{meta['namespace']}/{name}"
    return f"{obj.get('kind')} {name}"


def validate_objects(objects: Sequence[Mapping[str, Any]], version: str) -> tuple[int, int]:
    """Validate each object, printing what is wrong or unchecked; (failed, unchecked) counts."""
    if _validator() is None:
        _eprint(
            "note: objects not schema-checked: kubernetes-validate is not installed "
            "(pip install kubernetes-validate)"
        )
        return 0, len(objects)
    failed = unchecked = 0
    for obj in objects:
        kind = str(obj.get("kind"))
        problems = None if kind in UNCHECKED_KINDS else schema_problems(obj, version)
        if problems is None:
            unchecked += 1
            why = UNCHECKED_KINDS.get(kind, f"kubernetes-validate has no schema for {kind}")
            _eprint(f"note: {_label(obj)} not schema-checked: {why}")
            continue
        for problem in problems:
            failed += 1
            _eprint(f"error: {_label(obj)} fails the Kubernetes {version} schema: {problem}")
    return failed, unchecked


def _lint_quota_file(source: str) -> list[str]:
    warnings: list[str] = []
    for index, doc in enumerate(read_documents(source), start=1):
        items = doc.get("items") if isinstance(doc, Mapping) and doc.get("kind") == "List" else None
        for obj in items if isinstance(items, list) else [doc]:
            if not isinstance(obj, Mapping):
                continue
            kind = obj.get("kind")
            spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
            assert isinstance(spec, Mapping)
            if kind == "ResourceQuota":
                hard = spec.get("hard")
            elif kind == "Profile":  # Kubeflow Profile (kubeflow.org/v1)
                quota = spec.get("resourceQuotaSpec")
                hard = quota.get("hard") if isinstance(quota, Mapping) else None
            else:
                continue
            if isinstance(hard, Mapping):
                where = f"{source}: document {index}: {_label(obj)}"
                warnings += quota_key_warnings(hard, where)
    return warnings


def _print_objects(rendering: Rendering, output: str) -> None:
    objects = list(rendering.objects)
    if output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
        return
    chunks: list[str] = []
    for obj in objects:
        text = yaml.safe_dump(obj, sort_keys=False, width=100)
        if obj.get("kind") == "Queue":
            text = (
                "# Volcano has no per-queue overcommit field; the overcommit factor is the\n"
                "# 'overcommit' scheduler plugin's 'overcommit-factor' argument (cluster-wide).\n"
                + text
            )
        chunks.append(text)
    sys.stdout.write("---\n" + "---\n".join(chunks) if chunks else "")


def run(args: argparse.Namespace) -> int:
    if args.field_table:
        sys.stdout.write(policy_field_table())
        return EXIT_OK
    if args.crd:
        try:
            crd = crd_manifest()
        except SchemaError as exc:
            _eprint(f"error: the policy model has no structural CRD schema: {exc}")
            return EXIT_FAILED
        failed, _ = validate_objects([crd], args.kubernetes_version)
        if failed:
            return EXIT_FAILED
        if args.output == "json":
            print(json.dumps(crd, indent=2))
        else:
            sys.stdout.write(crd_yaml())
        return EXIT_OK
    if not args.policies:
        _eprint("error: --policies PATH is required (unless --crd or --field-table)")
        return EXIT_USAGE
    policies = load_policies(args.policies)
    if policies is None:
        return EXIT_USAGE
    options = RenderOptions(
        priority_classes=not args.no_priority_classes,
        quotas=not args.no_quotas,
        queues=not args.no_queues,
        kueue=args.kueue,
        job_webhooks=args.job_webhooks,
    )
    rendering = render(policies, options)
    if not args.no_claim_templates:
        rendering = with_claim_templates(rendering, policies)
    for error in rendering.errors:
        _eprint(f"error: {error}")
    if rendering.errors:
        return EXIT_USAGE
    warnings = list(rendering.warnings)
    try:
        for source in args.check_quotas:
            warnings += _lint_quota_file(source)
    except InputError as exc:
        _eprint(f"error: {exc}")
        return EXIT_USAGE
    for warning in warnings:
        _eprint(f"warning: {warning}")
    for note in rendering.notes:
        _eprint(f"note: {note}")
    failed, _ = validate_objects(rendering.objects, args.kubernetes_version)
    if failed:
        _eprint("error: rendered objects failed their schemas; nothing printed")
        return EXIT_FAILED
    _print_objects(rendering, args.output)
    return EXIT_OK
