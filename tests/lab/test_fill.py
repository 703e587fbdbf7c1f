"""The fill experiment (issue 33, item 6): FGD's arrivals-only fill to a share of the GPUs,
the allocation ratio, the MPS split, and `gpuwarden simulate --fill` on a small node list."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from gpuwarden.cli import main
from gpuwarden.lab.cluster.controlplane import Tools
from gpuwarden.lab.inputs.trace import TraceRow
from gpuwarden.lab.replay.fill import (
    FillPod,
    fill_manifest,
    fill_mps_nodes,
    fill_pod,
    fill_pods,
    fill_ratios,
)

FIXTURES = Path(__file__).resolve().parent / "alibaba"


def _row(row: int, gpus: float, name: str = "") -> TraceRow:
    return TraceRow(
        row=row,
        at=float(row),
        namespace="batch",
        kind="katib-trial",
        name=name or f"pod-{row}",
        gpus=gpus,
        duration=60.0,
        memory_used=Decimal(0),
    )


def test_a_trace_row_becomes_a_share_of_a_gpu_or_whole_gpus() -> None:
    assert fill_pod(_row(1, 0.25)) == FillPod("pod-1", 0, 250)
    assert fill_pod(_row(2, 2.0)) == FillPod("pod-2", 2, 2000)
    assert fill_pod(_row(3, 0.25)).slices(4) == 1
    assert FillPod("p", 0, 300).slices(4) == 2  # 0.3 of a GPU: 1.2 quarter slices, rounded up
    assert FillPod("p", 1, 1000).slices(4) == 0


def test_fill_appends_random_copies_until_the_next_would_pass_the_target() -> None:
    rows = [_row(1, 1.0), _row(2, 0.5)]
    pods = fill_pods(rows, capacity_gpus=4, target=1.3, seed=7, shuffle=False)
    # 130% of 4 GPUs: 5.2 GPUs; the trace's own pods first, in order, then the copies.
    assert [p.name for p in pods[:2]] == ["pod-1", "pod-2"]
    copies = pods[2:]
    assert [p.name.rsplit("-tuned-", 1)[1] for p in copies] == [str(i) for i in range(len(copies))]
    asked = sum(p.milli for p in pods)
    assert asked <= 5200
    # The draw that ended it would have passed 5.2: at most 1 GPU (the largest pod) was left.
    assert asked > 5200 - 1000
    assert pods == fill_pods(rows, capacity_gpus=4, target=1.3, seed=7, shuffle=False)
    # FGD's published runs shuffle the trace's pods first; the copies still come last.
    shuffled = fill_pods([_row(i, 0.1) for i in range(1, 21)], 4, 1.3, seed=1)
    firsts = [p.name for p in shuffled[:20]]
    assert sorted(firsts) == sorted(f"pod-{i}" for i in range(1, 21))
    assert firsts != [f"pod-{i}" for i in range(1, 21)]


def test_fill_removes_random_pods_when_the_trace_asks_more_than_the_target() -> None:
    rows = [_row(i, 1.0) for i in range(1, 11)]  # 10 GPUs asked
    pods = fill_pods(rows, capacity_gpus=4, target=1.3, seed=0, shuffle=False)
    assert len(pods) == 5  # 5 GPUs <= 5.2, the trace's order kept
    names = [p.name for p in pods]
    assert names == sorted(names, key=lambda n: int(n.split("-")[1]))


@pytest.mark.parametrize(
    ("capacity", "target", "message"),
    [(0, 1.3, "above 0"), (4, 0.0, "above 0"), (4, float("nan"), "above 0")],
)
def test_fill_refuses_an_empty_cluster_or_target(
    capacity: int, target: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        fill_pods([_row(1, 1.0)], capacity, target, 0)
    with pytest.raises(ValueError, match="no pod"):
        fill_pods([], 4, 1.3, 0)


def test_allocation_ratio_by_hand() -> None:
    pods = [FillPod("a", 2, 2000), FillPod("b", 0, 300), FillPod("c", 0, 600)]
    ratios = fill_ratios(pods, {0, 1}, capacity_gpus=4, replicas=4)
    # Placed: 2 GPUs and 0.3 of one, of 4: 57.5%; b holds 2 quarter slices: 2.5 of 4, 62.5%.
    assert (ratios.asked, ratios.slices) == (0.575, 0.625)
    assert (ratios.placed, ratios.failed) == (2, 1)


def test_the_mps_nodes_come_nearest_to_the_shared_part_of_what_is_asked() -> None:
    shared = [FillPod(f"s{i}", 0, 250) for i in range(16)]  # 16 quarter slices: 4 GPUs
    whole = [FillPod("w", 8, 8000), FillPod("x", 4, 4000)]  # 12 GPUs
    # 20 GPUs x 4/16 = 5 GPUs: the first 8-GPU node is nearest (8 against 16).
    assert fill_mps_nodes([8, 8, 2, 2], [*shared, *whole], 4) == 1
    # All shared: every node shares (FGD shares any GPU); none left whole for no one.
    assert fill_mps_nodes([2, 2, 2, 2], shared, 4) == 4
    # 3 of 4 GPUs' worth shared on 8 + 8 + 2 + 2: 15 GPUs, nearest at 2 nodes (16).
    assert fill_mps_nodes([8, 8, 2, 2], [*shared * 3, FillPod("w", 4, 4000)], 4) == 2
    # Nothing shared: no MPS node; whole GPUs asked: one node stays whole.
    assert fill_mps_nodes([8, 8], whole, 4) == 0
    assert fill_mps_nodes([8, 8], [*shared * 10, *whole], 4) == 1


def test_the_pod_asks_slices_or_whole_gpus_of_the_profile_and_its_products() -> None:
    shared = fill_manifest(FillPod("t", 0, 300, ("Tesla-T4",)), 3, "gpuwarden-binpack", 4, 0)
    assert shared["metadata"]["name"] == "fill-3"
    assert shared["spec"]["schedulerName"] == "gpuwarden-binpack"
    limits = shared["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu.shared": "2"}
    terms = shared["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["Tesla-T4"]
    whole = fill_manifest(FillPod("w", 8, 8000), 4, "default-scheduler", 4, 0)
    assert whole["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert "affinity" not in whole["spec"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fill", "0"], "--fill 0.0: a share of the GPUs above 0"),
        (["--fill", "1.3", "--only", "default-policy"], "--only: --fill compares"),
        (["--fill", "1.3", "--node-sample", "3"], "--node-sample: only with --node-list"),
        (
            ["--fill", "1.3", "--node-list", str(FIXTURES / "nodes.csv"), "--node-sample", "0"],
            "--node-sample must be 1 or more",
        ),
        (
            ["--fill", "1.3", "--node-list", str(FIXTURES / "nodes.csv"), "--node-sample", "99"],
            "nodes.csv: node sample 99: the list has only 8 GPU nodes",
        ),
    ],
)
def test_bad_fill_options_are_named(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--trace", str(FIXTURES / "pods.csv"), *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.e2e
def test_fill_on_a_fixture_node_list_reports_each_profile(e2e_tools: Tools) -> None:
    del e2e_tools  # the lab's tools must be built
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "simulate",
            "--trace",
            str(FIXTURES / "pods.csv"),
            "--node-list",
            str(FIXTURES / "nodes.csv"),
            "--node-sample",
            "2",
            "--seed",
            "3",
            "--fill",
            "1.3",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert [s["scheduler"] for s in body["schedulers"]] == [
        "default-scheduler",
        "gpuwarden-binpack",
    ]
    for run in body["schedulers"]:
        assert run["placed"] + run["failed"] == body["pods"]
        assert 0 < run["allocationRatio"] <= 1
        assert run["allocationRatio"] <= run["sliceRatio"] <= 1
