"""Katib: Experiments whose trials are batch Jobs, and the labels Katib puts on any trial's pods.

Sources: kubeflow/katib v0.19.0.
- A trial's Job is owned by its Trial (``kind: Trial``, ``apiVersion: kubeflow.org/v1beta1``,
  pkg/webhook/v1beta1/pod/const.go) and named as it
  (pkg/controller.v1beta1/trial/trial_controller.go, reconcileJob). Katib's pod webhook
  (pkg/webhook/v1beta1/pod/inject_webhook.go, Mutate; utils.go, mutatePodMetadata) copies the
  Trial's labels onto each pod (``katib.kubeflow.org/experiment`` among them) and adds
  ``katib.kubeflow.org/trial`` with the Trial's name; it also adds the metrics collector sidecar
  (``metrics-logger-and-collector``, or ``metrics-collector``), the ``KATIB_TRIAL_NAME``
  environment variable on the primary container, shareProcessNamespace and the metrics volume,
  none of which asks a GPU. The predicted pod of a job a Trial owns (a batch Job or a Training
  Operator job) carries the trial label; the Trial's own labels are not on the job and are not
  foretold.
- An Experiment (``kubeflow.org/v1beta1``) whose ``spec.trialTemplate.trialSpec`` is a batch Job
  is read as that Job's one template, at ``spec.trialTemplate.trialSpec.spec.template``. Katib
  makes each trial from it (pkg/controller.v1beta1/experiment/experiment_controller_util.go,
  createTrialInstance; manifest/generator.go, GetRunSpecWithHyperParameters: the
  ``${trialParameters.*}`` placeholders replaced, the Job named as the Trial,
  ``<experiment>-<8 random characters>``), and the Trial's labels are the Experiment's labels plus
  ``katib.kubeflow.org/experiment`` (pkg/controller.v1beta1/util/labels.go, TrialLabels), which
  Katib's pod webhook copies onto the pods. The predicted pod is that Job's, for a trial named
  ``<experiment>-trial``. A template whose resources are set by trial parameters is not judged
  here: each trial is, as Katib creates its Job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.policy.pod.jobs import batch
from gpuwarden.policy.pod.jobs.base import (
    JobKind,
    JobShapeError,
    ReplicaTemplate,
    TemplateSite,
    name_of,
)

GROUP = "kubeflow.org"
VERSION = "v1beta1"
TRIAL_KIND = "Trial"
TRIAL_API_VERSION = f"{GROUP}/{VERSION}"
TRIAL_LABEL = "katib.kubeflow.org/trial"
EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"
#: The name of the trial an Experiment's pods are predicted for.
TRIAL_STAND_IN = "{experiment}-trial"
_TRIAL_PARAMETER = "${trialParameters."
_TRIAL_SPEC = ("spec", "trialTemplate", "trialSpec")


def trial_of(job: Mapping[str, Any]) -> str | None:
    """The Katib Trial that owns ``job``, by name, or None."""
    meta = job.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for owner in owners if isinstance(owners, list) else ():
        if (
            isinstance(owner, Mapping)
            and owner.get("kind") == TRIAL_KIND
            and owner.get("apiVersion") == TRIAL_API_VERSION
            and isinstance(owner.get("name"), str)
        ):
            return str(owner["name"])
    return None


def trial_spec(experiment: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """An Experiment's ``spec.trialTemplate.trialSpec`` when it is a batch Job, else None (a
    trialSpec of another kind, or one in a ConfigMap, is judged as Katib creates each trial)."""
    spec = experiment.get("spec")
    template = spec.get("trialTemplate") if isinstance(spec, Mapping) else None
    trial = template.get("trialSpec") if isinstance(template, Mapping) else None
    if not isinstance(trial, Mapping):
        return None
    kind = (trial.get("apiVersion"), trial.get("kind"))
    if kind != (batch.BATCH_JOB.api_version, batch.BATCH_JOB.kind):
        return None
    return trial


def _parameterised(template: Mapping[str, Any]) -> bool:
    """Whether trial parameters set a container's resources, known only per trial."""
    spec = template.get("spec")
    for field in ("containers", "initContainers"):
        items = spec.get(field) if isinstance(spec, Mapping) else None
        for c in items if isinstance(items, list) else ():
            if isinstance(c, Mapping) and _TRIAL_PARAMETER in str(c.get("resources")):
                return True
    return False


@dataclass(frozen=True)
class ExperimentKind(JobKind):
    """Katib's Experiment, judged by its trial template where that is a batch Job."""

    group: str = GROUP
    version: str = VERSION
    kind: str = "Experiment"
    plural: str = "experiments"
    generate_name: bool = batch.BATCH_JOB.generate_name

    @property
    def sites(self) -> tuple[TemplateSite, ...]:
        return (
            TemplateSite(
                (*_TRIAL_SPEC, "spec", "template"),
                when=(((*_TRIAL_SPEC, "kind"), batch.BATCH_JOB.kind),),
            ),
        )

    def templates(self, job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
        if not isinstance(job.get("spec"), Mapping):
            raise JobShapeError(f"{self.kind} has no spec")
        trial = trial_spec(job)
        if trial is None:
            return ()
        spec = trial.get("spec")
        if not isinstance(spec, Mapping):
            raise JobShapeError("spec.trialTemplate.trialSpec has no spec")
        try:
            template = batch.template(spec)
        except JobShapeError as exc:
            raise JobShapeError(f"spec.trialTemplate.trialSpec.{exc}") from None
        if _parameterised(template.template):
            return ()
        return (
            ReplicaTemplate(
                "Trial",
                (*_TRIAL_SPEC, *template.path),
                template.template,
                None,
                template.replicas,
            ),
        )

    def pod_job(self, job: Mapping[str, Any]) -> Mapping[str, Any]:
        """The Job Katib creates for a trial: the trialSpec, named as a stand-in trial that
        owns it."""
        trial = trial_spec(job) or {}
        name = TRIAL_STAND_IN.format(experiment=name_of(job))
        owner = {"apiVersion": TRIAL_API_VERSION, "kind": TRIAL_KIND, "name": name}
        return {**trial, "metadata": {"name": name, "ownerReferences": [owner]}}

    def labels(self, job: Mapping[str, Any], replica: str, index: int) -> dict[str, str]:
        labels = batch.BATCH_JOB.labels(self.pod_job(job), replica, index)
        meta = job.get("metadata")
        own = meta.get("labels") if isinstance(meta, Mapping) else None
        labels |= {str(k): str(v) for k, v in (own if isinstance(own, Mapping) else {}).items()}
        labels[EXPERIMENT_LABEL] = name_of(job)
        return labels

    def pod_name(self, job: Mapping[str, Any], replica: str, index: int) -> str:
        return batch.BATCH_JOB.pod_name(self.pod_job(job), replica, index)


EXPERIMENT = ExperimentKind()
