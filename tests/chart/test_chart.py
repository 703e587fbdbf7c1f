"""The Helm chart, rendered by the real helm binary, checked the way a cluster would see it.

Every rendered object is validated against the Kubernetes schema kubernetes-validate ships for
the newest version not newer than the e2e control plane's (1.37). Kinds outside core Kubernetes
(cert-manager, Prometheus operator, Volcano) have no schema at hand and are listed in SKIPPED:
the test fails if a kind is neither validated nor listed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuwarden.cli import build_parser
from gpuwarden.cli import main as gpuwarden
from gpuwarden.commands.serve import config_from
from gpuwarden.node.mps import device_plugin_directories
from gpuwarden.policy import PolicySet, load_paths
from gpuwarden.policy.pod import keys
from gpuwarden.policy.render.objects import render
from gpuwarden.policy.render.scope import CONFIG_MAP_CEL
from gpuwarden.policy.spec.model import LabelSelector
from gpuwarden.policy.spec.schema import CRD_NAME, crd_yaml
from gpuwarden.policy.spec.selectors import selector_matches

from .support import (
    CHART,
    FULLNAME,
    NAMESPACE,
    Rendering,
    assert_restricted,
    helm_args,
    run_helm,
    template,
    template_error,
    values_files,
)

pytestmark = pytest.mark.helm

KUBERNETES_VERSION = "1.37"  # the e2e control plane runs kube-apiserver v1.37.2
# Kinds kubernetes-validate has no schema for, with where the schema would come from.
SKIPPED = {
    "Certificate": "cert-manager CRD",
    "Issuer": "cert-manager CRD",
    "ServiceMonitor": "Prometheus operator CRD",
    "PodMonitor": "Prometheus operator CRD",
    "PrometheusRule": "Prometheus operator CRD",
    "Queue": "Volcano CRD",
}
VALUES = ["", *values_files()]


def _render(name: str) -> Rendering:
    return template([name] if name else [])


@pytest.fixture(scope="module")
def renderings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendering]:
    found = {name: _render(name) for name in VALUES}
    # The documented pipeline: `gpuwarden render` output passed in with --set-file.
    found[WITH_RENDERED] = template(
        ["tenants-quotas.yaml"],
        set_files={
            "renderedObjects": _rendered_objects(
                found["tenants-quotas.yaml"], tmp_path_factory.mktemp("rendered")
            )
        },
    )
    return found


WITH_RENDERED = "tenants-quotas.yaml+renderedObjects"


def _rendered_objects(rendering: Rendering, directory: Path) -> Path:
    policies = _policy_volume(rendering, directory / "policies")
    out = directory / "rendered.yaml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "render",
            "--policies",
            str(policies),
            "--no-priority-classes",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    out.write_text(result.stdout)
    return out


@pytest.fixture(scope="module")
def default(renderings: dict[str, Rendering]) -> Rendering:
    return renderings[""]


def test_kubernetes_validate_version_is_the_newest_not_above_the_control_plane() -> None:
    supported = kubernetes_validate.utils.all_versions()
    usable = [v for v in supported if tuple(map(int, v.split(".")[:2])) <= (1, 37)]
    assert usable[-1].startswith(KUBERNETES_VERSION)


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v or "defaults")
def test_helm_lint_strict(values: str) -> None:
    result = run_helm("lint", "--strict", str(CHART), *helm_args([values] if values else []))
    assert "0 chart(s) failed" in result.stdout


def _objects(renderings: dict[str, Rendering]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, rendering in renderings.items():
        for obj in rendering.objects:
            yield name or "defaults", obj


def test_every_rendered_object_validates_or_is_listed_as_skipped(
    renderings: dict[str, Rendering],
) -> None:
    failures: list[str] = []
    validated: set[str] = set()
    skipped: set[str] = set()
    for values, obj in _objects(renderings):
        kind = obj["kind"]
        label = f"{values}: {kind} {obj['metadata']['name']}"
        if kind in SKIPPED:
            skipped.add(kind)
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            failures.append(f"{label}: no schema and not listed in SKIPPED")
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{label}: {'.'.join(map(str, exc.path))}: {exc.message}")
        else:
            validated.add(kind)
    assert not failures, "\n".join(failures)
    # Every listed skip is real (a kind that gains a schema must move to validated).
    assert skipped == set(SKIPPED), f"listed but never rendered: {set(SKIPPED) - skipped}"
    assert {"CustomResourceDefinition", "MutatingWebhookConfiguration", "DaemonSet"} <= validated


def test_chart_crd_is_the_one_generated_from_the_model() -> None:
    shipped = (CHART / "crds" / f"{CRD_NAME}.yaml").read_text()
    assert shipped == crd_yaml(), (
        "charts/gpuwarden/crds is stale: regenerate with "
        f"`gpuwarden render --crd > charts/gpuwarden/crds/{CRD_NAME}.yaml`"
    )


def test_webhook_configurations_are_easy_to_pick_out(default: Rendering) -> None:
    mutating = default.one("MutatingWebhookConfiguration")
    validating = default.one("ValidatingWebhookConfiguration")
    assert mutating["metadata"]["name"] == validating["metadata"]["name"] == FULLNAME
    service = default.one("Service", FULLNAME)
    assert [h["name"] for h in validating["webhooks"]] == [
        "validate.gpuwarden.io",
        "validate-configmaps.gpuwarden.io",
        "validate-jobs.gpuwarden.io",
    ]
    for config, path in ((mutating, "/mutate"), (validating, "/validate")):
        for hook in config["webhooks"]:
            assert hook["clientConfig"]["service"] == {
                "name": service["metadata"]["name"],
                "namespace": NAMESPACE,
                "path": path,
                "port": 443,
            }
            assert hook["admissionReviewVersions"] == ["v1"]
            assert hook["sideEffects"] == "None"
            assert hook["timeoutSeconds"] <= 5
    assert mutating["webhooks"][0]["reinvocationPolicy"] == "IfNeeded"


def test_webhook_rules_cover_pod_creation_updates_and_ephemeral_containers(
    default: Rendering,
) -> None:
    mutating = default.one("MutatingWebhookConfiguration")["webhooks"][0]
    validating = default.one("ValidatingWebhookConfiguration")["webhooks"][0]
    assert [(r["resources"], r["operations"]) for r in mutating["rules"]] == [
        (["pods"], ["CREATE"])
    ]
    assert [(r["resources"], r["operations"]) for r in validating["rules"]] == [
        (["pods"], ["CREATE", "UPDATE"]),
        (["pods/ephemeralcontainers"], ["UPDATE"]),
        (["pods/resize"], ["UPDATE"]),
    ]
    for hook in (mutating, validating):
        # Pods only, then the pods the policies can act on (tests/chart/test_scope.py).
        assert [c["name"] for c in hook["matchConditions"]] == ["pods-only", "gpuwarden-may-act"]
        assert hook["matchConditions"][0]["expression"] == (
            'request.kind.group == "" && request.kind.kind == "Pod"'
        )
    config_maps = default.one("ValidatingWebhookConfiguration")["webhooks"][1]
    assert [(r["resources"], r["operations"]) for r in config_maps["rules"]] == [
        (["configmaps"], ["CREATE", "UPDATE"])
    ]
    assert config_maps["matchConditions"] == [
        {"name": "configmaps-with-gpu-keys", "expression": CONFIG_MAP_CEL}
    ]
    assert "objectSelector" not in config_maps


NAMESPACES = {
    "kube-system": {},
    NAMESPACE: {},
    "team-a": {"app.kubernetes.io/part-of": "kubeflow-profile"},
    "team-b-optout": {"app.kubernetes.io/part-of": "kubeflow-profile", keys.OPT_OUT_LABEL: ""},
    "default": {},
}


def _governed(selector: dict[str, Any], names: dict[str, dict[str, str]]) -> set[str]:
    parsed = LabelSelector.model_validate(selector)
    return {
        name
        for name, labels in names.items()
        if selector_matches(parsed, {**labels, "kubernetes.io/metadata.name": name})
    }


def test_namespace_selector_governs_kubeflow_profiles_only(default: Rendering) -> None:
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        selector = default.one(kind)["webhooks"][0]["namespaceSelector"]
        assert _governed(selector, NAMESPACES) == {"team-a"}


def test_exclusions_hold_even_when_every_namespace_is_selected() -> None:
    rendering = template(
        ["tenants-quotas.yaml"], sets={"webhook.namespaceSelector.matchLabels": "null"}
    )
    names = {**NAMESPACES, "kubeflow": {}, "istio-system": {}, "research": {}}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        selector = rendering.one(kind)["webhooks"][0]["namespaceSelector"]
        assert _governed(selector, names) == {"team-a", "default", "research"}


def test_pod_opt_out_label_skips_only_the_mutating_webhook(default: Rendering) -> None:
    mutating = default.one("MutatingWebhookConfiguration")["webhooks"][0]
    validating = default.one("ValidatingWebhookConfiguration")["webhooks"][0]
    opted_out = {keys.OPT_OUT_LABEL: "true"}
    assert not selector_matches(LabelSelector.model_validate(mutating["objectSelector"]), opted_out)
    assert "objectSelector" not in validating


def test_failure_policies_default_to_fail_and_follow_values(
    renderings: dict[str, Rendering],
) -> None:
    def policies(rendering: Rendering) -> tuple[str, str]:
        return (
            rendering.one("MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"],
            rendering.one("ValidatingWebhookConfiguration")["webhooks"][0]["failurePolicy"],
        )

    assert policies(renderings[""]) == ("Fail", "Fail")
    assert policies(renderings["tenants-quotas.yaml"]) == ("Ignore", "Fail")
    assert "must be Fail or Ignore" in template_error(
        sets={"webhook.failurePolicy.validating": "Allow"}
    )
    assert "must be below" in template_error(sets={"webhook.deadlineSeconds": "5"})


def test_cert_manager_injects_the_ca_of_the_certificate_the_pods_serve(default: Rendering) -> None:
    deployment = default.one("Deployment", f"{FULLNAME}-webhook")
    (tls,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = default.one(kind)
        ref = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        namespace, name = ref.split("/")
        certificate = default.one("Certificate", name)
        assert namespace == certificate["metadata"]["namespace"] == NAMESPACE
        assert certificate["spec"]["secretName"] == tls["secret"]["secretName"]
        assert f"{FULLNAME}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
        assert all("caBundle" not in hook["clientConfig"] for hook in config["webhooks"])
    # The serving certificate comes from a CA Issuer, whose CA comes from a self-signed root.
    serving = default.one("Certificate", f"{FULLNAME}-serving")
    ca_issuer = default.one("Issuer", serving["spec"]["issuerRef"]["name"])
    ca_cert = default.one("Certificate", f"{FULLNAME}-ca")
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"]
    assert ca_cert["spec"]["isCA"] is True
    assert "selfSigned" in default.one("Issuer", ca_cert["spec"]["issuerRef"]["name"])["spec"]


def test_cert_manager_with_an_existing_issuer_creates_no_ca(
    renderings: dict[str, Rendering],
) -> None:
    rendering = renderings["cert-manager-issuer.yaml"]
    assert rendering.all("Issuer") == []
    assert rendering.one("Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_self_managed_tls_has_least_privilege_rbac(renderings: dict[str, Rendering]) -> None:
    rendering = renderings["self-managed-tls.yaml"]
    assert not rendering.kinds() & {"Certificate", "Issuer"}
    secret = rendering.one("Secret")
    assert "data" not in secret and "stringData" not in secret  # never overwritten by upgrades
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = rendering.one(kind)
        assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})
        assert all("caBundle" not in hook["clientConfig"] for hook in config["webhooks"])
    pod = rendering.one("Deployment", f"{FULLNAME}-webhook")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    args = dict(arg.split("=", 1) for arg in init["args"][2:])
    assert init["args"][:2] == ["certs", "sync"]
    assert args["--secret"] == secret["metadata"]["name"]
    assert args["--webhook-config"] == FULLNAME
    assert args["--days"] == "30"
    webhook_sa = pod["serviceAccountName"]
    certs_role = rendering.one("ClusterRole", f"{FULLNAME}-certs")
    assert certs_role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
            "resourceNames": [FULLNAME],
            "verbs": ["get", "update"],
        }
    ]
    secret_role = rendering.one("Role", f"{FULLNAME}-certs")
    assert secret_role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [secret["metadata"]["name"]],
            "verbs": ["get", "update"],
        }
    ]
    for binding in (
        rendering.one("ClusterRoleBinding", f"{FULLNAME}-certs"),
        rendering.one("RoleBinding", f"{FULLNAME}-certs"),
    ):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": webhook_sa, "namespace": NAMESPACE}
        ]


def _args(container: dict[str, Any]) -> dict[str, str]:
    """``--flag=value`` arguments by flag (a bare ``--flag`` maps to "")."""
    return dict(arg.partition("=")[::2] for arg in container["args"] if arg.startswith("--"))


def test_webhook_deployment_is_highly_available_and_probed(default: Rendering) -> None:
    deployment = default.one("Deployment", f"{FULLNAME}-webhook")
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = default.one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert pdb["spec"]["minAvailable"] == 1
    pod = spec["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    anti = pod["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    assert (
        anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"]
        == "kubernetes.io/hostname"
    )
    (container,) = pod["containers"]
    assert container["args"][0] == "serve"
    args = _args(container)
    assert args["--policies"] == "/etc/gpuwarden/policies"
    assert (args["--port"], args["--metrics-port"]) == ("8443", "9090")
    assert {"--tls-cert", "--tls-key"} <= set(args)
    # A terminating replica keeps answering while its endpoint goes, then drains (30 s default).
    drain = float(args["--drain-delay"])
    assert drain > 0 and pod["terminationGracePeriodSeconds"] > drain + 30
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["https"] == int(args["--port"])
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["scheme"], ports[get["port"]]) == (path, "HTTPS", 8443)
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    policies = next(v for v in pod["volumes"] if v["name"] == "policies")
    assert "subPath" not in mounts["policies"]  # subPath mounts never see ConfigMap updates
    assert (
        policies["configMap"]["name"]
        == default.one("ConfigMap", f"{FULLNAME}-policies")["metadata"]["name"]
    )


def test_webhook_runs_unprivileged(renderings: dict[str, Rendering]) -> None:
    for name in ("", "self-managed-tls.yaml"):
        pod = renderings[name].one("Deployment", f"{FULLNAME}-webhook")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            assert_restricted(container["securityContext"])


def test_node_agent_can_leave_the_mps_daemon_to_the_device_plugin() -> None:
    """NVIDIA's device plugin in MPS mode runs its own daemon per resource: the agent uses it."""
    pipe = "/run/nvidia/mps/nvidia.com/gpu/pipe"
    rendering = template(
        sets={"nodeAgent.mps.daemon": "external", "nodeAgent.mps.pipeDirectory": pipe}
    )
    (container,) = rendering.one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    args = _args(container)
    assert (args["--mps-daemon"], args["--mps-pipe-dir"]) == ("external", pipe)


def test_node_agent_finds_the_device_plugins_daemon_of_a_renamed_resource() -> None:
    """The device plugin's daemon for nvidia.com/gpu.shared talks on <root>/<resource>/pipe
    (NVIDIA/k8s-device-plugin cmd/mps-control-daemon/mps/root.go)."""
    rendering = template(
        sets={"nodeAgent.mps.daemon": "external", "nodeAgent.mps.resource": "nvidia.com/gpu.shared"}
    )
    pod = rendering.one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert _args(container)["--mps-resource"] == "nvidia.com/gpu.shared"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/run/nvidia/mps/nvidia.com/gpu.shared/pipe" in mounts
    assert "/dev/shm" not in mounts  # the device plugin's own daemon runs it: no shm to share
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps/nvidia.com/gpu.shared/pipe"


@pytest.mark.parametrize(
    ("values", "daemon"),
    [
        ("", "off"),  # no policies: the empty native policy, no GPU sharing at all
        ("backend-volcano.yaml", "off"),  # HAMi-core in the container caps GPU memory
        ("backend-hami.yaml", "off"),
        ("backend-nvidia.yaml", "manage"),  # MPS replicas: the agent runs the daemon
    ],
)
def test_node_agent_runs_mps_only_where_the_policies_backend_shares_gpus_through_it(
    renderings: dict[str, Rendering], values: str, daemon: str
) -> None:
    """nodeAgent.mps.daemon auto (issue 32 item 4): an MPS daemon beside HAMi-core on Volcano or
    HAMi serves no pod, and needs the host's IPC namespace for nothing."""
    pod = renderings[values].one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = _args(container)
    assert args["--mps-daemon"] == daemon
    env = {e["name"] for e in container["env"]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    if daemon == "off":
        assert "--mps-root" not in args and "CUDA_MPS_PIPE_DIRECTORY" not in env
        assert pod["hostIPC"] is False
        assert not [m for m in mounts if "mps" in m] and "/dev/shm" not in mounts
    else:
        assert pod["hostIPC"] is True and "/dev/shm" in mounts


def test_node_agent_mps_daemon_can_be_set_whatever_the_backend() -> None:
    rendering = template(["backend-volcano.yaml"], sets={"nodeAgent.mps.daemon": "manage"})
    (container,) = rendering.one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert _args(container)["--mps-daemon"] == "manage"
    assert "nodeAgent.mps.daemon must be auto, manage, external or off" in template_error(
        sets={"nodeAgent.mps.daemon": "always"}
    )


def test_node_agent_is_told_the_device_plugins_mps_replicas() -> None:
    """nodeAgent.mps.replicas sizes an MPS slice in the usage metrics; unset, no flag."""
    rendering = template(sets={"nodeAgent.mps.replicas": "4"})
    (container,) = rendering.one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert _args(container)["--mps-replicas"] == "4"
    (container,) = template().one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert "--mps-replicas" not in _args(container)


def test_node_agent_has_only_the_privileges_it_needs(renderings: dict[str, Rendering]) -> None:
    # The nvidia backend's policies: the agent runs the MPS daemon, with all it needs for that.
    daemonset = renderings["backend-nvidia.yaml"].one("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["hostPID"] is True and pod["hostIPC"] is True
    assert "hostNetwork" not in pod
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["privileged"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SETUID", "SETGID"]}
    assert container["args"][:2] == ["node-agent", "--node-name=$(NODE_NAME)"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    args = _args(container)
    # NVIDIA's device plugin layout, which the agent looks up from the root and the resource.
    layout = device_plugin_directories(Path(args["--mps-root"]), args["--mps-resource"])
    assert (args["--mps-root"], args["--mps-resource"]) == ("/run/nvidia/mps", "nvidia.com/gpu")
    assert "--mps-pipe-dir" not in args and "--mps-log-dir" not in args
    assert args["--on-violation"] == "event"
    assert args["--mps-daemon"] == "manage"
    host_paths = {v["hostPath"]["path"]: v["name"] for v in pod["volumes"] if "hostPath" in v}
    assert set(host_paths) == {
        str(layout.pipe),
        str(layout.log),
        "/run/nvidia/mps/shm",  # the daemon's shared memory with its clients, as /dev/shm
        "/sys/fs/cgroup",
        "/dev/null",  # its device list as a volume mount (nodeAgent.gpuAccess)
    }
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts[host_paths["/sys/fs/cgroup"]]["readOnly"] is True
    assert args["--cgroup-root"] == mounts[host_paths["/sys/fs/cgroup"]]["mountPath"]


# NVIDIA/nvidia-container-toolkit internal/config/image/cuda_image.go: DeviceListAsVolumeMountsRoot,
# and requestsFromMounts reads only mounts of the host's /dev/null below it.
DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"


def _toolkit_devices(pod: dict[str, Any], container: dict[str, Any], *, envvar: bool) -> list[str]:
    """The devices NVIDIA's container toolkit gives the container (VisibleDevices there): the
    volume-mount list, else NVIDIA_VISIBLE_DEVICES, which it ignores in an unprivileged container
    when ``envvar`` (accept-nvidia-visible-devices-envvar-when-unprivileged) is false."""
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounted = [
        m["mountPath"].removeprefix(DEVICE_LIST_ROOT).strip("/")
        for m in container["volumeMounts"]
        if host.get(m["name"]) == "/dev/null" and m["mountPath"].startswith(DEVICE_LIST_ROOT + "/")
    ]
    if mounted:
        return mounted
    env = {e["name"]: e.get("value") for e in container["env"]}
    privileged = container["securityContext"].get("privileged") is True
    if "NVIDIA_VISIBLE_DEVICES" in env and (envvar or privileged):
        return str(env["NVIDIA_VISIBLE_DEVICES"]).split(",")
    return []


@pytest.mark.parametrize(
    ("access", "hardened"),
    [("volume-mounts", ["all"]), ("privileged", ["all"]), ("envvar", [])],
)
def test_node_agent_gets_its_gpus_from_a_hardened_toolkit(access: str, hardened: list[str]) -> None:
    """With accept-nvidia-visible-devices-envvar-when-unprivileged = false (the fix for images
    that set NVIDIA_VISIBLE_DEVICES, docs/node-agent.md) the agent still gets every GPU, unless
    told to rely on the variable alone; with the toolkit's defaults it gets them every way."""
    rendering = template(sets={"nodeAgent.gpuAccess": access})
    pod = rendering.one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert _toolkit_devices(pod, container, envvar=True) == ["all"]
    assert _toolkit_devices(pod, container, envvar=False) == hardened
    context = container["securityContext"]
    # The API server refuses privileged with allowPrivilegeEscalation false.
    assert context["privileged"] is (access == "privileged")
    assert context["allowPrivilegeEscalation"] is (access == "privileged")
    kubernetes_validate.validate(rendering.one("DaemonSet"), KUBERNETES_VERSION, strict=True)


def test_node_agent_gpu_access_is_one_of_three() -> None:
    error = template_error(sets={"nodeAgent.gpuAccess": "cdi"})
    assert 'nodeAgent.gpuAccess must be volume-mounts, envvar or privileged, not "cdi"' in error


def _rules(rendering: Rendering, name: str) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    return [
        (tuple(rule["resources"]), tuple(rule["verbs"]))
        for rule in rendering.one("ClusterRole", name)["rules"]
    ]


def test_rbac_verbs(default: Rendering) -> None:
    # Exactly the calls the code makes: list/watch for the caches, get for a namespace read live.
    # GPUPolicy objects: watched, and only their status written (patch), never their spec.
    assert _rules(default, f"{FULLNAME}-webhook") == [
        (("namespaces",), ("get", "list", "watch")),
        (("pods", "configmaps"), ("list", "watch")),
        (("priorityclasses",), ("list", "watch")),
        (("gpupolicies",), ("list", "watch")),
        (("gpupolicies/status",), ("patch",)),
    ]
    assert _rules(default, f"{FULLNAME}-node-agent") == [
        (("pods",), ("list", "watch")),
        (("pods/eviction",), ("create",)),
        (("events",), ("create",)),
        # Idle Kubeflow Notebooks stopped by their annotation (a merge patch, never a read).
        (("notebooks",), ("patch",)),
    ]
    # Nothing but the self-managed certificate roles may write, and those only by name.
    assert default.all("Role") == []


def test_no_role_of_the_chart_may_write_gpupolicies(renderings: dict[str, Rendering]) -> None:
    """Writing GPUPolicy is cluster-wide GPU admin (docs/policies.md): the chart grants it to
    nobody, under any values, and aggregates none of its roles into admin, edit or Kubeflow's."""
    for name, rendering in renderings.items():
        for role in [*rendering.all("ClusterRole"), *rendering.all("Role")]:
            labels = role["metadata"].get("labels") or {}
            assert not [k for k in labels if "aggregate-to" in k], (name, role["metadata"])
            for rule in role.get("rules") or []:
                if "gpupolicies" in rule.get("resources", []):
                    assert set(rule["verbs"]) <= {"get", "list", "watch"}, (name, rule)


def _webhook_serves_gpupolicies(rendering: Rendering) -> bool:
    """Whether `gpuwarden serve`, given the Deployment's arguments, watches GPUPolicy objects."""
    container = rendering.one("Deployment", f"{FULLNAME}-webhook")["spec"]["template"]["spec"][
        "containers"
    ][0]
    return config_from(build_parser().parse_args(container["args"])).watch_policies


def test_gpupolicy_objects_are_served_only_with_their_rbac(default: Rendering) -> None:
    assert _webhook_serves_gpupolicies(default)
    assert {"gpupolicies", "gpupolicies/status"} <= {
        resource
        for resources, _ in _rules(default, f"{FULLNAME}-webhook")
        for resource in resources
    }
    files_only = template(sets={"webhook.watchPolicies": "false"})
    assert not _webhook_serves_gpupolicies(files_only)
    assert not any(
        "gpuwarden.io" in rule["apiGroups"]
        for rule in files_only.one("ClusterRole", f"{FULLNAME}-webhook")["rules"]
    )


def _policy_volume(rendering: Rendering, directory: Path) -> Path:
    """The policies ConfigMap as the webhook sees it: one file per key in a directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, text in rendering.one("ConfigMap", f"{FULLNAME}-policies")["data"].items():
        (directory / key).write_text(text)
    return directory


def _policies_from(rendering: Rendering, tmp_path: Path) -> PolicySet:
    return load_paths([_policy_volume(rendering, tmp_path / "policies")])


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v or "defaults")
def test_priority_classes_match_gpuwarden_render(
    values: str, renderings: dict[str, Rendering], tmp_path: Path
) -> None:
    rendering = renderings[values]
    policies = _policies_from(rendering, tmp_path)  # the ConfigMap the webhook loads

    def classes(objects: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
        return {
            o["metadata"]["name"]: (
                o["value"],
                o["preemptionPolicy"],
                o["globalDefault"],
                o["description"],
                o["metadata"]["annotations"]["gpuwarden.io/rendered-from"],
            )
            for o in objects
        }

    expected = classes(render(policies).of_kind("PriorityClass"))
    assert classes(rendering.all("PriorityClass")) == expected


def test_priority_classes_from_each_backend(renderings: dict[str, Rendering]) -> None:
    names = {
        v: {o["metadata"]["name"] for o in r.all("PriorityClass")} for v, r in renderings.items()
    }
    assert names[""] == set()
    assert names["backend-volcano.yaml"] == {"gpuwarden-shared-small", "gpuwarden-whole"}
    assert names["backend-hami.yaml"] == {"gpuwarden-hami-shared", "gpu-exclusive"}
    # system-cluster-critical is built in: never rendered (the API server refuses system-*).
    assert names["backend-native.yaml"] == {"gpuwarden-one-gpu"}
    small = renderings["backend-volcano.yaml"].one("PriorityClass", "gpuwarden-shared-small")
    assert (small["value"], small["preemptionPolicy"]) == (100, "Never")


def test_conflicting_priority_classes_fail_the_render(tmp_path: Path) -> None:
    policy = {
        "apiVersion": "gpuwarden.io/v1alpha1",
        "kind": "GPUPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "profiles": [
                {"name": "a", "gpuShare": False, "priority": 1},
                {"name": "b", "gpuShare": False, "priority": 2, "priorityClassName": "gpuwarden-a"},
            ]
        },
    }
    values = tmp_path / "conflict.yaml"
    values.write_text(yaml.safe_dump({"policies": {"p.yaml": policy}}))
    assert "share PriorityClass gpuwarden-a" in template_error([values])


def test_policy_keys_must_be_file_names_gpuwarden_reads() -> None:
    assert "must end in .yaml" in template_error(sets={"policies.notes\\.txt": "x"})


def test_rendered_objects_pass_through_the_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policies = _policy_volume(template(["tenants-quotas.yaml"]), tmp_path / "policies")
    assert gpuwarden(["render", "--policies", str(policies), "--no-priority-classes"]) == 0
    printed = capsys.readouterr().out
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(printed)
    expected = [doc for doc in yaml.safe_load_all(printed) if doc]
    assert {o["kind"] for o in expected} == {"ResourceQuota", "Queue"}
    with_objects = template(["tenants-quotas.yaml"], set_files={"renderedObjects": rendered})
    passed = [o for o in with_objects.objects if o["kind"] in ("ResourceQuota", "Queue")]
    assert passed == expected
    quota = with_objects.one("ResourceQuota", "gpuwarden-nlp")
    assert quota["metadata"]["namespace"] == "nlp"
    # Pods request their cap; the 100G quota admits caps up to 100G x the notebook's ratio 1.5.
    assert quota["spec"]["hard"] == {
        "requests.volcano.sh/vgpu-memory": str(-(-150 * 10**9 // 2**20))
    }


_QUEUED_POLICY = """\
apiVersion: gpuwarden.io/v1alpha1
kind: GPUPolicy
metadata: {name: queued}
spec:
  backend: {type: nvidia, sharedResourceName: nvidia.com/gpu.shared, mpsReplicas: 4}
  profiles:
    - {name: notebook, maxMemory: 16Gi, priority: 100}
    - {name: training, gpuShare: false, priority: 200}
  workloads:
    - {name: notebooks, match: {kind: notebook}, profile: notebook}
    - {name: jobs, match: {kind: training-job}, profile: training, requireGpuRequest: true}
  tenants:
    - {name: vision, namespaces: [vision], queue: vision, quota: {gpus: 8, sharedGpus: 2}, queueSpec: {weight: 2}}
"""


def test_kueue_objects_pass_through_the_chart_only_when_rendered_for_kueue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "queued.yaml"
    policy.write_text(_QUEUED_POLICY)
    capsys.readouterr()
    assert gpuwarden(["render", "-p", str(policy), "--no-priority-classes", "--kueue"]) == 0
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(capsys.readouterr().out)
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"policies": {"queued.yaml": _QUEUED_POLICY}}))
    chart = template([values], {"kueue.enabled": "true"}, {"renderedObjects": rendered})
    queue = chart.one("ClusterQueue", "vision")
    quotas = {
        (group["flavors"][0]["name"], resource["name"]): resource["nominalQuota"]
        for group in queue["spec"]["resourceGroups"]
        for resource in group["flavors"][0]["resources"]
    }
    assert sorted(quotas.values()) == ["6", "8"]  # 6 whole GPUs, 2 GPUs of 4 MPS replicas
    assert "LocalQueue" in chart.kinds()
    capsys.readouterr()
    assert gpuwarden(["render", "-p", str(policy), "--no-priority-classes"]) == 0
    rendered.write_text(capsys.readouterr().out)
    args = ["template", "r", str(CHART), "-f", str(values), "--set", "kueue.enabled=true"]
    refused = run_helm(*args, "--set-file", f"renderedObjects={rendered}", check=False)
    assert refused.returncode != 0
    assert "kueue.enabled is true, but renderedObjects holds no ClusterQueue" in refused.stderr
    assert "gpuwarden render --kueue" in refused.stderr


def test_prometheus_rule_uses_metrics_that_exist(renderings: dict[str, Rendering]) -> None:
    from gpuwarden.node.agent import AgentConfig, NodeAgent
    from gpuwarden.node.fake import FakeNvml
    from gpuwarden.node.metrics import agent_registry
    from gpuwarden.node.procfs import ProcFs
    from gpuwarden.webhook.metrics import Metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    agent = NodeAgent(AgentConfig(node_name="n"), FakeNvml(), None, ProcFs())
    ours = {
        family.name + suffix
        for registry in (Metrics().registry, agent_registry(agent))
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }
    rule = renderings["tenants-quotas.yaml"].one("PrometheusRule")
    exprs = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    records = {
        r["record"] for group in rule["spec"]["groups"] for r in group["rules"] if "record" in r
    }
    text = "\n".join(exprs)
    used = set(re.findall(r"\b(gpuwarden_[a-z_]+)", text))
    missing = used - ours
    assert not missing, f"rules use metrics gpuwarden does not export: {missing}"
    assert {
        "gpuwarden_admission_internal_errors_total",
        "gpuwarden_admission_requests_total",
        "gpuwarden_admission_duration_seconds_bucket",
        "gpuwarden_certificate_expiry_timestamp_seconds",
    } <= used
    assert {
        "gpuwarden_node_container_gpus_allocated",
        "gpuwarden_node_container_gpus_busy",
        "gpuwarden_node_container_gpu_memory_used_bytes",
    } <= used
    # Third-party series, by their real names and labels; DCGM's device average is gone (it
    # shows every tenant of a shared GPU the whole device's utilization).
    assert "DCGM_FI_DEV_GPU_UTIL" not in text
    assert 'kube_pod_container_resource_requests{resource="nvidia_com_gpu"}' in text
    assert 'kube_resourcequota{type="used"' in text
    assert {
        "gpuwarden:tenant_gpus_allocated",
        "gpuwarden:tenant_gpus_busy",
        "gpuwarden:tenant_gpu_efficiency",
        "gpuwarden:tenant_gpu_idle_hours:1h",
    } <= records
    alerts = {
        r["alert"] for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r
    }
    assert {
        "GPUWardenTenantQuotaNearlyExhausted",
        "GPUWardenAdmissionErrors",
        "GPUWardenAdmissionLatencyHigh",
        "GPUWardenCertificateExpiresSoon",
        "GPUWardenTenantGPUsIdle",
        "GPUWardenTenantGPUEfficiencyLow",
    } <= alerts
    monitor = renderings["tenants-quotas.yaml"].one("ServiceMonitor")
    service = renderings["tenants-quotas.yaml"].one("Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_notes_explain_how_to_dry_run_a_pod() -> None:
    result = run_helm(
        "install", "gw", str(CHART), "--namespace", NAMESPACE, "--dry-run=client", "--debug"
    )
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl apply --dry-run=server" in notes
    assert "gpuwarden apply   --policies policies.yaml" in notes


def _containers(renderings: dict[str, Rendering]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for values in ("", "self-managed-tls.yaml"):
        for workload in [
            *renderings[values].all("Deployment"),
            *renderings[values].all("DaemonSet"),
        ]:
            kind = workload["kind"]
            pod = workload["spec"]["template"]["spec"]
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                found[f"{values or 'defaults'}:{kind}:{container['name']}"] = container["args"]
    return found


@pytest.mark.parametrize(
    "which",
    [
        "defaults:Deployment:webhook",
        "self-managed-tls.yaml:Deployment:webhook",
        "defaults:DaemonSet:node-agent",
        "self-managed-tls.yaml:Deployment:certs",
        "defaults:Deployment:tenant-controller",
    ],
)
def test_container_args_parse_with_the_real_cli(
    which: str, renderings: dict[str, Rendering], capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwarden.cli import build_parser

    args = _containers(renderings)[which]
    try:
        build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"{which}: gpuwarden rejects {args}: {capsys.readouterr().err}")


def test_the_enforcement_action_reaches_serve(default: Rendering) -> None:
    """webhook.enforcementAction is serve's --enforcement-action: the default for the served
    policies (issue 32, item 1); a value serve would refuse fails at template time."""

    def action(rendering: Rendering) -> str:
        container = rendering.one("Deployment", f"{FULLNAME}-webhook")["spec"]["template"]["spec"][
            "containers"
        ][0]
        return config_from(build_parser().parse_args(container["args"])).settings.enforcement_action

    assert action(default) == "enforce"
    assert action(template(sets={"webhook.enforcementAction": "audit"})) == "audit"
    assert action(template(sets={"webhook.enforcementAction": "dryrun"})) == "dryrun"
    assert "one of enforce, audit, dryrun" in template_error(
        sets={"webhook.enforcementAction": "Audit"}
    )
