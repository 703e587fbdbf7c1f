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
- An Experiment (``kubeflow.org/v1beta1``) whose ``spec.trialTemplate.trialSpec`` is a batch
  Job, a Training Operator job or a Trainer TrainJob is read as that job's replicas, under
  ``spec.trialTemplate.trialSpec``. Katib makes each trial from it
  (pkg/controller.v1beta1/experiment/experiment_controller_util.go, createTrialInstance;
  manifest/generator.go, GetRunSpecWithHyperParameters: the ``${trialParameters.*}``
  placeholders replaced, the job named as the Trial, ``<experiment>-<8 random characters>``) and
  creates it as it is, owned by the Trial (trial/trial_controller.go, getDesiredJobSpec: only
  the controller reference is set), so its controller's pods are those of any such job. The
  Trial's labels are the Experiment's labels plus ``katib.kubeflow.org/experiment``
  (pkg/controller.v1beta1/util/labels.go, TrialLabels), which Katib's pod webhook copies onto the
  pods of every job the Trial owns (utils.go, mutatePodMetadata, before it looks for the primary
  pod). The predicted pods are that job's, for a trial named ``<experiment>-trial``. A batch
  Job's one replica is called ``Trial``; a Training Operator job's keep their names (``Worker``).
  A template whose resources are set by trial parameters is not judged here: each trial is, as
  Katib creates its job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuwarden.policy.pod.jobs import batch, trainer, trainingoperator
from gpuwarden.policy.pod.jobs.base import (
    JobKind,
    JobShapeError,
    ReplicaTemplate,
    TemplateSite,
    metadata_of,
    name_of,
    string_map,
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
_TRIAL_SPEC_POINTER = "/" + "/".join(_TRIAL_SPEC)
#: The kinds of trialSpec judged at submit, by apiVersion and kind.
TRIAL_KINDS: Mapping[tuple[str, str], JobKind] = {
    (k.api_version, k.kind): k for k in (batch.BATCH_JOB, *trainingoperator.KINDS, trainer.TRAINJOB)
}


def trial_of(job: Mapping[str, Any]) -> str | None:
    """The Katib Trial that owns ``job``, by name, or None."""
    owners = metadata_of(job).get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if (
            isinstance(owner, Mapping)
            and owner.get("kind") == TRIAL_KIND
            and owner.get("apiVersion") == TRIAL_API_VERSION
            and isinstance(owner.get("name"), str)
        ):
            return str(owner["name"])
    return None


def trial_spec(experiment: Mapping[str, Any]) -> tuple[Mapping[str, Any], JobKind] | None:
    """An Experiment's ``spec.trialTemplate.trialSpec`` and its kind when it is one of
    :data:`TRIAL_KINDS`, else None (a trialSpec of another kind, or one in a ConfigMap, is judged
    as Katib creates each trial)."""
    spec = experiment.get("spec")
    template = spec.get("trialTemplate") if isinstance(spec, Mapping) else None
    trial = template.get("trialSpec") if isinstance(template, Mapping) else None
    if not isinstance(trial, Mapping):
        return None
    kind = TRIAL_KINDS.get((str(trial.get("apiVersion")), str(trial.get("kind"))))
    return None if kind is None else (trial, kind)


def _in_trial_spec(kind: JobKind, exc: JobShapeError) -> JobShapeError:
    """The trialSpec kind's error, naming the field from the Experiment's root."""
    text = str(exc)
    prefix = f"{kind.kind} has no "
    if text.startswith(prefix):
        return JobShapeError(f"spec.trialTemplate.trialSpec has no {text.removeprefix(prefix)}")
    return JobShapeError(f"spec.trialTemplate.trialSpec.{text}")


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
    """Katib's Experiment, judged by its trial template where that is a job kind gpuwarden
    reads (:data:`TRIAL_KINDS`)."""

    group: str = GROUP
    version: str = VERSION
    kind: str = "Experiment"
    plural: str = "experiments"
    generate_name: bool = batch.BATCH_JOB.generate_name

    @property
    def sites(self) -> tuple[TemplateSite, ...]:
        """Each trial kind's sites under the trialSpec, guarded by the trialSpec's kind."""
        return tuple(
            replace(
                site,
                path=(*_TRIAL_SPEC, *site.path),
                when=(
                    ((*_TRIAL_SPEC, "kind"), kind.kind),
                    *(((*_TRIAL_SPEC, *path), value) for path, value in site.when),
                ),
                meta=(*_TRIAL_SPEC, *site.meta) if site.meta else (),
            )
            for kind in TRIAL_KINDS.values()
            for site in kind.sites
        )

    def _trial(self, job: Mapping[str, Any]) -> tuple[Mapping[str, Any], JobKind]:
        return trial_spec(job) or ({}, batch.BATCH_JOB)

    def templates(self, job: Mapping[str, Any]) -> tuple[ReplicaTemplate, ...]:
        if not isinstance(job.get("spec"), Mapping):
            raise JobShapeError(f"{self.kind} has no spec")
        found = trial_spec(job)
        if found is None:
            return ()
        trial, kind = found
        if not isinstance(trial.get("spec"), Mapping):
            raise JobShapeError("spec.trialTemplate.trialSpec has no spec")
        try:
            replicas = kind.templates(trial)
        except JobShapeError as exc:
            raise _in_trial_spec(kind, exc) from None
        if any(_parameterised(r.template) for r in replicas):
            return ()
        return tuple(
            replace(
                r,
                name="Trial" if kind is batch.BATCH_JOB else r.name,
                path=(*_TRIAL_SPEC, *r.path),
                twins=tuple((pod, _TRIAL_SPEC_POINTER + at) for pod, at in r.twins),
            )
            for r in replicas
        )

    def pod_job(self, job: Mapping[str, Any]) -> Mapping[str, Any]:
        """The job Katib creates for a trial: the trialSpec, named as a stand-in trial that
        owns it."""
        trial, _ = self._trial(job)
        name = TRIAL_STAND_IN.format(experiment=name_of(job))
        owner = {"apiVersion": TRIAL_API_VERSION, "kind": TRIAL_KIND, "name": name}
        return {**trial, "metadata": {"name": name, "ownerReferences": [owner]}}

    def generates_names(self, job: Mapping[str, Any]) -> bool:
        return self._trial(job)[1].generate_name

    def labels(self, job: Mapping[str, Any], replica: str, index: int) -> dict[str, str]:
        labels = self._trial(job)[1].labels(self.pod_job(job), replica, index)
        labels |= string_map(metadata_of(job).get("labels"))
        labels[EXPERIMENT_LABEL] = name_of(job)
        return labels

    def pod_name(self, job: Mapping[str, Any], replica: str, index: int) -> str:
        return self._trial(job)[1].pod_name(self.pod_job(job), replica, index)


EXPERIMENT = ExperimentKind()
