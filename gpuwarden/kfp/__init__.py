"""GPU profiles for Kubeflow Pipelines authors (``pip install gpuwarden[kfp]``).

``use_profile(task, "light-training")`` asks for a profile for the step's pod; ``check_pipeline``
and ``compile_pipeline`` refuse, before the run starts, a profile the policies do not define or
a step the tenant's limits would deny, each problem naming the step and what to change.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import yaml

try:
    from kfp import compiler, kubernetes
    from kfp.dsl import PipelineTask
    from kfp.dsl.base_component import BaseComponent
except ImportError as exc:  # pragma: no cover: the extra is installed wherever tests run
    raise ImportError(
        "gpuwarden.kfp needs the kfp extra: pip install 'gpuwarden[kfp]' "
        "(gpuwarden check-pipeline checks a compiled pipeline without it)"
    ) from exc

from gpuwarden.pipelines import PipelineCheck, StepCheck, check_steps, read_ir
from gpuwarden.pipelines.ir import IRError
from gpuwarden.policy import ClusterView, PolicySet, load_paths
from gpuwarden.policy.pod.keys import PROFILE_LABEL

__all__ = [
    "PROFILE_LABEL",
    "IRError",
    "PipelineCheck",
    "Policies",
    "ProfileError",
    "StepCheck",
    "check_pipeline",
    "compile_pipeline",
    "use_profile",
]

Policies: TypeAlias = PolicySet | str | Path | Sequence[str | Path]
Pipeline: TypeAlias = BaseComponent | str | os.PathLike[str]


class ProfileError(ValueError):
    """The steps the policies would refuse; ``problems`` holds one line per step and cause."""

    def __init__(self, check: PipelineCheck) -> None:
        self.check = check
        self.problems = check.problems
        super().__init__(
            f"pipeline {check.pipeline} in namespace {check.namespace}: "
            f"{len(self.problems)} problem(s):\n" + "\n".join(f"  {p}" for p in self.problems)
        )


def use_profile(task: PipelineTask, profile: str) -> PipelineTask:
    """Ask for a gpuwarden profile for the task's pod: the label ``gpuwarden.io/profile``, set
    through kfp-kubernetes's ``add_pod_label`` (kfp/kubernetes/pod_metadata.py), which the
    compiler writes to the platform spec's ``podMetadata.labels``."""
    result: PipelineTask = kubernetes.add_pod_label(task, PROFILE_LABEL, profile)
    return result


def _policy_set(policies: Policies) -> PolicySet:
    if isinstance(policies, PolicySet):
        return policies
    if isinstance(policies, str | Path):
        return load_paths([policies])
    return load_paths(policies)


def _compiled(pipeline: BaseComponent, directory: str) -> Path:
    path = Path(directory) / "pipeline.yaml"
    compiler.Compiler().compile(pipeline, str(path))
    return path


def _check_file(
    path: Path, policies: PolicySet, namespace: str, namespace_labels: Mapping[str, str]
) -> PipelineCheck:
    documents: list[Any] = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    ir = read_ir(documents, str(path))
    cluster = ClusterView(namespace_labels={namespace: dict(namespace_labels)})
    return check_steps(ir, policies, namespace, cluster)


def check_pipeline(
    pipeline: Pipeline,
    *,
    policies: Policies,
    namespace: str,
    namespace_labels: Mapping[str, str] | None = None,
) -> PipelineCheck:
    """Each step decided as the webhook would decide its pod in ``namespace`` (whose labels a
    tenant's namespaceSelector may need); ProfileError where any step would be refused.

    ``pipeline`` is a ``@dsl.pipeline`` function or a compiled pipeline YAML; ``policies`` a
    PolicySet, or policy files and directories (``kubectl get gpupolicies -o yaml`` writes one).
    """
    policy_set = _policy_set(policies)
    labels = namespace_labels or {}
    if isinstance(pipeline, BaseComponent):
        with tempfile.TemporaryDirectory() as directory:
            check = _check_file(_compiled(pipeline, directory), policy_set, namespace, labels)
    else:
        check = _check_file(Path(pipeline), policy_set, namespace, labels)
    if not check.ok:
        raise ProfileError(check)
    return check


def compile_pipeline(
    pipeline: BaseComponent,
    package_path: str | os.PathLike[str],
    *,
    policies: Policies,
    namespace: str,
    namespace_labels: Mapping[str, str] | None = None,
) -> PipelineCheck:
    """``compiler.Compiler().compile(pipeline, package_path)``, written only where every step
    passes ``check_pipeline`` (ProfileError otherwise, and nothing written)."""
    policy_set = _policy_set(policies)
    with tempfile.TemporaryDirectory() as directory:
        compiled = _compiled(pipeline, directory)
        check = _check_file(compiled, policy_set, namespace, namespace_labels or {})
        if not check.ok:
            raise ProfileError(check)
        shutil.copyfile(compiled, package_path)
    return check
