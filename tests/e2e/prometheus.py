"""Prometheus's binaries from hack/build-tools.sh (PROMTOOL=, PROMETHEUS= in tools.env).

Tools.load reads only the control plane's lines; these two are read here, and built by the
script where they are missing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .controlplane import build_tools, cache_dir


def _recorded(key: str) -> Path | None:
    env = cache_dir() / "tools.env"
    for line in env.read_text().splitlines() if env.is_file() else []:
        name, _, value = line.partition("=")
        path = Path(value.strip())
        if name.strip() == key and path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def built_tool(key: str) -> Path:
    """The binary tools.env records under ``key`` (running hack/build-tools.sh if it is not)."""
    found = _recorded(key)
    if found is None:
        build_tools(stdout=sys.stderr)
        found = _recorded(key)
    assert found is not None, f"hack/build-tools.sh recorded no {key}= in tools.env"
    return found
