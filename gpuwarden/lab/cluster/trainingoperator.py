"""The Kubeflow Training Operator v1 (``github.com/kubeflow/training-operator``) out of cluster
against a lab control plane, so the e2e suites see the pods its controllers really create.

``hack/build-tools.sh`` builds ``cmd/training-operator.v1`` into the tools cache; the CRDs come
from its module in Go's module cache (``manifests/base/crds``), never copied into this
repository. What running it off-cluster takes, from its v1.8.1 source:

* ``cmd/training-operator.v1/main.go``: ``--enable-scheme`` picks the controllers (all by
  default, each needing its CRD); ``--webhook-server-port``, ``--metrics-bind-address`` and
  ``--health-probe-bind-address`` move its listeners off the ports other processes hold.
* ``pkg/cert/cert.go``: the open-policy-agent cert-controller rotator keeps the webhook's
  certificate in the Secret ``training-operator-webhook-cert`` of the namespace named by
  ``MY_POD_NAMESPACE`` (which must exist, Secret included), and waits for the kubelet to mount
  that Secret at the fixed folder ``/tmp/k8s-webhook-server/serving-certs``. Here the Secret's
  keys are written into a folder of the control plane's work directory, bound at that path in
  the operator's private mount namespace. Its own validating webhook
  (``validator.training-operator.kubeflow.org``) is registered with no webhooks in it: the
  rotator is ready only once it has put its CA into that configuration, and the jobs are
  gpuwarden's to judge here.
"""

from __future__ import annotations

import base64
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.controlplane import ControlPlane, Process, free_ports
from gpuwarden.lab.cluster.kueue import go_module, install_crds
from gpuwarden.policy.pod.jobs import trainingoperator

MODULE = "github.com/kubeflow/training-operator"
#: The version hack/build-tools.sh builds (TRAINING_OPERATOR_VERSION there).
VERSION = "v1.8.1"
NAMESPACE = "training-operator-system"
#: pkg/cert/cert.go: the rotator's certificate folder, the Secret it keeps the CA in, and the
#: webhook configuration it injects the CA into.
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
SECRET = "training-operator-webhook-cert"
VALIDATOR = "validator.training-operator.kubeflow.org"
_CRD_DIR = Path("manifests/base/crds")
_HTTP_CONFLICT = 409


def crd_manifests(module: Path, plurals: Sequence[str]) -> list[dict[str, Any]]:
    """The operator's CRDs for ``plurals`` (``pytorchjobs``...), as its module ships them."""
    crds = []
    for plural in plurals:
        path = module / _CRD_DIR / f"kubeflow.org_{plural}.yaml"
        crds += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return crds


def private_cert_dir_argv(cert_dir: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` in a private mount namespace where CERT_DIR is ``cert_dir``."""
    script = 'mkdir -p "$2" && mount --bind "$1" "$2" && shift 2 && exec "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private"]
    return [*unshare, "--", "sh", "-c", script, "sh", str(cert_dir), str(CERT_DIR), *argv]


@dataclass
class TrainingOperator:
    """The Training Operator's manager on ``plane`` (started already): start() and stop() it."""

    plane: ControlPlane
    binary: Path
    schemes: Sequence[str] = ("pytorchjob",)
    startup_timeout: float = 60.0
    #: ``--gang-scheduler-name`` (main.go): ``volcano`` makes it create a Volcano PodGroup per
    #: job (its CRD must be served) and hold the pods until Volcano moves the group past Pending.
    gang_scheduler: str = ""

    def __post_init__(self) -> None:
        self._process: Process | None = None

    def start(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        workdir = self.plane.workdir / "training-operator"
        cert_dir = workdir / "serving-certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        api = self.plane.api_client()
        try:
            self._apply_crds(api, deadline)
            self._create_secret(api)
        finally:
            api.close()  # type: ignore[no-untyped-call]
        webhook_port, health_port = free_ports(2)
        argv = [
            "env",
            f"MY_POD_NAMESPACE={NAMESPACE}",
            f"KUBECONFIG={self.plane.kubeconfig_path}",
            str(self.binary),
            *(f"--enable-scheme={s}" for s in self.schemes),
            f"--webhook-server-port={webhook_port}",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{health_port}",
            *([f"--gang-scheduler-name={self.gang_scheduler}"] if self.gang_scheduler else []),
        ]
        self._process = self.plane.spawn("training-operator", private_cert_dir_argv(cert_dir, argv))
        api = self.plane.api_client()
        try:
            self._mount_secret(api, cert_dir, deadline)
        finally:
            api.close()  # type: ignore[no-untyped-call]

        def ready() -> bool:
            url = f"http://127.0.0.1:{health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                status: int = response.status
            return status == 200

        self.plane.poll("training-operator /readyz", ready, [self._process], deadline)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate(self.plane.stop_timeout)
            self._process = None

    def _apply_crds(self, api: k8s_client.ApiClient, deadline: float) -> None:
        # A CRD of that name from an earlier suite (a minimal one) makes way for the operator's.
        crds = crd_manifests(go_module(MODULE, VERSION), [f"{s}s" for s in self.schemes])
        install_crds(self.plane, api, crds, "the Training Operator's CRDs", deadline, replace=True)

    def _mount_secret(self, api: k8s_client.ApiClient, cert_dir: Path, deadline: float) -> None:
        """Write the Secret's keys into ``cert_dir`` once the rotator has filled it, as the
        kubelet's secret volume would."""
        core: Any = k8s_client.CoreV1Api(api)
        assert self._process is not None

        def filled() -> bool:
            data = core.read_namespaced_secret(SECRET, NAMESPACE).data or {}
            if not {"ca.crt", "tls.crt", "tls.key"} <= set(data):
                return False
            for key, value in data.items():
                (cert_dir / key).write_bytes(base64.b64decode(value))
            return True

        self.plane.poll("the operator's webhook certificate", filled, [self._process], deadline)

    def _create_secret(self, api: k8s_client.ApiClient) -> None:
        """The namespace, the (empty) Secret the certificate rotator fills and the (empty)
        webhook configuration it puts its CA into."""
        core: Any = k8s_client.CoreV1Api(api)
        admission: Any = k8s_client.AdmissionregistrationV1Api(api)
        for create, body in (
            (core.create_namespace, {"metadata": {"name": NAMESPACE}}),
            (lambda b: core.create_namespaced_secret(NAMESPACE, b), {"metadata": {"name": SECRET}}),
            (
                admission.create_validating_webhook_configuration,
                {"metadata": {"name": VALIDATOR}, "webhooks": []},
            ),
        ):
            try:
                create(body)
            except ApiException as exc:
                if exc.status != _HTTP_CONFLICT:
                    raise


def delete_jobs(api: k8s_client.ApiClient, plural: str = "pytorchjobs") -> None:
    """Delete every job of ``plural`` and every pod a Training Operator controller made (no
    garbage collector runs here to follow their owner references; unscheduled pods go at once),
    so that later suites find the tenants' quotas as they were."""
    objects: Any = k8s_client.CustomObjectsApi(api)
    core: Any = k8s_client.CoreV1Api(api)
    for job in objects.list_cluster_custom_object("kubeflow.org", "v1", plural)["items"]:
        meta = job["metadata"]
        objects.delete_namespaced_custom_object(
            "kubeflow.org", "v1", meta["namespace"], plural, meta["name"]
        )
    pods = core.list_pod_for_all_namespaces(label_selector=trainingoperator.JOB_NAME_LABEL).items
    for pod in pods:
        core.delete_namespaced_pod(
            pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
        )
