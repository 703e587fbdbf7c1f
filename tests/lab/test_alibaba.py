"""The Alibaba cluster-trace-gpu-v2023 importer, without a cluster.

The CSV files under tests/lab/alibaba/ are made up, in the trace's format.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from gpuwarden.lab.inputs.alibaba import (
    MODEL_PRODUCTS,
    NODE_HEADER,
    POD_HEADER,
    QosMapping,
    is_alibaba_nodes,
    is_alibaba_pods,
    parse_alibaba_nodes,
    parse_alibaba_pods,
    parse_qos_mapping,
    products_for_spec,
)
from gpuwarden.lab.inputs.defaulttrace import PROFILE_NAMESPACE_LABELS
from gpuwarden.lab.inputs.trace import TraceError

SAMPLES = Path(__file__).parent / "alibaba"
PODS = (SAMPLES / "pods.csv").read_text()
NODES = (SAMPLES / "nodes.csv").read_text()
POD_LINE = ",".join(POD_HEADER) + "\n"
NODE_LINE = ",".join(NODE_HEADER) + "\n"
MIB = 2**20


def _pods(*rows: str) -> str:
    return POD_LINE + "".join(f"{row}\n" for row in rows)


def _nodes(*rows: str) -> str:
    return NODE_LINE + "".join(f"{row}\n" for row in rows)


def _parse(
    text: str,
    *,
    window: tuple[float, float] | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> list[tuple[int, str, float, float]]:
    """(row, name, at, duration) of each row parsed with the default qos mapping."""
    rows = parse_alibaba_pods(
        text, "pods.csv", QosMapping(), window=window, sample=sample, seed=seed
    )
    return [(r.row, r.name, r.at, r.duration) for r in rows]


# -- headers ----------------------------------------------------------------------------------


def test_lists_are_recognised_by_their_header_line() -> None:
    assert is_alibaba_pods(PODS)
    assert is_alibaba_nodes(NODES)
    assert not is_alibaba_pods(NODES)
    assert not is_alibaba_nodes(PODS)
    # Surrounding whitespace, a byte order mark and Windows line ends do not matter.
    assert is_alibaba_pods("\n  " + PODS.replace("\n", "\r\n"))
    assert is_alibaba_nodes("\ufeff" + NODE_LINE.replace(",", " , "))
    assert not is_alibaba_pods("at,namespace,kind,name,gpus,duration,memory\n0,a,notebook,x,1,1h,0")
    assert not is_alibaba_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\npod,1,1,1,1000\n")
    assert not is_alibaba_pods("")
    assert not is_alibaba_nodes("   \n")


def test_a_list_without_times_is_refused_with_the_reason() -> None:
    with pytest.raises(TraceError) as err:
        parse_alibaba_pods(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\npod,1000,1024,2,1000\n",
            "openb_pod_list_multigpu20.csv",
            QosMapping(),
        )
    assert str(err.value).startswith(
        "openb_pod_list_multigpu20.csv: not an Alibaba cluster-trace-gpu-v2023 pod list"
    )
    assert "no creation/deletion/scheduled times: it cannot be replayed" in str(err.value)
    with pytest.raises(TraceError, match=r"^nodes\.csv: not an Alibaba .* node list"):
        parse_alibaba_nodes(PODS, "nodes.csv")


# -- pods -------------------------------------------------------------------------------------


def test_the_sample_pod_list_becomes_trace_rows_by_arrival() -> None:
    rows = parse_alibaba_pods(PODS, "pods.csv", QosMapping())
    # demo-pod-c is a CPU pod (num_gpu 0); demo-pod-e was never scheduled.
    assert [(r.row, r.name, r.at) for r in rows] == [
        (1, "demo-pod-a", 0.0),
        (2, "demo-pod-b", 100.0),
        (4, "demo-pod-d", 200.0),
        (6, "demo-pod-f", 500.0),
        (7, "demo-pod-g", 700.0),
        (8, "demo-pod-h", 1000.0),
    ]
    by_name = {r.name: r for r in rows}

    whole = by_name["demo-pod-a"]
    assert (whole.namespace, whole.kind, whole.gpus, whole.busy) == (
        "serving",
        "kserve-predictor",
        1.0,
        0.3,
    )
    assert whole.duration == 5000 - 1002  # deletion - scheduled: the time it ran
    assert whole.memory_used == Decimal(0)  # no gpu_spec, no GPU memory given
    assert whole.gpu_products == ()
    assert (whole.labels, whole.checkpoint, whole.run) == ({}, None, None)

    shared = by_name["demo-pod-b"]  # gpu_milli 500 on a T4
    assert (shared.namespace, shared.kind) == ("batch", "katib-trial")
    assert (shared.gpus, shared.busy, shared.devices) == (0.5, 0.5, 1)
    assert shared.gpu_products == ("Tesla-T4",)
    assert shared.memory_used == Decimal(7680 * MIB)  # half of 15360 MiB
    assert shared.duration == 300.0

    eight = by_name["demo-pod-d"]  # V100M16|V100M32|V100M32, Burstable
    assert (eight.namespace, eight.kind, eight.gpus, eight.busy) == (
        "training",
        "training-job",
        8.0,
        0.9,
    )
    assert eight.gpu_products == ("Tesla-V100-SXM2-16GB", "Tesla-V100-SXM2-32GB")
    assert eight.memory_used == Decimal(16384 * MIB)  # the smaller of the two
    assert eight.duration == 8400 - 1260

    guaranteed = by_name["demo-pod-f"]
    assert (guaranteed.kind, guaranteed.gpus, guaranteed.gpu_products) == (
        "training-job",
        2.0,
        ("Alibaba-G2",),
    )
    assert guaranteed.memory_used == Decimal(20000 * MIB)

    instant = by_name["demo-pod-g"]  # deleted the second it was scheduled
    assert instant.duration == 1.0
    assert instant.gpu_products == ("NVIDIA-A10", "Tesla-T4")
    assert instant.memory_used == Decimal(15360 * MIB)

    never_deleted = by_name["demo-pod-h"]  # runs until the latest time in the file
    assert never_deleted.duration == 9000 - 2010
    assert (never_deleted.gpus, never_deleted.busy) == (0.12, 0.12)


def test_pods_without_gpu_spec_use_their_share_of_the_given_gpu_memory() -> None:
    rows = parse_alibaba_pods(PODS, "pods.csv", QosMapping(), gpu_memory_mib=81559)
    memory = {r.name: r.memory_used for r in rows}
    assert memory["demo-pod-a"] == Decimal(81559 * MIB)
    assert memory["demo-pod-h"] == Decimal(120 * 81559 * MIB // 1000)
    assert memory["demo-pod-b"] == Decimal(7680 * MIB)  # its gpu_spec still decides


def test_cpu_pods_are_skipped_and_a_list_of_them_is_an_error() -> None:
    text = _pods(
        "cpu-1,4000,8192,0,0,,LS,Running,10,20,10",
        "gpu-1,4000,8192,1,1000,,LS,Running,30,90,35",
        "cpu-2,4000,8192,0,0,,LS,Running,40,50,40",
    )
    assert _parse(text) == [(2, "gpu-1", 0.0, 55.0)]
    with pytest.raises(TraceError, match=r"^cpu\.csv: no GPU pod that was scheduled$"):
        parse_alibaba_pods(
            _pods("cpu-1,4000,8192,0,0,,LS,Running,10,20,10"), "cpu.csv", QosMapping()
        )


def test_qos_default_mapping_and_overrides() -> None:
    default = parse_qos_mapping([], "--qos")
    assert default == QosMapping()
    assert dict(default.targets) == {
        "LS": ("serving", "kserve-predictor"),
        "BE": ("batch", "katib-trial"),
        "Burstable": ("training", "training-job"),
        "Guaranteed": ("training", "training-job"),
    }
    assert default.namespaces() == {
        "batch": dict(PROFILE_NAMESPACE_LABELS),
        "serving": dict(PROFILE_NAMESPACE_LABELS),
        "training": dict(PROFILE_NAMESPACE_LABELS),
    }

    mapping = parse_qos_mapping(
        ["LS=notebooks:notebook", " BE = batch : kfp-step ", "Spot=spot:katib-trial"], "--qos"
    )
    assert mapping.target("LS") == ("notebooks", "notebook")
    assert mapping.target("BE") == ("batch", "kfp-step")
    assert mapping.target("Burstable") == ("training", "training-job")
    assert sorted(mapping.namespaces()) == ["batch", "notebooks", "spot", "training"]

    rows = parse_alibaba_pods(PODS, "pods.csv", mapping)
    by_name = {r.name: r for r in rows}
    assert (by_name["demo-pod-a"].namespace, by_name["demo-pod-a"].kind) == (
        "notebooks",
        "notebook",
    )
    assert by_name["demo-pod-a"].busy == 0.1  # a notebook's default busy share
    assert by_name["demo-pod-b"].kind == "kfp-step"
    assert by_name["demo-pod-b"].busy == 0.5  # a share keeps its share busy, whatever the kind


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("LS", "--qos: qos mapping 'LS': write QOS=namespace:kind (LS=serving:kserve-predictor)"),
        ("LS=serving", "--qos: qos mapping 'LS=serving': write QOS=namespace:kind"),
        ("=serving:notebook", "--qos: qos mapping '=serving:notebook': write QOS=namespace:kind"),
        (
            "LS=Serving_Team:notebook",
            "--qos: qos mapping 'LS=Serving_Team:notebook': namespace 'Serving_Team' is not a "
            "DNS label",
        ),
        (
            "LS=serving:deployment",
            "--qos: qos mapping 'LS=serving:deployment': unknown kind 'deployment' (one of "
            "kfp-step, training-job, trainjob, katib-trial, notebook, kserve-predictor)",
        ),
    ],
)
def test_a_bad_qos_mapping_names_the_spec(spec: str, message: str) -> None:
    with pytest.raises(TraceError) as err:
        parse_qos_mapping(["BE=batch:katib-trial", spec], "--qos")
    assert str(err.value).startswith(message)


def test_an_unknown_qos_names_the_row_unless_mapped() -> None:
    text = _pods(
        "p-1,4000,8192,1,1000,,LS,Running,0,60,0",
        "p-2,4000,8192,1,300,,Spot,Running,5,65,5",
    )
    with pytest.raises(TraceError) as err:
        parse_alibaba_pods(text, "pods.csv", QosMapping())
    assert str(err.value) == (
        "pods.csv: row 2: qos: 'Spot' is not mapped (mapped: BE, Burstable, Guaranteed, LS; "
        "map it with Spot=namespace:kind)"
    )
    rows = parse_alibaba_pods(text, "pods.csv", parse_qos_mapping(["Spot=spot:katib-trial"], "x"))
    assert [(r.name, r.namespace, r.kind) for r in rows] == [
        ("p-1", "serving", "kserve-predictor"),
        ("p-2", "spot", "katib-trial"),
    ]
    # A CPU pod's qos is never looked up.
    assert _parse(_pods("c,1,1,0,0,,Odd,Running,0,9,0", "g,1,1,1,1000,,LS,Running,3,9,4")) == [
        (2, "g", 0.0, 5.0)
    ]


def test_a_window_keeps_pods_created_in_it_timed_from_its_start() -> None:
    # [1100, 1700): b, d, f; g is created at 1700, the window's end.
    assert _parse(PODS, window=(1100, 1700)) == [
        (2, "demo-pod-b", 0.0, 300.0),
        (4, "demo-pod-d", 100.0, 7140.0),
        (6, "demo-pod-f", 400.0, 7500.0),
    ]
    # Times count from the window's start even when its first pod comes later.
    assert _parse(PODS, window=(1400, 1600)) == [(6, "demo-pod-f", 100.0, 7500.0)]
    with pytest.raises(TraceError, match=r"^pods\.csv: no GPU pod that was scheduled created in "):
        parse_alibaba_pods(PODS, "pods.csv", QosMapping(), window=(5000, 6000))
    with pytest.raises(TraceError, match=r"^pods\.csv: window \(20, 10\): the start must be"):
        parse_alibaba_pods(PODS, "pods.csv", QosMapping(), window=(20, 10))


def test_a_sample_is_deterministic_and_comes_back_by_arrival() -> None:
    first = _parse(PODS, sample=3, seed=7)
    assert len(first) == 3
    assert first == _parse(PODS, sample=3, seed=7)
    assert [row for row, *_ in first] == sorted(row for row, *_ in first)
    assert first[0][2] == 0.0  # the sample starts at 0
    seeds = {tuple(row for row, *_ in _parse(PODS, sample=3, seed=s)) for s in range(20)}
    assert len(seeds) > 1  # the seed chooses
    # After the window: only b, d, f can be chosen, timed from the window's start.
    windowed = _parse(PODS, window=(1100, 1700), sample=2, seed=1)
    assert len(windowed) == 2
    assert {name for _, name, *_ in windowed} <= {"demo-pod-b", "demo-pod-d", "demo-pod-f"}
    assert windowed == _parse(PODS, window=(1100, 1700), sample=2, seed=1)
    # Asking for more than there are keeps them all.
    assert _parse(PODS, sample=100) == _parse(PODS)
    with pytest.raises(TraceError, match=r"^pods\.csv: sample 0: keep 1 pod or more$"):
        parse_alibaba_pods(PODS, "pods.csv", QosMapping(), sample=0)


GOOD = "p,4000,8192,1,1000,,LS,Running,10,20,10"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (",4000,8192,1,1000,,LS,Running,10,20,10", "name: missing"),
        ("p,,8192,1,1000,,LS,Running,10,20,10", "cpu_milli: missing"),
        ("p,4000,lots,1,1000,,LS,Running,10,20,10", "memory_mib: 'lots' is not a number"),
        ("p,4000,8192,-1,1000,,LS,Running,10,20,10", "num_gpu: '-1' is negative"),
        ("p,4000,8192,1.5,1000,,LS,Running,10,20,10", "num_gpu: '1.5' is not a whole number"),
        ("p,4000,8192,1,1500,,LS,Running,10,20,10", "gpu_milli: '1500' is not from 1 to 1000"),
        ("p,4000,8192,1,0,,LS,Running,10,20,10", "gpu_milli: '0' is not from 1 to 1000"),
        (
            "p,4000,8192,2,500,,LS,Running,10,20,10",
            "gpu_milli: 500 with num_gpu 2: a share of a GPU (below 1000) asks one GPU",
        ),
        ("p,4000,8192,1,1000,,LS,Running,,20,10", "creation_time: missing"),
        ("p,4000,8192,1,1000,,LS,Running,10,-5,10", "deletion_time: '-5' is negative"),
        ("p,4000,8192,1,1000,,LS,Running,10,20,soon", "scheduled_time: 'soon' is not a number"),
        ("p,4000,8192,1,1000,,LS,Running,10,20,inf", "scheduled_time: 'inf' is not a number"),
        ("p,4000,8192,1,1000,|?|,LS,Running,10,20,10", "gpu_spec: '?' is not a GPU model name"),
        (
            "p,4000,8192,1,1000,,LS,Running,10,20,10,extra",
            "more values than columns (12 for 11: name,cpu_milli,",
        ),
        ("p,4000,8192,1,1000", "creation_time: missing"),
        ("c,4000,8192,0,0,,LS,Running,ten,20,10", "creation_time: 'ten' is not a number"),
    ],
)
def test_a_malformed_pod_row_names_the_file_row_and_field(bad: str, message: str) -> None:
    with pytest.raises(TraceError) as err:
        parse_alibaba_pods(_pods(GOOD, "", bad, GOOD), "openb_pod_list_x.csv", QosMapping())
    # The blank line is not a row: the bad one is data row 2.
    assert str(err.value).startswith(f"openb_pod_list_x.csv: row 2: {message}")


def test_products_for_spec() -> None:
    assert products_for_spec("") == ()
    assert products_for_spec("nan") == ()
    assert products_for_spec("V100M16|V100M32|V100M32") == (
        "Tesla-V100-SXM2-16GB",
        "Tesla-V100-SXM2-32GB",
    )
    assert products_for_spec("A10|G2|P100|T4") == (
        "NVIDIA-A10",
        "Alibaba-G2",
        "Tesla-P100-PCIE-16GB",
        "Tesla-T4",
    )
    assert products_for_spec("t4") == ("Tesla-T4",)
    assert products_for_spec("H20 (new)|T4") == ("Alibaba-H20-new", "Tesla-T4")


# -- nodes ------------------------------------------------------------------------------------


def test_gpu_nodes_become_pools_of_identical_nodes() -> None:
    pools = parse_alibaba_nodes(NODES, "nodes.csv")
    # demo-node-02 has no GPU; H20 is a model this importer does not know.
    assert [(p.name, p.count, p.gpus_per_node, p.gpu_product, p.gpu_memory_mib) for p in pools] == [
        ("g2-8", 2, 8, "Alibaba-G2", 20000),
        ("h20-new-8", 1, 8, "Alibaba-H20-new", 16384),
        ("p100-2", 1, 2, "Tesla-P100-PCIE-16GB", 16384),
        ("t4-2", 2, 2, "Tesla-T4", 15360),
        ("t4-4", 1, 4, "Tesla-T4", 15360),
        ("v100m32-8", 1, 8, "Tesla-V100-SXM2-32GB", 32768),
    ]
    assert all(p.mps_replicas == 1 for p in pools)
    labels = pools[3].gfd_labels()
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.memory"] == "15360"
    assert pools[3].node_names == ["t4-2-0", "t4-2-1"]


def test_a_node_sample_keeps_n_gpu_nodes_drawn_with_the_seed() -> None:
    # 8 GPU nodes (demo-node-02 has none and is never drawn): seed 3 draws a G2 and a T4 node.
    pools = parse_alibaba_nodes(NODES, "nodes.csv", sample=2, seed=3)
    assert [(p.name, p.count, p.gpus_per_node) for p in pools] == [("g2-8", 1, 8), ("t4-2", 1, 2)]
    assert pools == parse_alibaba_nodes(NODES, "nodes.csv", sample=2, seed=3)
    every = parse_alibaba_nodes(NODES, "nodes.csv", sample=8, seed=5)
    assert every == parse_alibaba_nodes(NODES, "nodes.csv")
    sizes = {
        sum(p.count for p in parse_alibaba_nodes(NODES, "n", sample=3, seed=s)) for s in range(5)
    }
    assert sizes == {3}


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (0, "nodes.csv: node sample 0: keep 1 node or more"),
        (9, "nodes.csv: node sample 9: the list has only 8 GPU nodes"),
    ],
)
def test_a_node_sample_larger_than_the_list_or_empty_is_refused(sample: int, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_alibaba_nodes(NODES, "nodes.csv", sample=sample)


def test_every_known_model_has_a_product_and_its_memory() -> None:
    text = _nodes(*(f"n-{i},1000,1024,1,{model}" for i, model in enumerate(MODEL_PRODUCTS)))
    pools = parse_alibaba_nodes(text, "nodes.csv")
    assert {(p.gpu_product, p.gpu_memory_mib) for p in pools} == {
        ("Tesla-V100-SXM2-16GB", 16384),
        ("Tesla-V100-SXM2-32GB", 32768),
        ("Tesla-P100-PCIE-16GB", 16384),
        ("Tesla-T4", 15360),
        ("NVIDIA-A10", 23028),
        ("Alibaba-G1", 10000),
        ("Alibaba-G2", 20000),
        ("Alibaba-G3", 30000),
    }
    assert [p.name for p in pools] == [
        "a10-1",
        "g1-1",
        "g2-1",
        "g3-1",
        "p100-1",
        "t4-1",
        "v100m16-1",
        "v100m32-1",
    ]


def test_pool_names_stay_unique_and_dns_safe() -> None:
    pools = parse_alibaba_nodes(
        _nodes("a,1,1,2,X.1", "b,1,1,2,X_1", "c,1,1,2,t4", "d,1,1,2,T4"), "nodes.csv"
    )
    assert [(p.name, p.count, p.gpu_product) for p in pools] == [
        ("t4-2", 2, "Tesla-T4"),
        ("x-1-2", 1, "Alibaba-X.1"),
        ("x-1-2-2", 1, "Alibaba-X_1"),
    ]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (",96000,393216,8,G2", "sn: missing"),
        ("n-1,96000,393216,8,G2", "sn: 'n-1' is already row 1"),
        ("n-2,many,393216,8,G2", "cpu_milli: 'many' is not a number"),
        ("n-2,96000,-1,8,G2", "memory_mib: '-1' is negative"),
        ("n-2,96000,393216,,G2", "gpu: missing"),
        ("n-2,96000,393216,2.5,G2", "gpu: '2.5' is not a whole number"),
        ("n-2,96000,393216,8,", "model: missing for a node with 8 GPUs"),
        ("n-2,96000,393216,8,nan", "model: missing for a node with 8 GPUs"),
        ("n-2,96000,393216,8,***", "model: '***' is not a GPU model name"),
        ("n-2,96000,393216,8,G2,x", "more values than columns (6 for 5: sn,cpu_milli,"),
    ],
)
def test_a_malformed_node_row_names_the_file_row_and_field(bad: str, message: str) -> None:
    with pytest.raises(TraceError) as err:
        parse_alibaba_nodes(_nodes("n-1,96000,393216,8,G2", bad), "openb_node_list_gpu_node.csv")
    assert str(err.value).startswith(f"openb_node_list_gpu_node.csv: row 2: {message}")


def test_cpu_nodes_need_no_model_and_are_skipped() -> None:
    pools = parse_alibaba_nodes(_nodes("c,32000,131072,0,", "g,8000,32768,1,V100M16"), "n.csv")
    assert [(p.name, p.count) for p in pools] == [("v100m16-1", 1)]
    with pytest.raises(TraceError, match=r"^n\.csv: no GPU node \(every node has gpu 0\)$"):
        parse_alibaba_nodes(_nodes("c,32000,131072,0,"), "n.csv")
