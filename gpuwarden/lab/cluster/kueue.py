"""Kueue (``sigs.k8s.io/kueue``) out of cluster against a lab control plane.

``hack/build-tools.sh`` builds Kueue's manager (``cmd/kueue``) into the tools cache; its CRDs and
webhook manifests come from the same module in Go's module cache (``go mod download``), so the
API the binary serves and the schemas the API server enforces are one version's.

How it runs here, and why:

* A Configuration file (``config.kueue.x-k8s.io/v1beta2``) in the control plane's work
  directory: no leader election, ``internalCertManagement.enable: false`` (Kueue's own
  certificate management writes a Secret and injects CA bundles for an in-cluster Service),
  the webhook server on 127.0.0.1 with a serving certificate from :mod:`gpuwarden.certs`, the
  health probes on 127.0.0.1, metrics off, plain pods as the one integration, and the
  ``VisibilityOnDemand`` feature gate off (its API server would want an APIService and a port).
  The rest is :func:`gpuwarden.policy.render.kueue.configuration_requirements`, what the
  rendered queues rely on.
* Webhooks registered by URL (``https://127.0.0.1:<port><path>``) from the module's
  ``config/components/webhook/manifests.yaml``: Kueue's own kinds and the pod webhooks, with the
  ``kube-system`` exclusion its kustomization adds to the pod webhooks.
* With internal certificate management off, ``cmd/kueue/main.go`` loads a metrics serving
  certificate from the fixed path ``/etc/kueue/metrics/certs`` (tls.crt, tls.key) whether or
  not metrics are served, and exits when it is missing; no flag or Configuration field moves it.
  Kueue therefore runs in a private mount namespace (``unshare --mount``; as a non-root user
  also ``--user --map-root-user``) in which ``/etc`` is a read-only overlay of a work-directory
  folder holding ``kueue/metrics/certs`` over the host's ``/etc``. Nothing is written to the
  host's ``/etc``, and no other process sees the overlay.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.certs.loopback import loopback_serving
from gpuwarden.lab.cluster.controlplane import (
    ControlPlane,
    Process,
    Tools,
    ToolsMissingError,
    free_ports,
)
from gpuwarden.policy.render.kueue import KUEUE_API, configuration_requirements

KUEUE_MODULE = "sigs.k8s.io/kueue"
#: The version hack/build-tools.sh builds (KUEUE_VERSION there).
KUEUE_VERSION = "v0.17.0"
CONFIG_API = "config.kueue.x-k8s.io/v1beta2"
#: Where cmd/kueue/main.go reads the metrics certificate when internal cert management is off.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
#: The pod integration's webhooks (Kueue's kubebuilder markers name them so).
POD_WEBHOOKS = frozenset({"mpod.kb.io", "vpod.kb.io"})
#: Kueue's integration for batch/v1 Jobs (Katib's trials) and its webhooks
#: (pkg/controller/jobs/job/job_webhook.go).
BATCH_JOB_FRAMEWORK = "batch/job"
BATCH_JOB_WEBHOOKS = frozenset({"mjob.kb.io", "vjob.kb.io"})
#: Namespaces Kueue's kustomization keeps away from its pod webhooks.
_UNMANAGED_NAMESPACES = ("kube-system", "kueue-system")
_CRD_DIR = Path("config/components/crd/bases")
_WEBHOOK_MANIFESTS = Path("config/components/webhook/manifests.yaml")
_CONFIG_PREFIX = "gpuwarden-lab-kueue-"
_HTTP_NOT_FOUND = 404
_HTTP_CONFLICT = 409
_PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
}
#: The condition Kueue's pod integration sets on a pod it stops (ConditionTypeTerminationTarget
#: in pkg/controller/jobs/pod/pod_controller.go) before it deletes it; on a preemption its reason
#: is WorkloadEvictedDueToPreempted and its message Kueue's preemption message.
TERMINATION_TARGET = "TerminationTarget"
#: Kueue's preemption reasons (Workload condition Preempted), by the words its preemption message
#: uses for them (HumanReadablePreemptionReasons in pkg/scheduler/preemption/preemption.go),
#: longest first: one contains another.
PREEMPTION_REASONS = (
    ("reclamation within the cohort while borrowing", "InCohortReclaimWhileBorrowing"),
    ("reclamation within the cohort", "InCohortReclamation"),
    ("Fair Sharing within the cohort", "InCohortFairSharing"),
    ("prioritization in the ClusterQueue", "InClusterQueue"),
)


#: The label Kueue puts on a Workload with its job's UID (JobUIDLabel in
#: pkg/controller/constants): for a plain pod, the pod's.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def collect_workloads(api: k8s_client.ApiClient, namespace: str, uid: str) -> None:
    """Delete the Workloads of a pod that is gone, as the garbage collector would (a pod's
    Workload names the pod as its owner); kube-controller-manager does not run in the lab. Left
    behind, the Workload of a pod Kueue preempted is requeued and admitted again, holding quota
    for a pod that no longer exists."""
    custom: Any = k8s_client.CustomObjectsApi(api)
    group, version = KUEUE_API.split("/")
    found = custom.list_namespaced_custom_object(
        group, version, namespace, "workloads", label_selector=f"{JOB_UID_LABEL}={uid}"
    )
    for workload in found["items"]:
        try:
            custom.delete_namespaced_custom_object(
                group, version, namespace, "workloads", workload["metadata"]["name"]
            )
        except ApiException as exc:
            if exc.status != _HTTP_NOT_FOUND:
                raise


def kept_out_pod(workload: Mapping[str, Any]) -> str | None:
    """The pod whose Workload Kueue tried to admit and found no room for (QuotaReserved False,
    reason Pending, with Kueue's message), as the scheduler calls a pod unschedulable; None
    for any other Workload."""
    conditions = (workload.get("status") or {}).get("conditions") or []
    kept_out = any(
        c.get("type") == "QuotaReserved"
        and c.get("status") == "False"
        and c.get("reason") == "Pending"
        and c.get("message")
        for c in conditions
    )
    if not kept_out:
        return None
    for owner in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == "Pod":
            return str(owner.get("name"))
    return None


def preemption_reason(conditions: Sequence[Mapping[str, Any]]) -> str | None:
    """Kueue's reason for preempting a pod, from the pod's conditions (wire format), or None
    when Kueue did not preempt it."""
    for condition in conditions:
        if condition.get("type") != TERMINATION_TARGET or condition.get("status") != "True":
            continue
        if "Preempted" not in str(condition.get("reason") or ""):
            return None
        message = str(condition.get("message") or "")
        for words, reason in PREEMPTION_REASONS:
            if f"due to {words}" in message:
                return reason
        return "Preempted"
    return None


def go_binary() -> str:
    """The Go toolchain, found as hack/lib.sh finds it ($GO, go on PATH, /usr/local/go/bin/go)."""
    configured = os.environ.get("GO")
    if configured:
        return configured
    found = shutil.which("go")
    if found:
        return found
    if os.access("/usr/local/go/bin/go", os.X_OK):
        return "/usr/local/go/bin/go"
    raise ToolsMissingError("no Go toolchain (need go on PATH or /usr/local/go/bin/go)")


def go_module(module: str, version: str) -> Path:
    """A module's source in Go's module cache (downloaded through the proxy if missing)."""
    result = subprocess.run(
        [go_binary(), "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),  # outside any Go module: no go.mod applies
    )
    info = json.loads(result.stdout) if result.stdout.strip() else {}
    directory = info.get("Dir")
    if result.returncode != 0 or not directory:
        detail = info.get("Error") or result.stderr.strip()
        raise ToolsMissingError(f"go mod download {module}@{version} failed: {detail}")
    return Path(directory)


def module_dir(version: str = KUEUE_VERSION) -> Path:
    """Kueue's module source in Go's module cache (downloaded through the proxy if missing)."""
    return go_module(KUEUE_MODULE, version)


def crd_manifests(module: Path) -> list[dict[str, Any]]:
    """Kueue's CustomResourceDefinitions, as its module ships them."""
    crds: list[dict[str, Any]] = []
    for path in sorted((module / _CRD_DIR).glob("*.yaml")):
        crds += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return crds


def crd_schema(crds: Sequence[Mapping[str, Any]], kind: str, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of one kind at one served version."""
    for crd in crds:
        if crd["spec"]["names"]["kind"] != kind:
            continue
        for served in crd["spec"]["versions"]:
            if served["name"] == version:
                schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
                return schema
    raise KeyError(f"no CRD for {kind} {version}")


def webhook_configurations(
    module: Path, *, url: str, ca_bundle: bytes, jobs: bool = False
) -> list[dict[str, Any]]:
    """Kueue's webhook configurations for its own kinds and plain pods (with ``jobs``, batch/v1
    Jobs too), called by URL."""
    docs = [d for d in yaml.safe_load_all((module / _WEBHOOK_MANIFESTS).read_text()) if d]
    integrations = POD_WEBHOOKS | (BATCH_JOB_WEBHOOKS if jobs else frozenset())
    configs: list[dict[str, Any]] = []
    for doc in docs:
        kept: list[dict[str, Any]] = []
        for hook in doc.get("webhooks") or []:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if hook["name"] not in integrations and KUEUE_API.split("/")[0] not in groups:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook = {
                **hook,
                "clientConfig": {
                    "url": f"{url}{path}",
                    "caBundle": base64.b64encode(ca_bundle).decode(),
                },
            }
            if hook["name"] in POD_WEBHOOKS:
                hook["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": list(_UNMANAGED_NAMESPACES),
                        }
                    ]
                }
            kept.append(hook)
        name = _CONFIG_PREFIX + ("mutating" if "Mutating" in doc["kind"] else "validating")
        configs.append({**doc, "metadata": {"name": name}, "webhooks": kept})
    return configs


def configuration(
    *, webhook_port: int, cert_dir: Path, health_port: int, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Kueue's Configuration for an out-of-cluster manager on loopback."""
    return {
        "apiVersion": CONFIG_API,
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 200, "burst": 400},
        "featureGates": {"VisibilityOnDemand": False},
        **configuration_requirements(),
        **(extra or {}),
    }


def private_etc_argv(etc_layer: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` run in a private mount namespace whose /etc is ``etc_layer`` over the host's
    (a read-only overlay: the host's /etc is neither written nor hidden)."""
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    script = 'mount -t overlay overlay -o "lowerdir=$1:/etc" /etc && shift && exec "$@"'
    return [*unshare, "--", "sh", "-c", script, "sh", str(etc_layer), *argv]


@dataclass
class Kueue:
    """Kueue's manager on ``plane`` (started already): start() and stop() it."""

    plane: ControlPlane
    binary: Path
    module: Path
    startup_timeout: float = 120.0
    extra_config: Mapping[str, Any] = field(default_factory=dict)
    # batch/v1 Jobs as an integration besides plain pods (its webhooks registered too).
    jobs: bool = False

    def __post_init__(self) -> None:
        self._process: Process | None = None
        self._webhooks: list[dict[str, Any]] = []

    @property
    def process(self) -> Process:
        if self._process is None:
            raise RuntimeError("kueue not started")
        return self._process

    def start(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        workdir = self.plane.workdir / "kueue"
        api = self.plane.api_client()
        try:
            self._apply_crds(api, deadline)
            ca, serving = loopback_serving("gpuwarden-lab-kueue-ca")
            serving.write(workdir / "webhook-certs", "tls.crt", "tls.key")
            etc_layer = workdir / "etc"
            metrics = etc_layer / METRICS_CERT_DIR.relative_to("/etc")
            serving.write(metrics, "tls.crt", "tls.key")
            webhook_port, health_port = free_ports(2)
            config = configuration(
                webhook_port=webhook_port,
                cert_dir=workdir / "webhook-certs",
                health_port=health_port,
                extra=self._config(),
            )
            (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            argv = [
                str(self.binary),
                f"--config={workdir / 'config.yaml'}",
                f"--kubeconfig={self.plane.kubeconfig_path}",
                "--zap-log-level=2",
            ]
            self._process = self.plane.spawn("kueue", private_etc_argv(etc_layer, argv))

            def ready() -> bool:
                url = f"http://127.0.0.1:{health_port}/readyz"
                with urllib.request.urlopen(url, timeout=2) as response:
                    status: int = response.status
                return status == 200

            self.plane.poll("kueue /readyz", ready, [self._process], deadline)
            self._webhooks = webhook_configurations(
                self.module,
                url=f"https://127.0.0.1:{webhook_port}",
                ca_bundle=ca.cert_pem,
                jobs=self.jobs,
            )
            _install_webhooks(api, self._webhooks)
        finally:
            api.close()  # type: ignore[no-untyped-call]

    def _config(self) -> dict[str, Any]:
        if not self.jobs:
            return dict(self.extra_config)
        frameworks = [*configuration_requirements()["integrations"]["frameworks"]]
        return {
            "integrations": {"frameworks": [*frameworks, BATCH_JOB_FRAMEWORK]},
            **self.extra_config,
        }

    def stop(self) -> None:
        """Unregister the webhooks (they fail closed), then stop the manager."""
        if self._webhooks:
            api = self.plane.api_client()
            try:
                _delete_webhooks(api, self._webhooks)
            finally:
                api.close()  # type: ignore[no-untyped-call]
            self._webhooks = []
        if self._process is not None:
            self._process.terminate(self.plane.stop_timeout)
            self._process = None

    def apply_queues(self, api: k8s_client.ApiClient, objects: Sequence[Mapping[str, Any]]) -> None:
        """Create rendered Kueue objects (ResourceFlavors, ClusterQueues, LocalQueues) and wait
        until Kueue reports every queue Active: its pod webhook gives a pod the ``default``
        LocalQueue only once it has seen that queue, and would leave an earlier pod unqueued."""
        custom: Any = k8s_client.CustomObjectsApi(api)
        group, version = KUEUE_API.split("/")
        queues: list[tuple[str, str | None, str]] = []
        for obj in objects:
            meta = obj["metadata"]
            plural = _PLURALS[obj["kind"]]
            if obj["kind"] == "LocalQueue":
                custom.create_namespaced_custom_object(
                    group, version, meta["namespace"], plural, dict(obj)
                )
                queues.append((plural, meta["namespace"], meta["name"]))
            else:
                custom.create_cluster_custom_object(group, version, plural, dict(obj))
                if obj["kind"] == "ClusterQueue":
                    queues.append((plural, None, meta["name"]))

        def active() -> bool:
            for plural, namespace, name in queues:
                if namespace is None:
                    found = custom.get_cluster_custom_object(group, version, plural, name)
                else:
                    found = custom.get_namespaced_custom_object(
                        group, version, namespace, plural, name
                    )
                conditions = (found.get("status") or {}).get("conditions") or []
                if not any(c["type"] == "Active" and c["status"] == "True" for c in conditions):
                    return False
            return True

        deadline = time.monotonic() + self.startup_timeout
        self.plane.poll(f"Kueue to report {len(queues)} queues Active", active, [], deadline)

    def _apply_crds(self, api: k8s_client.ApiClient, deadline: float) -> None:
        install_crds(self.plane, api, crd_manifests(self.module), "Kueue's CRDs", deadline)


def install_crds(
    plane: ControlPlane,
    api: k8s_client.ApiClient,
    crds: Sequence[Mapping[str, Any]],
    what: str,
    deadline: float,
    *,
    replace: bool = False,
) -> None:
    """Create the CRDs (one of the same name stays, or with ``replace`` is replaced) and wait
    until the API server has established them all."""
    ext: Any = k8s_client.ApiextensionsV1Api(api)
    names = []
    for crd in crds:
        name = crd["metadata"]["name"]
        names.append(name)
        try:
            ext.create_custom_resource_definition(dict(crd))
        except ApiException as exc:
            if exc.status != _HTTP_CONFLICT:
                raise
            if replace:
                current = ext.read_custom_resource_definition(name)
                body = {**crd, "metadata": {**crd["metadata"]}}
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                ext.replace_custom_resource_definition(name, body)

    plane.wait_established(*names, timeout=max(0.0, deadline - time.monotonic()), what=what)


def _install_webhooks(api: k8s_client.ApiClient, configs: Sequence[Mapping[str, Any]]) -> None:
    admission: Any = k8s_client.AdmissionregistrationV1Api(api)
    for config in configs:
        if config["kind"] == "MutatingWebhookConfiguration":
            admission.create_mutating_webhook_configuration(dict(config))
        else:
            admission.create_validating_webhook_configuration(dict(config))


def _delete_webhooks(api: k8s_client.ApiClient, configs: Sequence[Mapping[str, Any]]) -> None:
    admission: Any = k8s_client.AdmissionregistrationV1Api(api)
    for config in configs:
        name = config["metadata"]["name"]
        try:
            if config["kind"] == "MutatingWebhookConfiguration":
                admission.delete_mutating_webhook_configuration(name)
            else:
                admission.delete_validating_webhook_configuration(name)
        except ApiException as exc:
            if exc.status != _HTTP_NOT_FOUND:
                raise


def kueue_binary(tools: Tools) -> Path:
    if tools.kueue is None:
        raise ToolsMissingError(
            "tools.env names no KUEUE; run hack/build-tools.sh (it builds Kueue for the lab)"
        )
    return tools.kueue


@contextlib.contextmanager
def running_kueue(
    plane: ControlPlane,
    tools: Tools,
    *,
    extra_config: Mapping[str, Any] | None = None,
    jobs: bool = False,
) -> Iterator[Kueue]:
    kueue = Kueue(
        plane,
        kueue_binary(tools),
        module_dir(),
        extra_config=dict(extra_config or {}),
        jobs=jobs,
    )
    try:
        kueue.start()
        yield kueue
    finally:
        kueue.stop()
