"""Regenerate what the policy model generates: the field table of docs/reference.md, the chart's
CRD, the chart's values.schema.json (which Helm checks `policies` against) and
files/gpupolicy.schema.json (which the chart's templates check policies given as YAML text
against), and templates/_scope.tpl (the fixed parts of the webhooks' matchConditions)."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuwarden.policy.render.scope import chart_template
from gpuwarden.policy.spec.schema import (
    crd_yaml,
    policy_document_schema,
    policy_field_table,
    schema_json,
    values_schema,
)

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"
CHART = ROOT / "charts" / "gpuwarden"
CRD = CHART / "crds" / "gpupolicies.gpuwarden.io.yaml"
VALUES_SCHEMA = CHART / "values.schema.json"
POLICY_SCHEMA = CHART / "files" / "gpupolicy.schema.json"
SCOPE_TEMPLATE = CHART / "templates" / "_scope.tpl"
START, END = "<!-- fields:start -->", "<!-- fields:end -->"


def with_field_table(text: str) -> str:
    """text (docs/reference.md) with the table between the markers generated anew."""
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{policy_field_table().rstrip()}\n{END}{tail}"


def generated_files() -> dict[Path, str]:
    """Every file generated from the model but docs/reference.md, with its content."""
    return {
        CRD: crd_yaml(),
        VALUES_SCHEMA: schema_json(values_schema()),
        POLICY_SCHEMA: schema_json(policy_document_schema()),
        SCOPE_TEMPLATE: chart_template(),
    }


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds it; whether it wrote."""
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def main() -> int:
    wanted = {REFERENCE: with_field_table(REFERENCE.read_text()), **generated_files()}
    written = [path for path, text in wanted.items() if write_if_changed(path, text)]
    if written:
        print("updated " + ", ".join(str(path.relative_to(ROOT)) for path in written))
    else:
        print(f"unchanged: {len(wanted)} generated files are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
