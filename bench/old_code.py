"""The code before a fix, for benchmarks that run old and new side by side: a git ref's files
extracted into a directory (``git archive``), each run then in its own process with that tree
first on ``PYTHONPATH``."""

from __future__ import annotations

import subprocess
import tarfile
from collections.abc import Sequence
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def before_adding(path: str) -> str:
    """The ref just before the commit that added ``path`` (the fix a benchmark shows)."""
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not added:
        raise SystemExit(f"no commit adds {path}; name the old code with --old REF")
    return added[-1] + "~1"


def extract(ref: str, into: Path, paths: Sequence[str] = ("gpuwarden",)) -> Path:
    """``paths`` as they are at ``ref``, under ``into``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, *paths], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into
