"""Regenerate what the policy model generates: the README's field table and the chart's CRD."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuwarden.policy.schema import crd_yaml, policy_field_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CRD = ROOT / "charts" / "gpuwarden" / "crds" / "gpupolicies.gpuwarden.io.yaml"
START, END = "<!-- fields:start -->", "<!-- fields:end -->"


def readme_with_table(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{policy_field_table().rstrip()}\n{END}{tail}"


def main() -> int:
    README.write_text(readme_with_table(README.read_text()))
    CRD.write_text(crd_yaml())
    print(f"updated {README.relative_to(ROOT)} and {CRD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
