"""The chart's NetworkPolicy: only the API server reaches the webhook port (issue 19, item 3),
on by default wherever the chart can tell where the API server calls from (issue 29, item 1).

Rendered by the real helm binary and validated against the Kubernetes schema; the lookup of the
API server's addresses is checked against a real kube-apiserver in the e2e-marked test.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from .support import (
    CHART,
    FULLNAME,
    NAMESPACE,
    RELEASE,
    Rendering,
    release_plane,
    run_helm,
    template,
)

pytestmark = pytest.mark.helm

KUBERNETES_VERSION = "1.37"  # as test_chart.py: the e2e control plane's version
POLICY = f"{FULLNAME}-webhook"
API_SERVER = {"networkPolicy.apiServerCIDRs": "{10.0.0.10/32,fd00::10/128}"}


def _values(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _rules(policy: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Ingress rules by the (one) port each admits."""
    rules: dict[str, dict[str, Any]] = {}
    for rule in policy["spec"]["ingress"]:
        (port,) = rule["ports"]
        assert port["protocol"] == "TCP"
        rules[port["port"]] = rule
    return rules


def _valid(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_only_the_api_server_reaches_the_webhook_port() -> None:
    rendering = template(sets=API_SERVER)
    policy = rendering.one("NetworkPolicy", POLICY)
    _valid(policy)
    deployment = rendering.one("Deployment", f"{FULLNAME}-webhook")
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: watches, lookups
    rules = _rules(policy)
    assert set(rules) == {"https", "metrics"}
    assert rules["https"]["from"] == [
        {"ipBlock": {"cidr": "10.0.0.10/32"}},
        {"ipBlock": {"cidr": "fd00::10/128"}},
    ]
    assert "from" not in rules["metrics"]  # Prometheus, wherever it runs
    # The rules name the container's ports, so a changed port number follows.
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {port["name"] for port in container["ports"]} == set(rules)


def test_values_widen_the_webhook_port_and_narrow_the_metrics_port(tmp_path: Path) -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    values = {
        "networkPolicy": {
            "enabled": True,
            "apiServerCIDRs": ["10.0.0.10/32"],
            "webhookFrom": [{"ipBlock": {"cidr": "172.16.0.0/12"}}],
            "metricsFrom": [monitoring],
        }
    }
    policy = template([_values(tmp_path, values)]).one("NetworkPolicy", POLICY)
    _valid(policy)
    rules = _rules(policy)
    assert rules["https"]["from"] == [
        {"ipBlock": {"cidr": "10.0.0.10/32"}},
        {"ipBlock": {"cidr": "172.16.0.0/12"}},
    ]
    assert rules["metrics"]["from"] == [monitoring]


def test_widened_to_every_source_without_knowing_the_api_server(tmp_path: Path) -> None:
    values = {
        "networkPolicy": {"enabled": True, "webhookFrom": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}
    }
    policy = template([_values(tmp_path, values)]).one("NetworkPolicy", POLICY)
    _valid(policy)
    assert _rules(policy)["https"]["from"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]


def test_no_policy_that_would_shut_the_api_server_out() -> None:
    # On by default, but `helm template` reaches no cluster, so the lookup finds no address:
    # nothing is rendered, and the notes say so.
    assert not template().all("NetworkPolicy")
    # And the policy can be turned off.
    sets = {**API_SERVER, "networkPolicy.enabled": "false"}
    assert not template(sets=sets).all("NetworkPolicy")


def _notes(sets: dict[str, str]) -> str:
    args = [f"--set={key}={value}" for key, value in sets.items()]
    result = run_helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args
    )
    return " ".join(result.stdout.split("NOTES:", 1)[1].split())


def test_the_notes_say_what_the_webhook_port_admits_or_why_no_policy() -> None:
    notes = _notes({"tls.mode": "self-managed"})
    assert "No NetworkPolicy rendered: the API server's addresses could not be read" in notes
    assert "set networkPolicy.apiServerCIDRs" in notes
    notes = _notes({"tls.mode": "self-managed", **API_SERVER})
    assert (
        f'NetworkPolicy "{FULLNAME}-webhook": the webhook\'s HTTPS port admits only '
        "10.0.0.10/32, fd00::10/128." in notes
    )
    assert "add it to networkPolicy.webhookFrom, or set networkPolicy.enabled=false" in notes
    assert "NetworkPolicy" not in _notes(
        {"tls.mode": "self-managed", "networkPolicy.enabled": "false"}
    )


def test_helm_lint_strict_with_the_policy() -> None:
    args = [f"--set={key}={value}" for key, value in API_SERVER.items()]
    result = run_helm("lint", "--strict", str(CHART), *args)
    assert "0 chart(s) failed" in result.stdout


# Against a real API server ---------------------------------------------------------------

from e2e.controlplane import ControlPlane  # noqa: E402


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with release_plane() as control_plane:
        yield control_plane


def _template_against(plane: ControlPlane) -> list[dict[str, Any]]:
    """`helm template` with lookups answered by the control plane."""
    result = subprocess.run(
        [
            str(plane.helm_path),
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--dry-run=server",
            "--kubeconfig",
            str(plane.kubeconfig_path),
            # The server-side dry run maps every object; this plane has no cert-manager kinds.
            "--set",
            "tls.mode=self-managed",
            "--set",
            "networkPolicy.enabled=true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return Rendering(tuple(d for d in yaml.safe_load_all(result.stdout) if d)).all("NetworkPolicy")


# What a kube-apiserver publishes for itself (this control plane runs without its endpoint
# reconciler, so the test publishes it): two API servers behind the `kubernetes` Service.
API_SERVER_SLICE = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {
        "name": "kubernetes",
        "namespace": "default",
        "labels": {"kubernetes.io/service-name": "kubernetes"},
    },
    "addressType": "IPv4",
    "endpoints": [{"addresses": ["192.0.2.10"]}, {"addresses": ["192.0.2.11"]}],
    "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
}


KONNECTIVITY = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {label: "konnectivity-agent"}},
    }
    for label in ("k8s-app", "app")
]


def _control_plane_node(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    """A control-plane node as kubeadm registers it, with its CNI's annotations."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"node-role.kubernetes.io/control-plane": ""},
            "annotations": annotations,
        },
        "spec": {"podCIDRs": ["10.244.0.0/24"]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": "192.0.2.10"},
                {"type": "Hostname", "address": name},
            ]
        },
    }


def _apply(plane: ControlPlane, obj: dict[str, Any]) -> None:
    created = plane.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)
    assert created.returncode == 0, created.stderr


@pytest.mark.e2e
def test_installed_on_a_cluster_it_admits_the_addresses_the_api_server_calls_from(
    plane: ControlPlane,
) -> None:
    # No EndpointSlice to read: no policy (the API server must never be shut out).
    assert not _template_against(plane)
    _apply(plane, API_SERVER_SLICE)
    (policy,) = _template_against(plane)
    assert _rules(policy)["https"]["from"] == [
        {"ipBlock": {"cidr": "192.0.2.10/32"}},
        {"ipBlock": {"cidr": "192.0.2.11/32"}},
        *KONNECTIVITY,
    ]
    applied = plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(policy), check=False
    )
    assert applied.returncode == 0, applied.stderr

    # A self-hosted control plane on Calico (IPIP): its calls to pods on other nodes come from
    # the tunnel address Calico records on the node, or its pod CIDR (Flannel).
    calico = {"projectcalico.org/IPv4IPIPTunnelAddr": "10.244.0.1"}
    _apply(plane, _control_plane_node("control-plane-1", calico))
    (policy,) = _template_against(plane)
    assert _rules(policy)["https"]["from"] == [
        {"ipBlock": {"cidr": "192.0.2.10/32"}},
        {"ipBlock": {"cidr": "192.0.2.11/32"}},
        {"ipBlock": {"cidr": "10.244.0.0/24"}},
        {"ipBlock": {"cidr": "10.244.0.1/32"}},
        *KONNECTIVITY,
    ]

    # On Cilium, ipBlocks do not match cluster nodes by default: no policy.
    cilium = {"network.cilium.io/ipv4-cilium-host": "10.244.0.5"}
    _apply(plane, _control_plane_node("control-plane-1", cilium))
    assert not _template_against(plane)
    plane.kubectl("delete", "node", "control-plane-1", check=False)
