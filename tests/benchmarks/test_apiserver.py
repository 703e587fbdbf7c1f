"""bench/apiserver.py's pure parts (its apiserver_*.py modules) and bench/kyverno's policies, without
Kyverno or a cluster."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KYVERNO_POLICIES = ROOT / "bench" / "kyverno"


if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.apiserver import parse_args, parse_clients, parse_peers  # noqa: E402
from bench.apiserver_load import pids_with, process_cpu_seconds, split_clients  # noqa: E402
from bench.apiserver_pods import example_pods, in_namespace, numbered_pods  # noqa: E402
from bench.apiserver_report import comparisons, differences, format_cli, format_cpu  # noqa: E402
from bench.apiserver_stats import (  # noqa: E402
    CliTiming,
    RunStats,
    added_latency,
    control_name,
    percentile,
    pooled,
    ratio,
    verdict,
)

# --- the Kyverno policies ----------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """Refuses a mapping with a key twice (Kyverno's parser does; PyYAML keeps the last)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} twice", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _policies() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(KYVERNO_POLICIES.glob("*.yaml")):
        docs = [d for d in yaml.load_all(path.read_text(), Loader=_UniqueKeyLoader) if d]
        assert len(docs) == 1, f"{path}: one ClusterPolicy per file"
        out[path.name] = docs[0]
    return out


def test_kyverno_policies_are_cluster_policies_with_the_expected_rules() -> None:
    policies = _policies()
    assert set(policies) == {"mutate.yaml", "validate.yaml"}
    for name, policy in policies.items():
        assert policy["apiVersion"] == "kyverno.io/v1", name
        assert policy["kind"] == "ClusterPolicy", name
        rules = policy["spec"]["rules"]
        names = [rule["name"] for rule in rules]
        assert len(names) == len(set(names)), f"{name}: rule names repeat"
        for rule in rules:
            assert rule["match"]["any"], f"{name}/{rule['name']}: no match"
            for match in rule["match"]["any"]:
                assert match["resources"]["kinds"] == ["Pod"]
                assert match["resources"]["operations"] == ["CREATE"]
    mutate_rules = policies["mutate.yaml"]["spec"]["rules"]
    assert all("mutate" in rule and "validate" not in rule for rule in mutate_rules)
    validate_rules = policies["validate.yaml"]["spec"]["rules"]
    assert all(rule["validate"]["failureAction"] == "Enforce" for rule in validate_rules)


def test_kyverno_policies_set_what_gpuwarden_sets() -> None:
    text = (KYVERNO_POLICIES / "mutate.yaml").read_text()
    for needle in (
        "schedulerName: volcano",
        "scheduling.volcano.sh/queue-name",
        "volcano.sh/vgpu-number",
        "gpuwarden.io/profile",
        "priorityClassName: gpuwarden-",
    ):
        assert needle in text


def test_a_duplicate_key_is_refused() -> None:
    with pytest.raises(yaml.constructor.ConstructorError):
        yaml.load("a: 1\na: 2\n", Loader=_UniqueKeyLoader)


# --- statistics ----------------------------------------------------------------------------------


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0
    assert percentile([3.0, 1.0, 2.0], 100) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def _run(peer: str, clients: int, latencies: list[float], seconds: float = 2.0) -> Any:
    return RunStats(peer, clients, seconds, tuple(latencies), 0)


def test_run_stats_and_added_latency() -> None:
    none = _run("none", 8, [1.0] * 100)
    hooked = _run("gpuwarden", 8, [2.0] * 90)
    assert none.rate == 50.0
    assert none.p50 == 1.0
    added = added_latency(hooked, none)
    assert added.p50_ms == pytest.approx(1.0)
    assert added.throughput_ratio == pytest.approx(0.9)
    with pytest.raises(ValueError):
        added_latency(_run("gpuwarden", 32, [1.0]), none)
    assert math.isnan(_run("none", 8, []).p99)


def test_comparisons_report_the_targets() -> None:
    runs = [
        _run("none", 8, [1.0] * 100),
        _run("gpuwarden", 8, [2.0] * 95),
        _run("kyverno", 8, [5.0] * 50),
    ]
    text = "\n".join(comparisons(runs))
    assert "gpuwarden keeps 0.95x the no-webhook throughput (target >= 0.9): met" in text
    # gpuwarden adds 1 ms, Kyverno 4 ms: 0.25x.
    assert "0.25x Kyverno's added latency at p50" in text
    assert "p50 met, p99 met" in text


def test_ratio_and_verdict_of_nothing() -> None:
    assert math.isnan(ratio(1.0, 0.0))
    assert verdict(math.nan, 0.5, at_most=True) == "not measured"
    assert verdict(0.6, 0.5, at_most=True) == "not met"
    assert verdict(0.9, 0.9, at_most=False) == "met"


def test_cli_timing_rates() -> None:
    timing = CliTiming("gpuwarden apply", 2000, 5.0, 1.0)
    assert timing.rate == 400.0
    assert timing.marginal_rate == pytest.approx(1999 / 4.0)
    lines = format_cli([timing, CliTiming("kyverno apply", 2000, 10.0, 1.0)])
    assert lines[-1].startswith("gpuwarden apply / kyverno apply: 2.0x pods/s")


def test_differences_name_the_fields() -> None:
    ours = {"annotations": {"a": "1", "b": "2"}, "schedulerName": "volcano"}
    theirs = {"annotations": {"a": "1", "b": "3"}, "schedulerName": None}
    assert differences(ours, theirs) == ["annotations[b]", "schedulerName"]
    assert differences(ours, ours) == []


# --- arguments and the load's shape --------------------------------------------------------------


def test_arguments() -> None:
    args = parse_args([])
    assert args.clients == (8, 32)
    assert args.peers == ("none", "echo", "gpuwarden", "kyverno")
    assert args.cli_pods == 2000
    quick = parse_args(["--quick", "--no-kyverno", "--clients", "4,16"])
    assert (quick.duration, quick.cli_pods) == (3.0, 500)
    assert quick.peers == ("none", "echo", "gpuwarden")
    assert quick.clients == (4, 16)
    assert parse_args(["--peers", "kyverno,none"]).peers == ("none", "kyverno")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_clients("8,x")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_clients("0")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_peers("opa")
    with pytest.raises(SystemExit):
        parse_args(["--duration", "0"])


def test_split_clients() -> None:
    assert split_clients(8, 2) == [4, 4]
    assert split_clients(5, 2) == [3, 2]
    assert split_clients(1, 4) == [1]


def test_numbered_pods_have_unique_valid_names() -> None:
    pods = numbered_pods(example_pods(), 50)
    names = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods]
    assert len(set(names)) == 50
    assert all(len(name) <= 63 for _, name in names)
    assert len(example_pods()) == 7


def test_pooled_runs_and_interleaved_controls() -> None:
    parts = [_run("gpuwarden", 8, [1.0, 3.0], 1.0), _run("gpuwarden", 8, [2.0], 1.5)]
    whole = pooled(parts)
    assert (whole.peer, whole.seconds, whole.count) == ("gpuwarden", 2.5, 3)
    assert whole.p50 == 2.0
    assert pooled(parts, "ctl-gpuwarden").peer == "ctl-gpuwarden"
    with pytest.raises(ValueError):
        pooled([_run("none", 8, [1.0]), _run("none", 32, [1.0])])
    # A webhook is compared with its own control runs when there are any.
    runs = [
        _run("none", 8, [1.0] * 100),
        _run(control_name("gpuwarden"), 8, [2.0] * 50),
        _run("gpuwarden", 8, [3.0] * 50),
    ]
    assert "gpuwarden keeps 1.00x" in "\n".join(comparisons(runs))


def test_control_pods_move_namespace_only() -> None:
    pods = example_pods()
    moved = in_namespace(pods, "kube-system")
    assert {p["metadata"]["namespace"] for p in moved} == {"kube-system"}
    assert [p["metadata"]["name"] for p in moved] == [p["metadata"]["name"] for p in pods]
    assert {p["metadata"]["namespace"] for p in pods} != {"kube-system"}


def test_cpu_accounting_reads_proc() -> None:
    import os

    assert process_cpu_seconds(os.getpid()) > 0.0
    assert process_cpu_seconds(2**22 + 12345) == 0.0  # no such process
    own = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert os.getpid() in pids_with(own)
    run = RunStats("gpuwarden", 8, 1.0, (1.0, 1.0), 0, {"webhook": 3.0, "clients": 1.0})
    assert run.cpu_per_pod("webhook") == 1.5
    assert math.isnan(run.cpu_per_pod("etcd"))
    lines = format_cpu([run, _run("none", 8, [1.0])])
    assert len(lines) == 2
    assert "1.50" in lines[1]
    assert lines[1].split()[2] == "-"  # kube-apiserver not measured
