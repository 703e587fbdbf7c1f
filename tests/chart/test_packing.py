"""The chart's packing schedulers, rendered from values, against gpuwarden.policy.render.packing.

The second kube-scheduler's profile and Volcano's binpack arguments are template logic over
values; these tests hold them equal to binpack_profile() and volcano_binpack_arguments(), and
check the scheduler's objects the way the cluster would: the Kubernetes schema, the real
kube-scheduler reading its configuration, and a real API server (dry run).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuwarden.lab.cluster.controlplane import ControlPlane, Tools
from gpuwarden.policy.render.packing import (
    BINPACK_SCHEDULER,
    binpack_profile,
    volcano_binpack_arguments,
)

from .support import (
    CHART,
    FULLNAME,
    NAMESPACE,
    RELEASE,
    Rendering,
    assert_restricted,
    helm_args,
    run_helm,
    template,
    template_error,
)

pytestmark = pytest.mark.helm

BOTH = "binpack.yaml"  # binpackScheduler and volcanoBinpack on, two replicas
SCHEDULER = f"{FULLNAME}-binpack-scheduler"
VOLCANO_CONFIG = f"{FULLNAME}-volcano-scheduler"
CONFIG_DIR = "/etc/kubernetes/gpuwarden-binpack"
KUBERNETES_VERSION = "1.37"  # as test_chart.py: the e2e control plane's version
# volcano-sh/volcano installer/helm/chart/volcano/config/volcano-scheduler.conf (master).
VOLCANO_ACTIONS = "enqueue, allocate, backfill"
VOLCANO_TIERS = [
    ["priority", "gang", "conformance"],
    ["overcommit", "drf", "predicates", "proportion", "nodeorder", "binpack"],
]


@pytest.fixture(scope="module")
def both() -> Rendering:
    return template([BOTH])


def scheduler_configuration(rendering: Rendering) -> dict[str, Any]:
    text = rendering.one("ConfigMap", SCHEDULER)["data"]["config.yaml"]
    config = yaml.safe_load(text)
    assert isinstance(config, dict)
    return config


def volcano_configuration(rendering: Rendering) -> dict[str, Any]:
    text = rendering.one("ConfigMap", VOLCANO_CONFIG)["data"]["volcano-scheduler.conf"]
    config = yaml.safe_load(text)
    assert isinstance(config, dict)
    return config


def names(rendering: Rendering) -> set[tuple[str, str]]:
    return {(obj["kind"], obj["metadata"]["name"]) for obj in rendering.objects}


def test_scheduler_profile_is_binpack_profile(both: Rendering) -> None:
    config = scheduler_configuration(both)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"] == [binpack_profile()]
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceName": BINPACK_SCHEDULER,
        "resourceNamespace": NAMESPACE,
    }


def test_scheduler_profile_follows_values(tmp_path: Path) -> None:
    rendering = template(
        sets={"binpackScheduler.enabled": "true", "binpackScheduler.schedulerName": "other"}
    )
    config = scheduler_configuration(rendering)
    assert config["profiles"] == [binpack_profile("other")]
    assert config["leaderElection"]["resourceName"] == "other"
    assert rendering.one("Role", SCHEDULER)["rules"][1]["resourceNames"] == ["other"]
    # The weights and the scoring share are values too, not copies of the module's constants.
    values = tmp_path / "lighter.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "binpackScheduler": {
                    "enabled": True,
                    "percentageOfNodesToScore": 50,
                    "nodeResourcesFitWeight": 2,
                    "resources": [{"name": "nvidia.com/gpu", "weight": 3}],
                }
            }
        )
    )
    expected = binpack_profile()
    expected["percentageOfNodesToScore"] = 50
    expected["plugins"]["score"]["enabled"] = [{"name": "NodeResourcesFit", "weight": 2}]
    strategy = expected["pluginConfig"][0]["args"]["scoringStrategy"]
    strategy["resources"] = [{"name": "nvidia.com/gpu", "weight": 3}]
    assert scheduler_configuration(template([values]))["profiles"] == [expected]


def test_volcano_binpack_arguments_are_the_module_ones(both: Rendering) -> None:
    config = volcano_configuration(both)
    assert config["actions"] == VOLCANO_ACTIONS
    tiers = [[plugin["name"] for plugin in tier["plugins"]] for tier in config["tiers"]]
    assert tiers == VOLCANO_TIERS
    plugins = {plugin["name"]: plugin for tier in config["tiers"] for plugin in tier["plugins"]}
    assert plugins["gang"]["enablePreemptable"] is False
    assert plugins["drf"]["enablePreemptable"] is False
    assert plugins["binpack"]["arguments"] == volcano_binpack_arguments()
    # Only binpack carries arguments: the rest is Volcano's default as it ships.
    assert [name for name, plugin in plugins.items() if set(plugin) - {"name"}] == [
        "gang",
        "drf",
        "binpack",
    ]


def test_volcano_config_is_on_by_default_and_the_scheduler_off(both: Rendering) -> None:
    default = template()
    off = template(sets={"binpackScheduler.enabled": "false", "volcanoBinpack.enabled": "false"})
    assert names(default) - names(off) == {("ConfigMap", VOLCANO_CONFIG)}
    assert names(both) - names(default) == {
        ("ServiceAccount", SCHEDULER),
        ("ClusterRoleBinding", SCHEDULER),
        ("ClusterRoleBinding", f"{SCHEDULER}-volume"),
        ("RoleBinding", f"{SCHEDULER}-authentication-reader"),
        ("Role", SCHEDULER),
        ("RoleBinding", SCHEDULER),
        ("ConfigMap", SCHEDULER),
        ("Deployment", SCHEDULER),
    }
    assert not {name for _, name in names(off) if name.startswith(SCHEDULER)}


def test_each_can_be_turned_on_alone() -> None:
    scheduler = names(
        template(sets={"binpackScheduler.enabled": "true", "volcanoBinpack.enabled": "false"})
    )
    volcano = names(template(sets={"volcanoBinpack.enabled": "true"}))
    assert ("Deployment", SCHEDULER) in scheduler
    assert ("ConfigMap", VOLCANO_CONFIG) not in scheduler
    assert ("ConfigMap", VOLCANO_CONFIG) in volcano
    assert not {name for _, name in volcano if name.startswith(SCHEDULER)}


def test_scheduler_deployment_runs_the_configuration_unprivileged(both: Rendering) -> None:
    deployment = both.one("Deployment", SCHEDULER)
    assert deployment["spec"]["replicas"] == 2
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    # Its selector must not pick the webhook's pods (nor theirs it).
    webhook = both.one("Deployment", f"{FULLNAME}-webhook")
    webhook_labels = webhook["spec"]["template"]["metadata"]["labels"]
    assert not deployment["spec"]["selector"]["matchLabels"].items() <= webhook_labels.items()
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == both.one("ServiceAccount", SCHEDULER)["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["image"] == "registry.k8s.io/kube-scheduler:v1.37.2"
    assert container["command"] == ["kube-scheduler", f"--config={CONFIG_DIR}/config.yaml"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[CONFIG_DIR]]["configMap"]["name"] == SCHEDULER
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["scheme"], ports[get["port"]]) == (path, "HTTPS", 10259)
    assert_restricted(container["securityContext"])
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}


def test_scheduler_rbac_is_the_documented_second_scheduler_set(both: Rendering) -> None:
    subject = [{"kind": "ServiceAccount", "name": SCHEDULER, "namespace": NAMESPACE}]
    cluster = {
        b["roleRef"]["name"]: b
        for b in both.all("ClusterRoleBinding")
        if b["metadata"]["name"].startswith(SCHEDULER)
    }
    assert set(cluster) == {"system:kube-scheduler", "system:volume-scheduler"}
    for binding in cluster.values():
        assert binding["roleRef"]["kind"] == "ClusterRole"
        assert binding["subjects"] == subject
    reader = both.one("RoleBinding", f"{SCHEDULER}-authentication-reader")
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "extension-apiserver-authentication-reader",
    }
    assert reader["subjects"] == subject
    role = both.one("Role", SCHEDULER)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [BINPACK_SCHEDULER],
            "verbs": ["get", "update"],
        },
    ]
    binding = both.one("RoleBinding", SCHEDULER)
    assert binding["roleRef"]["name"] == SCHEDULER and binding["subjects"] == subject


def test_without_leader_election_one_replica_and_no_lease_role() -> None:
    sets = {"binpackScheduler.enabled": "true", "binpackScheduler.leaderElection": "false"}
    rendering = template(sets=sets)
    assert scheduler_configuration(rendering)["leaderElection"]["leaderElect"] is False
    assert rendering.all("Role") == []
    error = template_error(sets={**sets, "binpackScheduler.replicas": "2"})
    assert "needs binpackScheduler.leaderElection" in error


def test_objects_validate_against_the_kubernetes_schema(both: Rendering) -> None:
    ours = [
        obj
        for obj in both.objects
        if obj["metadata"]["name"] in (SCHEDULER, VOLCANO_CONFIG)
        or obj["metadata"]["name"].startswith(f"{SCHEDULER}-")
    ]
    assert len(ours) == 9
    for obj in ours:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_helm_lint_strict() -> None:
    result = run_helm("lint", "--strict", str(CHART), *helm_args([BOTH]))
    assert "0 chart(s) failed" in result.stdout


def test_notes_say_how_to_use_them() -> None:
    def notes(*values: str) -> str:
        result = run_helm(
            "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client",
            *helm_args(values),
        )  # fmt: skip
        return result.stdout.split("NOTES:", 1)[1]

    on = notes(BOTH)
    assert f"backend: {{type: nvidia, schedulerName: {BINPACK_SCHEDULER}}}" in on
    assert VOLCANO_CONFIG in on and "custom.scheduler_config_override" in on
    default = notes()
    assert BINPACK_SCHEDULER not in default and VOLCANO_CONFIG in default


def test_kube_scheduler_accepts_the_configuration(
    both: Rendering, e2e_tools: Tools, tmp_path: Path
) -> None:
    """The real kube-scheduler decodes it strictly, builds the profile's plugins and writes
    the defaulted configuration back (--write-config-to exits before connecting anywhere)."""
    assert e2e_tools.kube_scheduler is not None, "tools.env names no KUBE_SCHEDULER"
    config = tmp_path / "config.yaml"
    config.write_text(both.one("ConfigMap", SCHEDULER)["data"]["config.yaml"])
    written = tmp_path / "written.yaml"
    result = subprocess.run(
        [
            str(e2e_tools.kube_scheduler),
            f"--config={config}",
            "--master=https://127.0.0.1:1",  # never contacted; only to build a client
            f"--write-config-to={written}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    defaulted = yaml.safe_load(written.read_text())
    (profile,) = defaulted["profiles"]
    expected = binpack_profile()
    assert profile["schedulerName"] == expected["schedulerName"]
    assert profile["percentageOfNodesToScore"] == expected["percentageOfNodesToScore"]
    args = {c["name"]: c["args"] for c in profile["pluginConfig"]}
    strategy = args["NodeResourcesFit"]["scoringStrategy"]
    assert strategy == expected["pluginConfig"][0]["args"]["scoringStrategy"]
    # The score plugins as kube-scheduler resolved them: Fit weighted, BalancedAllocation off.
    score = profile["plugins"]["score"]
    assert score["enabled"] == expected["plugins"]["score"]["enabled"]
    assert [p["name"] for p in score["disabled"]] == ["NodeResourcesBalancedAllocation"]


@pytest.mark.e2e
def test_the_api_server_accepts_the_objects(control_plane: ControlPlane, namespace: str) -> None:
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, *helm_args([BOTH])]
    objects = [
        doc
        for doc in yaml.safe_load_all(run_helm(*args).stdout)
        if doc and doc["metadata"]["name"].startswith((SCHEDULER, VOLCANO_CONFIG))
    ]
    assert len(objects) == 9
    result = control_plane.kubectl(
        "apply",
        "-f",
        "-",
        "--dry-run=server",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
        check=False,
    )
    assert result.returncode == 0, result.stderr
