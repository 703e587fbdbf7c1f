"""`gpuwarden lint`: validate policies and report risky settings."""

from __future__ import annotations

import argparse

from gpuwarden.commands._inputs import eprint, load_policies
from gpuwarden.policy.lint import lint_warnings

HELP = "Validate policy files; report errors (exit 1) and risky settings"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Policy files or directories")
    parser.add_argument("--strict", action="store_true", help="Treat warnings as errors")


def run(args: argparse.Namespace) -> int:
    policies = load_policies(args.paths)
    if policies is None:
        return 1
    warnings = lint_warnings(policies)
    for line in warnings:
        eprint(f"warning: {line}")
    profiles, rules, tenants = len(policies.profiles), len(policies.rules), len(policies.tenants)
    print(
        f"ok: {len(policies.policies)} policies, {profiles} profiles, {rules} rules, "
        f"{tenants} tenants, {len(warnings)} warnings"
    )
    return 1 if warnings and args.strict else 0
