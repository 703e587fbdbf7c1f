"""A KFP step's pod, built as KFP's compiler and driver build it from the compiled IR, gets the
profile the pipeline chose with gpuwarden.kfp.use_profile from the real webhook.

The pipeline is the documented one, as the kfp SDK compiles it (examples/kfp/pipeline.yaml,
which tests/pipelines holds equal to a fresh compile of examples/kfp/pipeline.py); the
pod carries the platform spec's labels, KFP's v2_component label and annotation, the launcher
runtime-role annotation, Argo's executor node name, and the container ``main`` with the
accelerator limit (gpuwarden.pipelines.ir cites the KFP sources for each).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuwarden.lab.cluster.webhookstack import WebhookStack, create_pod, pod_annotations
from gpuwarden.pipelines import read_ir, step_pod, steps_of

from .webhook import read_pod

COMPILED = Path(__file__).resolve().parents[2] / "examples" / "kfp" / "pipeline.yaml"


def _train_pod(namespace: str, *, labelled: bool) -> dict[str, object]:
    ir = read_ir(list(yaml.safe_load_all(COMPILED.read_text())), str(COMPILED))
    (train,) = [step for step in steps_of(ir) if step.name == "train"]
    if not labelled:
        train = type(train)(**{**train.__dict__, "labels": {}})
    return step_pod(ir, train, namespace)


def test_the_webhook_gives_the_step_the_profile_the_pipeline_chose(gpuwarden: WebhookStack) -> None:
    ns = gpuwarden.tenant_namespace(name="tenant-a")
    # Without the label the same step is placed by the task-name rule (train*: kfp-training, 8
    # GPUs in tenant-a); a server-side dry run, so tenant-a's GPU memory quota stays unspent.
    unlabelled = _train_pod(ns, labelled=False)
    rule = create_pod(gpuwarden.api, unlabelled, dry_run=True)
    assert pod_annotations(rule.pod)["gpuwarden.io/profile"] == "kfp-training"
    pod = _train_pod(ns, labelled=True)
    assert pod["metadata"]["labels"]["gpuwarden.io/profile"] == "light-training"  # type: ignore[index]
    created = create_pod(gpuwarden.api, pod)
    stored = read_pod(gpuwarden.api, ns, created.pod["metadata"]["name"])
    assert pod_annotations(stored)["gpuwarden.io/profile"] == "light-training"
    assert stored["metadata"]["labels"]["gpuwarden.io/profile"] == "light-training"
