"""The documented pipeline (examples/kfp/pipeline.py), compiled with the real kfp SDK (the tests
here run in the kfp extra's venv: `make kfp-test`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from kfp import compiler

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kfp" / "pipeline.py"
# The example compiled, checked in for what runs without kfp (the CLI's tests, the e2e suite).
COMPILED = ROOT / "examples" / "kfp" / "pipeline.yaml"
POLICIES = ROOT / "policies"


def example_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpuwarden_kfp_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_to(pipeline: Any, path: Path) -> list[Any]:
    """The IR documents kfp's compiler writes for ``pipeline`` (written to ``path``)."""
    compiler.Compiler().compile(pipeline, str(path))
    return list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
