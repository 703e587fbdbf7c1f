"""From a review of a Kubeflow job (PyTorchJob and its kin) to the policy core's answer."""

from __future__ import annotations

import re

from gpuwarden.policy import ClusterView, Decision, PolicySet
from gpuwarden.policy.admission.jobs import admit_job, unreadable_job
from gpuwarden.policy.admission.twins import job_field
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.pod.resources import reaches_accelerator
from gpuwarden.policy.spec.model import EnforcementAction
from gpuwarden.webhook.podshape import ShapeError, check_pod
from gpuwarden.webhook.review import Review, ReviewError

_POD_FIELD = re.compile(r"^request\.object\.(\S+)")


def _check_twins(pod: dict[str, object], twins: tuple[tuple[str, str], ...]) -> None:
    """check_pod on a pod built from the job's own fields, its error naming the job's field."""
    try:
        check_pod(pod, "request.object")
    except ShapeError as exc:
        found = _POD_FIELD.match(str(exc))
        field = job_field(twins, found.group(1)) if found else None
        if found is None or field is None:
            raise
        raise ShapeError(f"request.object.{field}{str(exc)[found.end() :]}") from None


def decide_job(
    mutating: bool,
    review: Review,
    policies: PolicySet | None,
    cluster: ClusterView,
    refusal: Decision | None,
    *,
    default_action: EnforcementAction = "enforce",
) -> Decision:
    """The decision for one review of a job: each replica decided as the pod its controller
    will create (gpuwarden/policy/admission/jobs.py). ``refusal``: the answer, as for a GPU
    pod, while no policy is loaded or the namespace could not be read (jobs whose pods ask for
    no GPU then go ahead unchanged); None when the policies can decide."""
    if review.operation not in ("CREATE", "UPDATE") or review.sub_resource:
        return Decision()
    job = review.obj
    if job is None:
        raise ReviewError(f"request.object is missing for a {review.operation} of a {review.kind}")
    kind = str(job.get("kind") or review.kind)
    try:
        replicas = jobs.replica_templates(job)
        pods = [jobs.replica_pod(job, r, review.namespace) for r in replicas]
        for replica, pod in zip(replicas, pods, strict=True):
            if replica.twins:
                _check_twins(pod, replica.twins)
            else:
                check_pod(pod, f"request.object.{'.'.join(replica.path)}")
    except (jobs.JobShapeError, ShapeError) as exc:
        return unreadable_job(kind, str(exc))
    if refusal is not None:
        return refusal if any(reaches_accelerator(pod) for pod in pods) else Decision()
    assert policies is not None
    admission = admit_job(
        review.admission_request(), policies, cluster, default_action=default_action
    )
    return admission.mutation if mutating else admission.validation
