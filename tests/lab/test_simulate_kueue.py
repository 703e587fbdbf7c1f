"""`gpuwarden simulate` with tenant queues (NAME+kueue): the real Kueue admits the replayed pods
against each tenant's ClusterQueue, and the report says per tenant what it was entitled to, what
it got, what it borrowed and what reclaim cost it."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from gpuwarden.lab.cluster.controlplane import Tools
from gpuwarden.lab.cluster.kueue import preemption_reason
from gpuwarden.lab.planning.strategies import entitled_quotas
from gpuwarden.lab.replay.records import PodRecord
from gpuwarden.lab.reporting.report import summarize, table

from .conftest import LAB_POLICIES, simulate_json

# One node of 4 GPUs; the batch and algo teams ask for 8 GPU-hours each, so each is entitled
# to 2 GPUs. The batch team's four one-GPU trials (2 h, no checkpoints) find the cluster idle
# and take all 4, borrowing the algo team's 2. An hour later the algo team's two trials (4 h)
# arrive: with tenant queues Kueue reclaims the 2 borrowed GPUs at once, and the two trials it
# preempted are recreated and run when the batch team's own quota frees up. Without queues the
# algo team waits until the batch team's trials end.
TRACE = """\
rows:
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 2h, memory: 30Gi}
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 2h, memory: 30Gi}
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 2h, memory: 30Gi}
  - {at: 0, namespace: batch, kind: katib-trial, name: hpo, gpus: 1, duration: 2h, memory: 30Gi}
  - {at: 1h, namespace: algo-team, kind: katib-trial, name: sweep, gpus: 1, duration: 4h, memory: 30Gi}
  - {at: 1h, namespace: algo-team, kind: katib-trial, name: sweep, gpus: 1, duration: 4h, memory: 30Gi}
"""
LAYOUT = ["--nodes=1", "--gpus-per-node=4", "--mps-nodes=0", "--horizon=5h"]


def _png_height(path: Path) -> int:
    """The image's height in pixels, from the PNG's IHDR chunk."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    height: int = struct.unpack(">I", header[20:24])[0]
    return height


@pytest.mark.e2e
def test_tenant_queues_reclaim_borrowed_gpus_and_report_each_tenants_share(
    e2e_tools: Tools, tmp_path: Path
) -> None:
    del e2e_tools  # the tools env: the command finds Kueue and the lab's binaries through it
    trace = tmp_path / "trace.yaml"
    trace.write_text(TRACE)
    plot = tmp_path / "shares.png"
    body = simulate_json(
        f"--trace={trace}",
        f"--policies=lab={LAB_POLICIES}",
        "--only=lab,lab+kueue",
        "--real-time=20",
        f"--plot={plot}",
        *LAYOUT,
        timeout=240,
    )
    reports = {s["strategy"]: s for s in body["strategies"]}
    plain, queued = reports["lab"], reports["lab+kueue"]
    assert plain["tenantQueues"] == {}
    queues = queued["tenantQueues"]
    batch, algo = queues["batch"], queues["algo-team"]

    # Entitled: the 4 GPUs split by what each tenant asks for; the idle tenants get none.
    assert {t: q["nominalGpus"] for t, q in queues.items()} == {
        "algo-team": 2,
        "batch": 2,
        "data-team": 0,
        "serving": 0,
    }
    assert (batch["entitledShare"], algo["entitledShare"]) == (0.5, 0.5)
    # Borrowing: the batch team held 2 GPUs above its quota for about an hour, until Kueue
    # reclaimed them for the algo team; the hour of work on them was lost.
    assert batch["borrowedGpuHours"] == pytest.approx(2, abs=0.4)
    assert batch["kueuePreemptions"] == {"InCohortReclamation": 2}
    assert batch["reclaimedPods"] == 2
    assert batch["lostToReclaimGpuHours"] == pytest.approx(2, abs=0.4)
    assert (algo["borrowedGpuHours"], algo["reclaimedPods"]) == (0, 0)
    # The batch team had the whole cluster in the first hour, the algo team nothing.
    assert batch["receivedShare"][0] == pytest.approx(0.9, abs=0.1)
    assert algo["receivedShare"][0] == 0
    # Received shares add up to the GPUs allocated, hour by hour, and never pass the cluster.
    for hour, allocated in enumerate(queued["allocation"]):
        received = sum(q["receivedShare"][hour] for q in queues.values())
        assert received == pytest.approx(allocated, abs=0.02)
        assert received <= 1.0 + 1e-9
    held = sum(q["receivedGpuHours"] for q in queues.values())
    assert held == pytest.approx(queued["averageAllocation"] * 4 * 5, abs=0.1)

    # What it buys the tenant that lent: its trials start within minutes instead of waiting
    # for the batch team's to end, and it gets more of its work done.
    assert queued["waitSeconds"]["algo-team"]["p95"] < 20 * 60
    assert plain["waitSeconds"]["algo-team"]["p95"] > 50 * 60
    assert (
        queued["tenants"]["algo-team"]["deliveredGpuHours"]
        > plain["tenants"]["algo-team"]["deliveredGpuHours"] + 1
    )
    # The plot has a panel of tenant shares for the queued strategy (4 panels of 4 inches).
    assert _png_height(plot) == 1600


# --- the pure parts -----------------------------------------------------------------------


def test_entitled_quotas_split_the_gpus_by_demand_and_add_up() -> None:
    assert entitled_quotas({"a": 4914, "b": 2718, "c": 2309, "d": 1008}, 64) == {
        "a": 29,
        "b": 16,
        "c": 13,
        "d": 6,
    }
    assert entitled_quotas({"a": 1, "b": 1, "c": 1}, 4) == {"a": 2, "b": 1, "c": 1}
    assert entitled_quotas({"a": 0, "b": 0}, 8) == {"a": 0, "b": 0}


def test_kueue_preemption_reasons_are_read_from_the_pods_condition() -> None:
    message = (
        "Preempted to accommodate a workload (UID: u, JobUID: j) due to {}; preemptor path: "
        "/gpuwarden/a; preemptee path: /gpuwarden/b"
    )

    def stopped(words: str) -> list[dict[str, str]]:
        return [
            {
                "type": "TerminationTarget",
                "status": "True",
                "reason": "WorkloadEvictedDueToPreempted",
                "message": message.format(words),
            }
        ]

    assert preemption_reason(stopped("reclamation within the cohort")) == "InCohortReclamation"
    assert (
        preemption_reason(stopped("reclamation within the cohort while borrowing"))
        == "InCohortReclaimWhileBorrowing"
    )
    assert preemption_reason(stopped("Fair Sharing within the cohort")) == "InCohortFairSharing"
    assert preemption_reason(stopped("prioritization in the ClusterQueue")) == "InClusterQueue"
    # Stopped for another reason, or not by Kueue.
    other = [{**stopped("x")[0], "reason": "WorkloadDeleted"}]
    assert preemption_reason(other) is None
    assert preemption_reason([{"type": "PodScheduled", "status": "True"}]) is None


def test_tenant_queue_figures_and_their_table() -> None:
    hour = 3600.0
    records = [
        # Tenant a (quota 1) holds 2 GPUs for 2 hours; Kueue reclaims one after an hour.
        PodRecord("a-1", "a", 1, 0.0, whole=1, gpus=1.0, bound=0.0, ended=2 * hour),
        PodRecord(
            "a-2",
            "a",
            2,
            0.0,
            whole=1,
            gpus=1.0,
            bound=0.0,
            ended=hour,
            preempted=True,
            evicted_by="InCohortReclamation",
            lost=hour,
        ),
        # Tenant b (quota 1) takes its GPU back from the second hour on.
        PodRecord("b-1", "b", 3, hour, whole=1, gpus=1.0, bound=hour, ended=None),
    ]
    report = summarize(
        "x+kueue",
        records,
        [],
        physical_gpus=2,
        horizon=2 * hour,
        allocated=[(0.0, 2.0)],
        busy=[(0.0, 2.0)],
        quotas={"a": 1, "b": 1},
    )
    a, b = report.queues["a"], report.queues["b"]
    assert a["receivedShare"] == [1.0, 0.5]
    assert b["receivedShare"] == [0.0, 0.5]
    assert (a["borrowedGpuHours"], b["borrowedGpuHours"]) == (1.0, 0.0)
    assert (a["lostToReclaimGpuHours"], a["reclaimedPods"]) == (1.0, 1)
    assert a["receivedShareAverage"] == 0.75
    assert report.as_json()["tenantQueues"]["b"]["entitledShare"] == 0.5
    text = table([report])
    assert "tenant queues (Kueue): entitled/received share" in text
    assert "50%/75% 1/1" in text


@pytest.mark.parametrize(
    ("quota", "shared", "borrowed_hours"),
    [
        # No sharedGpus: each pool holds the whole quota of 1 GPU; the whole GPU is its own,
        # and of the 8 slices (a quarter GPU each, 2 GPUs) 1 GPU's worth is borrowed.
        (1, None, 1.0),
        # Quota 3, 1 of it on MPS: the whole GPU fits the 2 left, 1 GPU of slices is borrowed.
        (3, 1, 1.0),
        # Quota 3, all of it on MPS: the 2 GPUs of slices fit, the whole GPU is borrowed.
        (3, 3, 1.0),
        # Quota 3, 2 on MPS: both fit.
        (3, 2, 0.0),
    ],
)
def test_borrowing_counts_whole_gpus_and_mps_slices_against_their_part_of_the_quota(
    quota: int, shared: int | None, borrowed_hours: float
) -> None:
    hour = 3600.0
    records = [
        PodRecord("w", "a", 1, 0.0, whole=1, gpus=1.0, bound=0.0, ended=hour),
        PodRecord("s", "a", 2, 0.0, slices=8, gpus=2.0, bound=0.0, ended=hour),
    ]
    report = summarize(
        "x+kueue",
        records,
        [],
        physical_gpus=4,
        horizon=hour,
        allocated=[(0.0, 3.0)],
        busy=[(0.0, 1.0)],
        quotas={"a": quota},
        shared_quotas=None if shared is None else {"a": shared},
    )
    assert report.queues["a"]["borrowedGpuHours"] == borrowed_hours
    assert report.queues["a"]["receivedShare"] == [0.75]
    assert report.queues["a"].get("nominalSharedGpus") == shared
