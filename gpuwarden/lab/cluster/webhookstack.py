"""gpuwarden serve against a lab control plane: its registration, PriorityClasses, and pods.

The e2e suites, the scheduling lab's tests and ``bench/apiserver.py`` all set gpuwarden up this
way, so it lives in the package beside the control plane it runs against:

* :class:`GpuwardenServer` (gpuwardenserver.py): ``gpuwarden serve`` as a subprocess (``python -m gpuwarden``) with a
  certificate directory, ``--kubeconfig`` of the control plane (so Namespaces and PriorityClasses
  come from the real API server through its watch caches), its JSON log and its /metrics. The
  lab runs no gpuwarden service in its own process (``.importlinter``).
* :func:`chart_webhook_configurations`: the Mutating and Validating WebhookConfigurations as
  ``helm template charts/gpuwarden`` renders them, with ``clientConfig`` rewritten to
  ``url: https://127.0.0.1:PORT/<path>`` and our CA as ``caBundle`` (there is no Service network).
* PriorityClasses as the chart installs them, namespaces, and pods created through the
  kubernetes client with the API server's Warning headers kept.
* :func:`webhook_stack`: all of it as the chart describes one deployment, and
  :meth:`WebhookStack.expect`, what the policy core decides for a pod as the webhook sees it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import subprocess
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.lab.cluster.controlplane import REPO_ROOT, ControlPlane
from gpuwarden.lab.cluster.gpuwardenserver import (
    POLICIES_DIR,
    GpuwardenServer,
    WebhookStackError,
    model,
    running_server,
    wait_for,
)
from gpuwarden.policy import (
    Admission,
    AdmissionRequest,
    ClusterView,
    PolicySet,
    PriorityClassInfo,
    admit,
    load_paths,
)
from gpuwarden.policy.spec.loader import policy_files

Obj = dict[str, Any]
T = TypeVar("T")

CHART_DIR = REPO_ROOT / "charts" / "gpuwarden"

RELEASE_NAME = "gpuwarden"
#: The namespace the chart is rendered into: the webhook's own namespace.
RELEASE_NAMESPACE = "gpuwarden-system"

#: Labels Kubeflow's profile controller puts on a profile namespace (examples/namespaces.yaml),
#: less kubernetes.io/metadata.name, which the API server sets itself.
KUBEFLOW_PROFILE_LABELS: Mapping[str, str] = {
    "app.kubernetes.io/part-of": "kubeflow-profile",
    "katib.kubeflow.org/metrics-collector-injection": "enabled",
    "serving.kubeflow.org/inferenceservice": "enabled",
    "pipelines.kubeflow.org/enabled": "true",
}


# --- what the chart renders ------------------------------------------------------------------

WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def render_chart(
    helm: Path,
    *,
    values: Mapping[str, Any] | None = None,
    namespace: str = RELEASE_NAMESPACE,
    workdir: Path,
) -> list[Obj]:
    """``helm template gpuwarden charts/gpuwarden`` as a list of manifests."""
    argv = [str(helm), "template", RELEASE_NAME, str(CHART_DIR), "--namespace", namespace]
    if values:
        values_file = workdir / f"values-{uuid.uuid4().hex[:8]}.yaml"
        values_file.write_text(yaml.safe_dump(dict(values)))
        argv += ["--values", str(values_file)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise WebhookStackError(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if isinstance(doc, dict)]


def chart_webhook_configurations(
    rendered: Iterable[Mapping[str, Any]], *, base_url: str, ca_bundle_b64: str
) -> list[Obj]:
    """The chart's webhook configurations, pointed at ``base_url`` with ``ca_bundle_b64``.

    Only ``clientConfig`` changes: ``service: {path}`` becomes ``url: base_url + path``.
    Everything else (rules, selectors, failurePolicy, reinvocationPolicy, timeouts, sideEffects,
    matchConditions) is what the chart renders.
    """
    out: list[Obj] = []
    for doc in rendered:
        if doc.get("kind") not in WEBHOOK_KINDS:
            continue
        config = copy.deepcopy(dict(doc))
        metadata = config.setdefault("metadata", {})
        # cert-manager's CA injector is not running here; we set caBundle ourselves.
        (metadata.get("annotations") or {}).pop("cert-manager.io/inject-ca-from", None)
        for hook in config.get("webhooks") or []:
            client_config = hook.get("clientConfig") or {}
            service = client_config.get("service")
            if service is not None:
                path = service.get("path") or "/"
            else:
                path = "/" + client_config.get("url", "").split("/", 3)[-1]
            hook["clientConfig"] = {"url": base_url + path, "caBundle": ca_bundle_b64}
        out.append(config)
    return out


def install_webhook_configurations(api: k8s_client.ApiClient, configs: Iterable[Obj]) -> None:
    """Create each configuration, or replace the one of the same name (keeping no old fields)."""
    admission = k8s_client.AdmissionregistrationV1Api(api)
    for config in configs:
        name = config["metadata"]["name"]
        body: Any
        read: Callable[[str], Any]
        create: Callable[[Any], Any]
        replace: Callable[[str, Any], Any]
        if config["kind"] == "MutatingWebhookConfiguration":
            body = model(k8s_client.V1MutatingWebhookConfiguration, config)
            read = admission.read_mutating_webhook_configuration
            create = admission.create_mutating_webhook_configuration
            replace = admission.replace_mutating_webhook_configuration
        else:
            body = model(k8s_client.V1ValidatingWebhookConfiguration, config)
            read = admission.read_validating_webhook_configuration
            create = admission.create_validating_webhook_configuration
            replace = admission.replace_validating_webhook_configuration
        try:
            current: Any = read(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            create(body)
        else:
            body.metadata.resource_version = current.metadata.resource_version
            replace(name, body)


def delete_webhook_configurations(api: k8s_client.ApiClient, configs: Iterable[Obj]) -> None:
    admission = k8s_client.AdmissionregistrationV1Api(api)
    for config in configs:
        name = config["metadata"]["name"]
        with contextlib.suppress(ApiException):
            if config["kind"] == "MutatingWebhookConfiguration":
                admission.delete_mutating_webhook_configuration(name)
            else:
                admission.delete_validating_webhook_configuration(name)


def webhook_names(configs: Iterable[Mapping[str, Any]], kind: str) -> list[str]:
    return [
        str(hook["name"])
        for config in configs
        if config.get("kind") == kind
        for hook in config.get("webhooks") or []
    ]


# --- PriorityClasses -------------------------------------------------------------------------


def ensure_priority_classes(api: k8s_client.ApiClient, manifests: Iterable[Obj]) -> None:
    scheduling = k8s_client.SchedulingV1Api(api)
    for manifest in manifests:
        try:
            scheduling.create_priority_class(model(k8s_client.V1PriorityClass, manifest))
        except ApiException as exc:
            if exc.status != 409:
                raise


def priority_class_infos(manifests: Iterable[Mapping[str, Any]]) -> dict[str, PriorityClassInfo]:
    return {
        str(m["metadata"]["name"]): PriorityClassInfo(
            value=int(m["value"]),
            preemption_policy=str(m.get("preemptionPolicy") or "PreemptLowerPriority"),
        )
        for m in manifests
    }


# --- namespaces ------------------------------------------------------------------------------


def create_namespace(
    api: k8s_client.ApiClient,
    prefix: str,
    labels: Mapping[str, str] | None = None,
    *,
    name: str | None = None,
) -> tuple[str, dict[str, str]]:
    """A new namespace (unique name unless given; an existing one of that name is reused).

    Returns its name and its labels as the API server stores them (with
    kubernetes.io/metadata.name), which is what the webhook's namespace cache sees.
    """
    core = k8s_client.CoreV1Api(api)
    name = name or f"{prefix}-{uuid.uuid4().hex[:8]}"
    body = k8s_client.V1Namespace(
        metadata=k8s_client.V1ObjectMeta(name=name, labels=dict(labels or {}))
    )
    try:
        created: Any = core.create_namespace(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        created = core.read_namespace(name)
    return name, dict(created.metadata.labels or {})


# --- pods ------------------------------------------------------------------------------------


WARNING_HEADER = re.compile(r'^\d{3} \S+ "((?:[^"\\]|\\.)*)"')


def parse_warning(header: str) -> str:
    """The text of one RFC 7234 Warning header value (``299 - "text"``)."""
    match = WARNING_HEADER.match(header.strip())
    if match is None:
        return header
    return re.sub(r"\\(.)", r"\1", match.group(1))


@dataclass(frozen=True)
class Created:
    """A pod as the API server returned it, and the warnings of the response."""

    pod: Obj
    warnings: tuple[str, ...]
    status: int


def create_pod(
    api: k8s_client.ApiClient, pod: Mapping[str, Any], *, dry_run: bool = False
) -> Created:
    """POST the pod through the kubernetes client; the wire JSON and Warning headers come back.

    Raises ApiException on refusal (its ``body`` holds the Status, its ``headers`` the warnings).
    """
    core = k8s_client.CoreV1Api(api)
    # _preload_content=False: the raw urllib3 response, with every Warning header.
    response: Any = core.create_namespaced_pod(
        pod["metadata"]["namespace"],
        model(k8s_client.V1Pod, pod),
        dry_run="All" if dry_run else None,
        _preload_content=False,
    )
    warnings = tuple(parse_warning(h) for h in response.headers.getlist("Warning"))
    return Created(pod=json.loads(response.data), warnings=warnings, status=response.status)


SERVER_SET_METADATA = (
    "uid",
    "creationTimestamp",
    "resourceVersion",
    "managedFields",
    "generation",
)


def api_defaults(api: k8s_client.ApiClient, pod: Mapping[str, Any]) -> Obj:
    """The pod with the API server's defaults applied, as a mutating webhook receives it."""
    probe = copy.deepcopy(dict(pod))
    namespace = probe["metadata"]["namespace"]
    name = probe["metadata"]["name"]
    probe["metadata"]["namespace"] = "kube-system"
    # A name of its own: the pod itself may exist already (a dry run of it would conflict).
    probe["metadata"]["name"] = f"defaults-{uuid.uuid4().hex[:12]}"
    defaulted = create_pod(api, probe, dry_run=True).pod
    defaulted["metadata"]["namespace"] = namespace
    defaulted["metadata"]["name"] = name
    for key in SERVER_SET_METADATA:
        defaulted["metadata"].pop(key, None)
    defaulted.pop("status", None)
    return defaulted


def gpu_probe_pod(namespace: str, *, name: str | None = None) -> Obj:
    """A minimal pod asking for one GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name or f"probe-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda:12.4",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }


def pod_annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def wait_until_governed(
    api: k8s_client.ApiClient, namespace: str, tenant: str, timeout: float = 15.0
) -> None:
    """Until a dry-run GPU pod in ``namespace`` comes back annotated for ``tenant``.

    Proves the API server calls our registered webhook (its configuration informer has caught
    up) and the webhook's namespace cache knows the namespace's labels.
    """

    def probe() -> bool:
        created = create_pod(api, gpu_probe_pod(namespace), dry_run=True)
        return pod_annotations(created.pod).get("gpuwarden.io/tenant") == tenant

    wait_for(f"the webhook to govern namespace {namespace} as tenant {tenant}", probe, timeout)


# --- what the policy core expects ------------------------------------------------------------


def expected_admission(
    pod: Mapping[str, Any],
    policies: PolicySet,
    *,
    namespace_labels: Mapping[str, Mapping[str, str]],
    priority_classes: Mapping[str, PriorityClassInfo],
) -> Admission:
    """What gpuwarden.policy decides for the pod, with the cluster as the webhook sees it."""
    request = AdmissionRequest(
        operation="CREATE", namespace=str(pod["metadata"]["namespace"]), pod=pod
    )
    cluster = ClusterView(namespace_labels=namespace_labels, priority_classes=priority_classes)
    return admit(request, policies, cluster)


# --- one gpuwarden deployment, as the chart describes it ---------------------------------------

#: `gpuwarden serve` flags of the chart's Deployment that name in-cluster places (the mounted
#: ConfigMap and Secret, the container ports); the fixture gives local ones instead.
_LOCATION_FLAGS = (
    "--policies",
    "--tls-cert",
    "--tls-key",
    "--cert-dir",
    "--service",
    "--service-namespace",
    "--port",
    "--metrics-port",
    "--host",
)


def chart_values_for(policy_sources: Sequence[Path]) -> Obj:
    """Chart values that ship these policy files (the chart's own default governs nothing)."""
    files = policy_files(policy_sources)
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise WebhookStackError(f"policy files with the same name: {names}")
    return {"policies": {f.name: f.read_text() for f in files}}


def chart_policies(rendered: Iterable[Mapping[str, Any]], directory: Path) -> Path:
    """Write the chart's policy ConfigMap into ``directory`` as the kubelet would mount it."""
    name = f"{RELEASE_NAME}-policies"
    for doc in rendered:
        if doc.get("kind") == "ConfigMap" and (doc.get("metadata") or {}).get("name") == name:
            directory.mkdir(parents=True, exist_ok=True)
            for key, text in (doc.get("data") or {}).items():
                (directory / key).write_text(text)
            return directory
    raise WebhookStackError(f"helm template rendered no ConfigMap {name}")


def chart_serve_args(rendered: Iterable[Mapping[str, Any]]) -> list[str]:
    """The behaviour flags the chart's Deployment gives `gpuwarden serve` (deadline, ...)."""
    for doc in rendered:
        if doc.get("kind") != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            args = [str(a) for a in container.get("args") or []]
            if args[:1] == ["serve"]:
                return [a for a in args[1:] if not a.startswith(_LOCATION_FLAGS)]
    raise WebhookStackError("helm template rendered no Deployment running `gpuwarden serve`")


@dataclass
class WebhookStack:
    """gpuwarden serve plus the chart's webhook configurations pointing at it."""

    api: k8s_client.ApiClient
    server: GpuwardenServer
    policies: PolicySet
    chart: list[Obj]
    priority_classes: dict[str, PriorityClassInfo]
    configs: list[Obj] = field(default_factory=list)

    def chart_configs(self) -> list[Obj]:
        return chart_webhook_configurations(
            self.chart, base_url=self.server.base_url, ca_bundle_b64=self.server.ca_bundle_b64()
        )

    def install(self, configs: list[Obj] | None = None) -> None:
        self.configs = configs if configs is not None else self.chart_configs()
        if not self.configs:
            raise WebhookStackError(
                f"helm template {CHART_DIR} rendered no Mutating/ValidatingWebhookConfiguration"
            )
        install_webhook_configurations(self.api, self.configs)

    def uninstall(self) -> None:
        delete_webhook_configurations(self.api, self.configs)

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        ns: Any = k8s_client.CoreV1Api(self.api).read_namespace(namespace)
        return dict(ns.metadata.labels or {})

    def expect(self, pod: Mapping[str, Any]) -> Admission:
        """The policy core's verdict on the pod as the API server hands it to the webhook.

        That is the pod after the API server's defaulting (fieldRef apiVersion, restartPolicy,
        imagePullPolicy, requests copied from limits, priority 0, ...), obtained by a dry-run
        creation in kube-system, where no webhook of ours is called.
        """
        namespace = str(pod["metadata"]["namespace"])
        return expected_admission(
            api_defaults(self.api, pod),
            self.policies,
            namespace_labels={namespace: self.namespace_labels(namespace)},
            priority_classes=self.priority_classes,
        )

    def tenant_namespace(
        self,
        prefix: str = "e2e-kf",
        labels: Mapping[str, str] = KUBEFLOW_PROFILE_LABELS,
        *,
        name: str | None = None,
    ) -> str:
        """A namespace governed by a tenant, once the webhook knows it."""
        namespace, stored = create_namespace(self.api, prefix, labels, name=name)
        tenant = self.policies.tenant_for(namespace, stored)
        if tenant is None:
            raise WebhookStackError(f"namespace {namespace} with labels {stored} is in no tenant")
        wait_until_governed(self.api, namespace, tenant.name)
        return namespace


@contextlib.contextmanager
def webhook_stack(
    api: k8s_client.ApiClient,
    *,
    kubeconfig: Path,
    helm: Path,
    workdir: Path,
    policies: Sequence[Path] = (POLICIES_DIR,),
    chart_values: Mapping[str, Any] | None = None,
    server_args: Sequence[str] = (),
) -> Iterator[WebhookStack]:
    """gpuwarden as the chart installs it, with the webhook running here instead of in a pod.

    ``helm template`` renders the chart with ``policies`` as its policy values. From the output:
    the PriorityClasses are created first; the policy ConfigMap is written to a directory that
    `gpuwarden serve` serves (as the Deployment mounts it); the Deployment's behaviour flags are
    passed on; the webhook configurations are installed pointing at the local server. On exit
    the configurations are deleted and the server stopped, so the next module's pods are not
    sent to a server that is gone.
    """
    values = {**chart_values_for(policies), **dict(chart_values or {})}
    chart = render_chart(helm, values=values, workdir=workdir)
    served = chart_policies(chart, workdir / "policies")
    policy_set = load_paths([str(served)])
    classes = [doc for doc in chart if doc.get("kind") == "PriorityClass"]
    ensure_priority_classes(api, classes)
    server = GpuwardenServer(
        workdir / "server",
        kubeconfig=kubeconfig,
        policies=(served,),
        extra_args=[*chart_serve_args(chart), *server_args],
    )
    stack = WebhookStack(
        api=api,
        server=server,
        policies=policy_set,
        chart=chart,
        priority_classes=priority_class_infos(classes),
    )
    with running_server(server):
        stack.install()
        try:
            yield stack
        finally:
            stack.uninstall()


@contextlib.contextmanager
def plane_webhook_stack(
    plane: ControlPlane, *, helm: Path, workdir: Path, policies: Sequence[Path]
) -> Iterator[WebhookStack]:
    """webhook_stack on a control plane, with an API client of its own closed at the end."""
    api = plane.api_client()
    try:
        with webhook_stack(
            api,
            kubeconfig=plane.kubeconfig_path,
            helm=helm,
            workdir=workdir,
            policies=policies,
        ) as stack:
            yield stack
    finally:
        api.close()  # type: ignore[no-untyped-call]
