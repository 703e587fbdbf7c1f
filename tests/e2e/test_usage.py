"""`gpuwarden usage` end to end: a real Prometheus (built from github.com/prometheus/prometheus by
hack/build-tools.sh) scrapes a node agent running on the fake NVML, evaluates the chart's
recording rules as rendered, and the command reads the showback from its HTTP API.

The cluster side is three tenants' pods handed to the agent as the API server would list them (the
agent's Kubernetes side has its own e2e, tests/node/test_kube_e2e.py); NVML is the fake at its
interface boundary, with a busy process sampled before every pass.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import start_http_server

from gpuwarden.cli import main
from gpuwarden.node.agent import AgentConfig, NodeAgent
from gpuwarden.node.fake import FakeNvml
from gpuwarden.node.metrics import agent_registry
from gpuwarden.node.procfs import ProcFs

from .controlplane import free_ports
from .prometheus import built_tool

pytestmark = pytest.mark.e2e

GiB = 2**30
REPO = Path(__file__).resolve().parents[2]
# Where the table of the last run is left for the docs and the closing note.
TABLE_OUT = Path("/tmp/gpuwarden-usage-e2e-table.txt")


def pod(name: str, uid: str, cid: str, tenant: str, profile: str, **record: str) -> dict[str, Any]:
    annotations = {
        "gpuwarden.io/tenant": tenant,
        "gpuwarden.io/profile": profile,
        "gpuwarden.io/containers": "main",
        "gpuwarden.io/gpu-count": "1",
        **{f"gpuwarden.io/{key}": value for key, value in record.items()},
    }
    return {
        "metadata": {"name": name, "namespace": tenant, "uid": uid, "annotations": annotations},
        "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "main", "image": "x"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{cid}"}],
        },
    }


WHOLE = {"backend": "nvidia", "gpu-shared": "false"}
SLICE = {"backend": "hami", "gpu-shared": "true", "mps-thread-percentage": "25"}
PODS = [
    # team-a / gpu-1: a notebook idle on its GPU, and one at 80%
    pod("nb-idle", "00000001-0000-4000-8000-000000000001", f"{1:064x}", "team-a", "gpu-1", **WHOLE),
    pod("nb-busy", "00000002-0000-4000-8000-000000000002", f"{2:064x}", "team-a", "gpu-1", **WHOLE),
    # team-b / shared-small: two HAMi quarter GPUs on GPU 2, at 20% and 1% of the device
    pod(
        "slice-busy",
        "00000003-0000-4000-8000-000000000003",
        f"{3:064x}",
        "team-b",
        "shared-small",
        **SLICE,
    ),
    pod(
        "slice-idle",
        "00000004-0000-4000-8000-000000000004",
        f"{4:064x}",
        "team-b",
        "shared-small",
        **SLICE,
    ),
]
# PID, pod UID, container ID, GPU, SM %
PROCESSES = [
    (4002, "00000002-0000-4000-8000-000000000002", f"{2:064x}", 1, 80.0),
    (4003, "00000003-0000-4000-8000-000000000003", f"{3:064x}", 2, 20.0),
    (4004, "00000004-0000-4000-8000-000000000004", f"{4:064x}", 2, 1.0),
]


@pytest.fixture
def agent_url(tmp_path: Path) -> Iterator[str]:
    nvml = FakeNvml()
    for _ in range(3):
        nvml.add_gpu(40 * GiB)
    proc_root = tmp_path / "proc"
    for pid, uid, cid, gpu, _sm in PROCESSES:
        directory = proc_root / str(pid)
        directory.mkdir(parents=True)
        slice_uid = uid.replace("-", "_")
        (directory / "cgroup").write_text(
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{slice_uid}.slice/cri-containerd-{cid}.scope\n"
        )
        (directory / "status").write_text("Uid:\t1000\t1000\t1000\t1000\n")
        (directory / "comm").write_text("python\n")
        nvml.run(gpu, pid, 2 * GiB, mps_client=False)
    agent = NodeAgent(AgentConfig(node_name="gpu-node-1"), nvml, None, ProcFs(proc_root))
    agent.start()
    stop = threading.Event()

    def passes() -> None:
        while not stop.is_set():
            for pid, _uid, _cid, gpu, sm in PROCESSES:
                nvml.sample(gpu, pid, sm, sm / 2)
            agent.tick(PODS)
            stop.wait(0.5)

    (port,) = free_ports(1)
    server, _ = start_http_server(port, addr="127.0.0.1", registry=agent_registry(agent))
    loop = threading.Thread(target=passes, daemon=True)
    loop.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop.set()
        loop.join(timeout=10)
        server.shutdown()


def chart_rules(path: Path) -> None:
    """The chart's PrometheusRule groups as a rule file, evaluated every second here."""
    from chart.support import template

    rule = template(
        (),
        {
            "monitoring.prometheusRule.enabled": "true",
            "monitoring.prometheusRule.usage.interval": "1s",
        },
    ).one("PrometheusRule")
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))


def instant(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            result: list[dict[str, Any]] = json.load(response)["data"]["result"]
            return result
    except OSError:
        return []  # not up yet


def wait_until_answered(base: str, expr: str, timeout: float = 90.0) -> None:
    """Poll Prometheus until the instant query ``expr`` returns a sample."""
    deadline = time.monotonic() + timeout
    while not instant(base, expr):
        if time.monotonic() > deadline:
            raise AssertionError(f"Prometheus at {base} gave no answer to {expr} in {timeout}s")
        time.sleep(0.2)


@pytest.fixture
def prometheus(tmp_path: Path, agent_url: str) -> Iterator[str]:
    binary = built_tool("PROMETHEUS")
    chart_rules(tmp_path / "rules.yaml")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [
            {"job_name": "gpuwarden-node-agent", "static_configs": [{"targets": [agent_url]}]}
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            str(binary),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def test_usage_reports_what_prometheus_recorded_from_the_node_agent(
    prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ten evaluations of the rules with every tenant's series present.
    wait_until_answered(
        prometheus, 'count_over_time(gpuwarden:tenant_gpus_busy{tenant="team-b"}[1m]) >= 10'
    )
    assert (
        main(["usage", "--prometheus", prometheus, "--since", "10m", "--step", "1s", "-o", "json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    tenants = {(t["tenant"], t["profile"]): t for t in report["tenants"]}
    assert set(tenants) == {("team-a", "gpu-1"), ("team-b", "shared-small")}
    a, b = tenants["team-a", "gpu-1"], tenants["team-b", "shared-small"]
    # team-a holds 2 GPUs, keeps 0.8 busy, and 1 sits idle; team-b holds 2 x 0.25, busy 0.21
    # (of which 0.01 is the slice under 5% of its quarter, idle).
    assert a["efficiency"] == pytest.approx(0.4, abs=0.02)
    assert a["gpu_hours_idle"] == pytest.approx(a["gpu_hours_allocated"] / 2, rel=0.05)
    assert b["efficiency"] == pytest.approx(0.42, abs=0.02)
    assert b["gpu_hours_idle"] == pytest.approx(b["gpu_hours_allocated"] / 2, rel=0.05)
    assert a["gpu_memory_gib_hours"] > 0
    assert [p["pod"] for p in report["idle_pods"]] == ["nb-idle", "slice-idle"]

    assert main(["usage", "--prometheus", prometheus, "--since", "10m", "--step", "1s"]) == 0
    table = capsys.readouterr().out
    assert "team-a  gpu-1" in table and "Pods holding the most idle GPU-hours" in table
    TABLE_OUT.write_text(table)
