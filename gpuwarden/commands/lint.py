"""`gpuwarden lint`: validate policies and report risky settings."""

from __future__ import annotations

import argparse

from gpuwarden.commands._inputs import add_policy_paths, eprint, load_policies
from gpuwarden.policy.lint import lint_errors, lint_warnings

HELP = (
    "Validate policy files; report errors (exit 1: invalid, or a tenant or rule that can never "
    "apply) and risky settings"
)


def register(parser: argparse.ArgumentParser) -> None:
    add_policy_paths(parser)  # PATH ... and/or -p PATH, into args.paths
    parser.add_argument("--strict", action="store_true", help="Treat warnings as errors")


def run(args: argparse.Namespace) -> int:
    policies = load_policies(args.paths)
    if policies is None:
        return 1
    errors = lint_errors(policies)
    warnings = lint_warnings(policies)
    for line in errors:
        eprint(f"error: {line}")
    for line in warnings:
        eprint(f"warning: {line}")
    profiles, rules, tenants = len(policies.profiles), len(policies.rules), len(policies.tenants)
    counts = (
        f"{len(policies.policies)} policies, {profiles} profiles, {rules} rules, "
        f"{tenants} tenants, {len(warnings)} warnings"
    )
    if errors:
        print(f"failed: {counts}, {len(errors)} errors")
        return 1
    print(f"ok: {counts}")
    return 1 if warnings and args.strict else 0
