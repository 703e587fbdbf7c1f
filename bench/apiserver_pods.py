"""The pods bench/apiserver.py creates: the Kubeflow examples bench/kyverno mirrors, a profile
namespace's mix, copies in the control namespace, numbered copies for the offline CLIs."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

EXAMPLES = ROOT / "examples"

NAMESPACES_FILE = EXAMPLES / "namespaces.yaml"

DEFAULT_POLICIES = ROOT / "policies"

#: Both webhook configurations leave kube-system out (their namespaceSelectors): pods created
#: there while a webhook is registered are the control runs, interleaved with the webhook's.
CONTROL_NAMESPACE = "kube-system"

Obj = dict[str, Any]

# The examples bench/kyverno/ mirrors rule for rule; newer ones (Workspaces, LLMInferenceService,
# the Trainer launcher) have no Kyverno counterpart to compare against.
MIRRORED_EXAMPLES = (
    "katib-trial",
    "kfp-driver",
    "kfp-train-step",
    "kserve-predictor",
    "notebook",
    "pytorchjob-worker",
    "trainjob-node",
)


def example_pods() -> list[Obj]:
    """The seven Kubeflow example pods that bench/kyverno mirrors, in their tenant namespaces."""
    pods: list[Obj] = []
    for path in (EXAMPLES / f"{name}.yaml" for name in MIRRORED_EXAMPLES):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "Pod":
                pods.append(doc)
    if not pods:
        raise SystemExit(f"no Pod manifests in {EXAMPLES}")
    return pods


def mix_pods() -> dict[str, list[Obj]]:
    """A Kubeflow profile namespace's pods by class, in tenant-a.

    cpu: pods the default policy cannot change (a web server, a CPU notebook, a CPU KServe
    predictor), which the chart's matchConditions keep away from gpuwarden; kfp-cpu: a KFP run's
    driver and a CPU step, which are sent (the default policy gives pipeline steps GPUs by task
    name); gpu: GPU pods (a training step, a notebook, a predictor).
    """
    plain = yaml.safe_load((DEFAULT_POLICIES / "tests" / "pods" / "plain-web.yaml").read_text())
    examples = {name: yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text()) for name in (
        "kfp-driver", "kfp-train-step", "notebook", "kserve-predictor")}  # fmt: skip

    def without_gpus(pod: Obj, name: str) -> Obj:
        copied: Obj = json.loads(json.dumps(pod))
        copied["metadata"]["name"] = name
        for container in copied["spec"]["containers"]:
            for section in ("limits", "requests"):
                values = (container.get("resources") or {}).get(section) or {}
                for key in [k for k in values if k.startswith("nvidia.com/")]:
                    del values[key]
        return copied

    classes = {
        "cpu": [
            plain,
            without_gpus(examples["notebook"], "cpu-notebook-0"),
            without_gpus(examples["kserve-predictor"], "cpu-predictor-0"),
        ],
        "kfp-cpu": [
            examples["kfp-driver"],
            without_gpus(examples["kfp-train-step"], "cpu-step-0"),
        ],
        "gpu": [examples["kfp-train-step"], examples["notebook"], examples["kserve-predictor"]],
    }
    return {name: in_namespace(pods, "tenant-a") for name, pods in classes.items()}


def namespace_manifests() -> list[Obj]:
    return [
        doc
        for doc in yaml.safe_load_all(NAMESPACES_FILE.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "Namespace"
    ]


def in_namespace(pods: Sequence[Obj], namespace: str) -> list[Obj]:
    """Copies of ``pods`` in ``namespace``."""
    out = copy.deepcopy(list(pods))
    for pod in out:
        pod["metadata"]["namespace"] = namespace
    return out


def numbered_pods(pods: Sequence[Obj], count: int) -> list[Obj]:
    """``count`` pods, the examples in turn, each with a unique name."""
    out: list[Obj] = []
    for i in range(count):
        pod = copy.deepcopy(pods[i % len(pods)])
        meta = pod["metadata"]
        suffix = f"-{i:05d}"
        meta["name"] = str(meta["name"])[: 63 - len(suffix)] + suffix
        out.append(pod)
    return out
