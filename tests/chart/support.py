"""Running the real helm binary on the chart, and reading what it renders."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpuwarden"
VALUES = Path(__file__).resolve().parent / "values"
RELEASE = "gw"
NAMESPACE = "gpu-system"
FULLNAME = f"{RELEASE}-gpuwarden"

# The e2e suite's tool loader (tools.env, or hack/build-tools.sh when it is missing).
sys.path.insert(0, str(REPO / "tests"))
from e2e.controlplane import ControlPlane, Tools, ToolsMissingError, build_tools  # noqa: E402


@cache
def helm() -> Path:
    try:
        return Tools.load().helm
    except ToolsMissingError:
        return build_tools(stdout=sys.stderr).helm


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(helm()), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


@dataclass(frozen=True)
class Rendering:
    objects: tuple[dict[str, Any], ...]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.all(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    def kinds(self) -> set[str]:
        return {obj["kind"] for obj in self.objects}


def helm_args(values: Sequence[str | Path] = (), sets: Mapping[str, str] = {}) -> list[str]:
    args: list[str] = []
    for item in values:
        path = Path(item)
        args += ["-f", str(path if path.is_absolute() else VALUES / path)]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return args


def template(
    values: Sequence[str | Path] = (),
    sets: Mapping[str, str] = {},
    set_files: Mapping[str, Path] = {},
) -> Rendering:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    args += helm_args(values, sets)
    for key, path in set_files.items():
        args += ["--set-file", f"{key}={path}"]
    return Rendering(tuple(_documents(run_helm(*args).stdout)))


def template_error(values: Sequence[str | Path] = (), sets: Mapping[str, str] = {}) -> str:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *helm_args(values, sets)]
    result = run_helm(*args, check=False)
    assert result.returncode != 0, "helm template was expected to fail"
    return result.stderr


def _documents(text: str) -> Iterable[dict[str, Any]]:
    for doc in yaml.safe_load_all(text):
        if doc:
            assert isinstance(doc, dict), doc
            yield doc


def values_files() -> list[str]:
    return sorted(path.name for path in VALUES.glob("*.yaml"))


def assert_restricted(context: Mapping[str, Any]) -> None:
    """A container securityContext that passes the restricted Pod Security Standard."""
    assert context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}


@contextmanager
def release_plane() -> Iterator[ControlPlane]:
    """A bare control plane (etcd + kube-apiserver) with the release namespace created."""
    try:
        tools = Tools.load()
    except ToolsMissingError:
        tools = build_tools()
    with ControlPlane(tools) as control_plane:
        control_plane.kubectl("create", "namespace", NAMESPACE)
        yield control_plane
