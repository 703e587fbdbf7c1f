"""The chart's poolController (issue 33 item 4): off by default; on, `gpuwarden pool-controller`
with the policies ConfigMap the webhook mounts, and RBAC to read pods and patch nodes only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.cli import build_parser
from gpuwarden.policy import load_paths
from gpuwarden.policy.render.pools import pool_settings

from .support import FULLNAME, Rendering, assert_restricted, template, template_error

pytestmark = pytest.mark.helm

NAME = f"{FULLNAME}-pool-controller"


@pytest.fixture(scope="module")
def pools() -> Rendering:
    return template(["pools.yaml"])


def test_off_by_default() -> None:
    rendering = template()
    assert [o for o in rendering.objects if o["metadata"]["name"] == NAME] == []


def test_the_deployment_runs_the_command_on_the_mounted_policies(
    pools: Rendering, tmp_path: Path
) -> None:
    deployment = pools.one("Deployment", NAME)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "pool-controller" and args.interval == 5.0
    (mount,) = container["volumeMounts"]
    assert args.policies == [Path(mount["mountPath"])]
    (volume,) = pod["volumes"]
    assert volume["name"] == mount["name"]
    config_map = pools.one("ConfigMap", volume["configMap"]["name"])
    for key, text in config_map["data"].items():
        (tmp_path / key).write_text(text)
    found = pool_settings(load_paths([tmp_path]))
    assert found is not None and (found.pools.whole_config, found.replicas) == ("whole", 4)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert_restricted(container["securityContext"])
    assert pod["serviceAccountName"] == NAME


def test_rbac_reads_pods_and_patches_nodes_only(pools: Rendering) -> None:
    role = pools.one("ClusterRole", NAME)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    binding = pools.one("ClusterRoleBinding", NAME)
    assert binding["roleRef"]["name"] == NAME
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": NAME, "namespace": "gpu-system"}
    ]
    assert pools.one("ServiceAccount", NAME)["automountServiceAccountToken"] is False


def test_enabled_without_pools_fails_at_install_time() -> None:
    assert "poolController.enabled needs a policy in policies whose nvidia backend sets pools" in (
        template_error(sets={"poolController.enabled": "true"})
    )
