"""The README's field table is generated from the policy model and must not drift from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _update_docs_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("update_docs", ROOT / "hack" / "update-docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_field_table_is_generated_from_the_model() -> None:
    docs = _update_docs_module()
    readme = (ROOT / "README.md").read_text()
    assert readme == docs.readme_with_table(readme), (
        "README.md's field table is stale: run `make docs`"
    )


def test_readme_field_table_covers_the_seed_fields() -> None:
    readme = (ROOT / "README.md").read_text()
    for field in ("gpuShare", "maxMemory", "overcommitRatio", "priority", "preemptible"):
        assert f"`spec.profiles[].{field}`" in readme


def test_chart_files_generated_from_the_model_are_current() -> None:
    docs = _update_docs_module()
    generated = docs.generated_files()
    names = {path.relative_to(ROOT).as_posix() for path in generated}
    assert {
        "charts/gpuwarden/values.schema.json",
        "charts/gpuwarden/files/gpupolicy.schema.json",
    } <= names
    for path, text in generated.items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run `make docs`"
