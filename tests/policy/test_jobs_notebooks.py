"""Kubeflow Notebooks admitted at submit (issue 30): the Notebook decided as the pod its
controller's StatefulSet will create (``<name>-0``), denied with that pod's message, its
template and metadata mutated so the pod webhook finds nothing left to change, and the stop
annotation of the culler (and of gpuwarden's idle rule) never judged."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch
import pytest
from hypothesis import assume, given

from gpuwarden.policy import AdmissionRequest, ClusterView, PolicySet, admit, load_texts
from gpuwarden.policy.admission.jobs import admit_job
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.pod.jobs import notebooks
from gpuwarden.policy.pod.workloads import identify
from gpuwarden.policy.render.scope import job_needs_review

from .support import EXAMPLES, read_yaml
from .test_property import CLUSTER, FUZZ, POLICY_SETS, pods


def notebook(namespace: str = "tenant-a", gpus: str = "1") -> dict[str, Any]:
    nb: dict[str, Any] = read_yaml(EXAMPLES / "jobs" / "notebook.yaml")
    nb["metadata"]["namespace"] = namespace
    limits = nb["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    limits["nvidia.com/gpu"] = gpus
    return nb


def create(job: dict[str, Any], namespace: str = "tenant-a") -> AdmissionRequest:
    return AdmissionRequest("CREATE", namespace, job)


def predicted(job: dict[str, Any], namespace: str = "tenant-a") -> dict[str, Any]:
    (replica,) = jobs.replica_templates(job)
    return jobs.replica_pod(job, replica, namespace)


def test_the_predicted_pod_is_the_statefulsets_pod() -> None:
    """What notebook_controller.go (generateStatefulSet) and the StatefulSet controller
    (initIdentity) make of the example Notebook: the pod examples/notebook.yaml shows, but for
    what cannot be foretold (controller-revision-hash, the owner's uid)."""
    pod = predicted(notebook())
    real = read_yaml(EXAMPLES / "notebook.yaml")
    assert pod["metadata"]["name"] == "alice-jupyter-0"
    assert pod["metadata"]["labels"] == {
        k: v for k, v in real["metadata"]["labels"].items() if k != "controller-revision-hash"
    }
    # The server-type annotation holds "notebook": the controller does not copy it.
    assert "annotations" not in pod["metadata"] or pod["metadata"]["annotations"] == {}
    spec = pod["spec"]
    assert spec["hostname"] == real["spec"]["hostname"]
    assert spec["securityContext"] == {"fsGroup": 100}
    (container,) = spec["containers"]
    (real_container,) = real["spec"]["containers"]
    assert container["env"] == real_container["env"]
    assert container["ports"] == real_container["ports"]
    assert container["workingDir"] == "/home/jovyan"
    assert container["resources"] == real_container["resources"]
    # gpuwarden's workload detection reads both alike.
    assert identify(pod) == identify(real)
    found = identify(pod)
    assert found is not None
    assert (found.kind, found.name, found.container) == (
        "notebook",
        "alice-jupyter",
        "alice-jupyter",
    )


def test_what_the_notebook_sets_itself_the_controller_keeps() -> None:
    nb = notebook()
    nb["metadata"]["labels"] |= {"statefulset": "mine", "team": "vision"}
    nb["metadata"]["annotations"] |= {
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
        "notebooks.kubeflow.org/last-activity": "2026-12-04T10:00:00Z",
        notebooks.STOP_ANNOTATION: "2026-12-04T11:00:00Z",
        "owner": "alice",
    }
    spec = nb["spec"]["template"]["spec"]
    spec["securityContext"] = {"runAsUser": 1000}
    container = spec["containers"][0]
    container |= {"workingDir": "/work", "ports": [], "env": [{"name": "NB_PREFIX", "value": "/x"}]}
    pod = predicted(nb)
    labels = pod["metadata"]["labels"]
    assert (labels["statefulset"], labels["notebook-name"], labels["team"]) == (
        "mine",
        "alice-jupyter",
        "vision",
    )
    assert pod["metadata"]["annotations"] == {"owner": "alice"}
    assert pod["spec"]["securityContext"] == {"runAsUser": 1000}
    (got,) = pod["spec"]["containers"]
    assert (got["workingDir"], got["ports"], got["env"]) == (
        "/work",
        [],
        [{"name": "NB_PREFIX", "value": "/x"}],
    )


@pytest.mark.parametrize("version", ["v1", "v1beta1", "v1alpha1"])
def test_every_served_version_is_a_notebook(version: str) -> None:
    nb = notebook() | {"apiVersion": f"kubeflow.org/{version}"}
    assert jobs.job_kind(nb) is notebooks.NOTEBOOK
    assert jobs.kind_for("kubeflow.org", plural="notebooks") is notebooks.NOTEBOOK


def test_an_over_limit_notebook_is_denied_with_its_pods_message(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    nb = notebook("tenant-b", "8")
    result = admit_job(create(nb, "tenant-b"), default_policies, cluster)
    assert not result.allowed
    alone = admit(create(predicted(nb, "tenant-b"), "tenant-b"), default_policies, cluster)
    assert not alone.allowed
    assert result.validation.message == f"Notebook: {alone.validation.message}"
    assert "tenant tenant-b allows at most 2 per pod" in result.validation.message


def test_the_pod_of_the_mutated_notebook_needs_no_change(
    default_policies: PolicySet, cluster: ClusterView
) -> None:
    nb = notebook()
    result = admit_job(create(nb), default_policies, cluster)
    assert result.allowed
    mutated = jsonpatch.apply_patch(copy.deepcopy(nb), list(result.mutation.patch))
    assert mutated == result.pod
    # The pod's annotations go on the Notebook, which the controller copies onto the pod; the
    # template has no metadata (the CRD would prune it).
    assert mutated["metadata"]["annotations"]["gpuwarden.io/profile"] == "notebook"
    assert "metadata" not in mutated["spec"]["template"]
    assert mutated["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    pod = predicted(mutated)
    again = admit(create(pod), default_policies, cluster)
    assert again.allowed
    assert again.mutation.patch == ()
    (decided,) = result.replicas
    assert pod == decided.admission.pod


def env_unordered(pod: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The pod with its first container's variables apart, in no order: the controller appends
    NB_PREFIX after the variables gpuwarden set, the prediction before."""
    containers = list(pod["spec"]["containers"])
    env = containers[0].get("env") or []
    containers[0] = {k: v for k, v in containers[0].items() if k != "env"}
    return {**pod, "spec": {**pod["spec"], "containers": containers}}, sorted(map(str, env))


@pytest.mark.parametrize("policy_set", sorted(POLICY_SETS))
@FUZZ
@given(generated=pods())
def test_a_notebook_mutated_is_its_pod_mutated(
    policy_set: str, generated: tuple[str, dict[str, Any]]
) -> None:
    """Any pod's spec as a Notebook's template and its labels and annotations as the Notebook's:
    the patch applies, and the pod the controller makes of the mutated Notebook is the one the
    pod webhooks made (but for where NB_PREFIX sits among the variables gpuwarden appends),
    which they then leave alone."""
    policies = POLICY_SETS[policy_set]
    namespace, pod = generated
    containers = pod["spec"].get("containers")
    assume(isinstance(containers, list) and containers and isinstance(containers[0], dict))
    meta = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations")}
    nb = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": "fuzz", "namespace": namespace, **meta},
        "spec": {"template": {"spec": pod["spec"]}},
    }
    original = copy.deepcopy(nb)
    result = admit_job(create(nb, namespace), policies, CLUSTER)
    assert nb == original
    mutated = jsonpatch.apply_patch(copy.deepcopy(nb), list(result.mutation.patch))
    assert mutated == result.pod
    rebuilt = predicted(mutated, namespace)
    (decided,) = result.replicas
    assert env_unordered(rebuilt) == env_unordered(decided.admission.pod)
    again = admit(create(rebuilt, namespace), policies, CLUSTER)
    assert again.mutation.patch == ()


KEEP = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: gitops}
spec:
  backend: volcano
  profiles:
    - {name: lab, gpuShare: false, maxMemory: 80Gi, priority: 100}
  workloads:
    - {name: notebooks, match: {kind: notebook}, profile: lab}
  tenants:
    - {name: ml, namespaces: [ml], jobTemplates: keep, limits: {maxGpusPerPod: 2}}
"""


def test_keep_leaves_the_notebook_as_written() -> None:
    policies = load_texts([("gitops.yaml", KEEP)])
    nb = notebook("ml")
    before = copy.deepcopy(nb)
    result = admit_job(create(nb, "ml"), policies, ClusterView())
    assert result.allowed
    assert result.mutation.patch == ()
    assert result.pod == before
    assert "gpuwarden: Notebook: profile lab via rule/notebooks (tenant ml)" in (
        result.mutation.warnings
    )
    assert result.mutation.warnings[-1].startswith("gpuwarden: the Notebook is kept as written")
    denied = admit_job(create(notebook("ml", "8"), "ml"), policies, ClusterView())
    assert denied.validation.message.startswith("Notebook: gpuwarden denied the pod: ")


@pytest.mark.parametrize("stopping", [True, False])
def test_stopping_or_starting_a_notebook_is_never_judged(
    default_policies: PolicySet, cluster: ClusterView, stopping: bool
) -> None:
    """The culler and gpuwarden's idle rule stop a Notebook by its annotation, and the dashboard
    starts it by removing it (kubectl adds its last-applied annotation, the culler its
    last-activity): such an update is not judged, so not refused nor patched, even for a
    Notebook the policy would now deny (one stored before its tenant's limit was lowered)."""
    running = notebook("tenant-b", "8")
    stopped = copy.deepcopy(running)
    stopped["metadata"]["annotations"] |= {
        notebooks.STOP_ANNOTATION: "2026-12-04T23:00:00Z",
        "notebooks.kubeflow.org/last-activity": "2026-12-04T22:00:00Z",
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
    }
    old, new = (running, stopped) if stopping else (stopped, running)
    request = AdmissionRequest("UPDATE", "tenant-b", new, old_pod=old)
    result = admit_job(request, default_policies, cluster)
    assert result.allowed
    assert result.replicas == ()
    assert result.mutation.patch == ()
    # A change that reaches the pod is judged: a label the controller copies onto it.
    relabelled = copy.deepcopy(new)
    relabelled["metadata"]["labels"]["team"] = "vision"
    request = AdmissionRequest("UPDATE", "tenant-b", relabelled, old_pod=old)
    assert not admit_job(request, default_policies, cluster).allowed


def test_the_job_webhooks_see_gpu_notebooks_and_notebooks_gpuwarden_changed() -> None:
    nb = notebook()
    assert job_needs_review(nb)
    cpu = copy.deepcopy(nb)
    cpu["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    assert not job_needs_review(cpu)
    # gpuwarden's keys are on the Notebook itself, where the pod's metadata comes from.
    cpu["metadata"]["annotations"]["gpuwarden.io/profile"] = "light-training"
    assert job_needs_review(cpu)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (None, "Notebook has no spec"),
        ({"template": "x"}, "spec.template must be an object"),
        ({"template": {"spec": {"containers": []}}}, "spec.template.spec.containers must list"),
    ],
)
def test_a_notebook_that_cannot_be_read_is_refused_naming_the_field(
    default_policies: PolicySet, cluster: ClusterView, spec: Any, field: str
) -> None:
    nb = notebook()
    nb["spec"] = spec
    result = admit_job(create(nb), default_policies, cluster)
    assert not result.allowed
    assert result.validation.code == 400
    assert field in result.validation.message
