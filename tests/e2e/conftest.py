"""The e2e suite's own hook; its fixtures live in fixtures.py and reach every suite from tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

_E2E_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/e2e is e2e, so `-m "not e2e"` never starts a control plane."""
    for item in items:
        if _E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
