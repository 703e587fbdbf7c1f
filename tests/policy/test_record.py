"""The annotation contract as one codec: what the webhook writes on a pod, read back by one rule."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.policy import admitted_gpu_memory
from gpuwarden.policy.pod import keys
from gpuwarden.policy.pod.record import CHARGE_FIELDS, DECISION_FIELDS, IdleRecord, PodRecord

GI = 2**30

FULL = PodRecord(
    profile="shared-small",
    policy="kubeflow-default",
    tenant="team-a",
    backend="hami",
    gpu_count=2,
    gpu_shared=True,
    preemptible=False,
    gpu_memory_limit=8 * GI,
    gpu_memory_reserved=5462 * 2**20,
    overcommit_ratio=Decimal("1.5"),
    thread_percentage=50,
    idle=IdleRecord(action="stop", after=7200, below=Decimal("2.5")),
    rule="rule/notebooks",
    containers=("main", "sidecar"),
)


def _pod(annotations: dict[str, str], *asked: int | None) -> dict[str, Any]:
    """A pod whose containers main, sidecar... ask for these GPU counts (None: none)."""
    names = ("main", "sidecar", "third")
    containers = [
        {"name": name, "resources": {"limits": {"nvidia.com/gpu": str(n)}} if n else {}}
        for name, n in zip(names, asked, strict=False)
    ]
    return {
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": containers},
    }


@pytest.mark.parametrize(
    "record",
    [
        FULL,
        PodRecord(profile="cpu-only", policy="p", tenant="team-a", gpu_count=0),
        PodRecord(profile="p", policy="q", rule="label", containers=()),
        PodRecord(gpu_memory_limit=1500, overcommit_ratio=Decimal(16), thread_percentage=100),
        PodRecord(),
    ],
)
def test_what_is_written_reads_back_the_same(record: PodRecord) -> None:
    annotations = record.to_annotations()
    assert PodRecord.from_annotations(annotations) == record
    assert PodRecord.from_annotations(annotations).to_annotations() == annotations


def _maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | values


RECORDS = st.builds(
    PodRecord,
    profile=_maybe(st.text()),
    policy=_maybe(st.text()),
    tenant=_maybe(st.text()),
    backend=_maybe(st.text()),
    gpu_count=_maybe(st.integers(0, 10**9 - 1)),
    gpu_shared=_maybe(st.booleans()),
    preemptible=_maybe(st.booleans()),
    gpu_memory_limit=_maybe(st.integers(0, 2**63 - 1)),
    gpu_memory_reserved=_maybe(st.integers(0, 2**63 - 1)),
    overcommit_ratio=_maybe(st.decimals(1, 10**6, places=3)),
    thread_percentage=_maybe(st.integers(1, 100)),
    idle=_maybe(
        st.builds(
            IdleRecord,
            action=st.sampled_from(["stop", "notify"]),
            after=st.integers(1, 10**9 - 1),
            below=st.decimals(Decimal("0.001"), 100, places=3),
        )
    ),
    rule=_maybe(st.text()),
    containers=_maybe(
        st.lists(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)).map(tuple)
    ),
)


@given(RECORDS)
def test_any_record_reads_back_as_written(record: PodRecord) -> None:
    assert PodRecord.from_annotations(record.to_annotations()) == record


def test_the_codec_writes_every_decision_annotation_in_the_patch_order() -> None:
    written = FULL.to_annotations()
    assert set(written) == set(keys.DECISION_ANNOTATIONS)
    # The order of the webhook's JSON Patch: the grant's annotations, then rule and containers.
    assert list(written)[:4] == [
        keys.ANNOTATION_PROFILE,
        keys.ANNOTATION_POLICY,
        keys.ANNOTATION_TENANT,
        keys.ANNOTATION_BACKEND,
    ]
    assert list(written)[-2:] == [keys.ANNOTATION_RULE, keys.ANNOTATION_CONTAINERS]
    assert written[keys.ANNOTATION_GPU_MEMORY_LIMIT] == "8Gi"
    assert written[keys.ANNOTATION_GPU_MEMORY_RESERVED] == "5462Mi"
    assert written[keys.ANNOTATION_OVERCOMMIT_RATIO] == "1.5"
    assert written[keys.ANNOTATION_CONTAINERS] == "main,sidecar"
    assert written[keys.ANNOTATION_GPU_SHARED] == "true"
    assert written[keys.ANNOTATION_IDLE] == "action=stop,after=7200s,below=2.5%"


def test_a_recorded_empty_container_list_is_written_and_an_unrecorded_one_is_not() -> None:
    assert PodRecord(containers=()).to_annotations() == {keys.ANNOTATION_CONTAINERS: ""}
    assert PodRecord().to_annotations() == {}


def test_some_fields_only_reads_those() -> None:
    annotations = FULL.to_annotations()
    partial = PodRecord.from_annotations(annotations, DECISION_FIELDS)
    assert (partial.rule, partial.profile, partial.containers) == (
        FULL.rule,
        FULL.profile,
        FULL.containers,
    )
    assert partial.tenant is None and partial.gpu_memory_limit is None
    fields = set(PodRecord.__dataclass_fields__)
    assert fields >= {*DECISION_FIELDS, *CHARGE_FIELDS}


def test_other_annotations_are_not_read() -> None:
    record = PodRecord.from_annotations({"example.com/gpu-count": "x", "gpuwarden.io/other": "y"})
    assert record == PodRecord()


# Forms a user, a hand edit or a forger could write that gpuwarden never writes: each is left
# unrecorded (as if absent) and named in problems; reading never raises.
MALFORMED = [
    (keys.ANNOTATION_GPU_COUNT, " 2"),  # both readers used to strip it
    (keys.ANNOTATION_GPU_COUNT, "2\n"),
    (keys.ANNOTATION_GPU_COUNT, "+2"),  # the webhook's int() took it, the node refused it
    (keys.ANNOTATION_GPU_COUNT, "-1"),  # the webhook charged it as 1
    (keys.ANNOTATION_GPU_COUNT, "2_0"),  # int() reads 20
    (keys.ANNOTATION_GPU_COUNT, "²"),  # isdigit() but int() raises: the node agent crashed
    (keys.ANNOTATION_GPU_COUNT, "\u0661"),  # an Arabic-Indic one: both readers took it as 1
    (keys.ANNOTATION_GPU_COUNT, "9" * 5000),  # int() refuses more than 4300 digits
    (keys.ANNOTATION_GPU_COUNT, "2.0"),
    (keys.ANNOTATION_GPU_COUNT, ""),
    (keys.ANNOTATION_GPU_COUNT, "two"),
    (keys.ANNOTATION_THREAD_PERCENTAGE, "0"),
    (keys.ANNOTATION_THREAD_PERCENTAGE, "101"),
    (keys.ANNOTATION_THREAD_PERCENTAGE, " 50"),  # the node used to strip it
    (keys.ANNOTATION_THREAD_PERCENTAGE, "50%"),
    (keys.ANNOTATION_THREAD_PERCENTAGE, "³"),
    (keys.ANNOTATION_GPU_MEMORY_LIMIT, " 8Gi"),
    (keys.ANNOTATION_GPU_MEMORY_LIMIT, "8 Gi"),
    (keys.ANNOTATION_GPU_MEMORY_LIMIT, "8GiB"),
    (keys.ANNOTATION_GPU_MEMORY_LIMIT, "-8Gi"),
    (keys.ANNOTATION_GPU_MEMORY_LIMIT, "eight gigs"),
    (keys.ANNOTATION_GPU_MEMORY_LIMIT, ""),
    (keys.ANNOTATION_GPU_MEMORY_LIMIT, "9" * 100),
    (keys.ANNOTATION_GPU_MEMORY_RESERVED, "lots"),
    (keys.ANNOTATION_OVERCOMMIT_RATIO, "0.5"),
    (keys.ANNOTATION_OVERCOMMIT_RATIO, "NaN"),
    (keys.ANNOTATION_OVERCOMMIT_RATIO, "Infinity"),
    (keys.ANNOTATION_OVERCOMMIT_RATIO, "1e1"),
    (keys.ANNOTATION_OVERCOMMIT_RATIO, "+2"),
    (keys.ANNOTATION_OVERCOMMIT_RATIO, " 1.5"),  # the node's Decimal() stripped it
    (keys.ANNOTATION_OVERCOMMIT_RATIO, "1_5"),  # Decimal() reads 15
    (keys.ANNOTATION_GPU_SHARED, "True"),
    (keys.ANNOTATION_PREEMPTIBLE, "yes"),
    (keys.ANNOTATION_CONTAINERS, "main, sidecar"),  # the node stripped, the webhook did not
    (keys.ANNOTATION_CONTAINERS, "main,,sidecar"),
    (keys.ANNOTATION_CONTAINERS, "Main"),
    (keys.ANNOTATION_CONTAINERS, ","),
]


@pytest.mark.parametrize(("key", "raw"), MALFORMED)
def test_a_malformed_value_is_unrecorded_and_named(key: str, raw: str) -> None:
    good = FULL.to_annotations()
    record = PodRecord.from_annotations({**good, key: raw})
    assert record.to_annotations() == {k: v for k, v in good.items() if k != key}
    (problem,) = record.problems
    assert problem.startswith(f"annotation {key}={raw!r}: ")


def test_names_are_taken_as_written() -> None:
    # Only ever compared with the policies' names: one that matches none means nothing.
    record = PodRecord.from_annotations(
        {keys.ANNOTATION_TENANT: " team-a", keys.ANNOTATION_RULE: "rule/x\n"}
    )
    assert (record.tenant, record.rule, record.problems) == (" team-a", "rule/x\n", ())


def test_a_fractional_cap_is_rounded_up_to_a_byte_as_the_writer_writes_it() -> None:
    record = PodRecord.from_annotations({keys.ANNOTATION_GPU_MEMORY_LIMIT: "1500500m"})
    assert record.gpu_memory_limit == 1501
    assert record.to_annotations() == {keys.ANNOTATION_GPU_MEMORY_LIMIT: "1501"}
    assert PodRecord.from_annotations(
        {keys.ANNOTATION_GPU_MEMORY_LIMIT: "8G"}
    ).gpu_memory_limit == (8 * 10**9)


# --- what the webhook's quota charge does with such a pod ----------------------------------


def test_the_charge_is_the_cap_on_each_gpu_of_each_recorded_container() -> None:
    annotations = FULL.to_annotations()
    # main asks for 3 GPUs itself; sidecar asks for none and holds the recorded count, 2.
    assert admitted_gpu_memory(_pod(annotations, 3, None)) == 5 * 8 * GI


def test_no_readable_cap_charges_nothing() -> None:
    for raw in ("eight gigs", " 8Gi", "-8Gi"):
        annotations = {**FULL.to_annotations(), keys.ANNOTATION_GPU_MEMORY_LIMIT: raw}
        assert admitted_gpu_memory(_pod(annotations, 1, 1)) == 0
    assert admitted_gpu_memory(_pod({keys.ANNOTATION_TENANT: "team-a"}, 1)) == 0


@pytest.mark.parametrize("raw", ["two", "²", "-1", "+2", " 2", "9" * 5000])
def test_an_unreadable_gpu_count_charges_as_if_absent(raw: str) -> None:
    """It used to charge nothing ("two", "²"), 1 ("-1") or 2 ("+2", " 2"): now one GPU for a
    container that asks for none, and a container's own count where it asks for one."""
    annotations = {**FULL.to_annotations(), keys.ANNOTATION_GPU_COUNT: raw}
    assert admitted_gpu_memory(_pod(annotations, None, None)) == 2 * 8 * GI
    assert admitted_gpu_memory(_pod(annotations, 4, None)) == 5 * 8 * GI


def test_unreadable_containers_charge_one_container_at_the_recorded_count() -> None:
    """ "main, sidecar" charged main and, for " sidecar" (no such container), the recorded
    count; now the list is unreadable and one container at the recorded count is charged."""
    annotations = {**FULL.to_annotations(), keys.ANNOTATION_CONTAINERS: "main, sidecar"}
    assert admitted_gpu_memory(_pod(annotations, 4, 4)) == 2 * 8 * GI


def test_a_recorded_container_the_pod_lacks_is_charged_the_recorded_count() -> None:
    annotations = {**FULL.to_annotations(), keys.ANNOTATION_CONTAINERS: "main,gone"}
    assert admitted_gpu_memory(_pod(annotations, 1)) == 3 * 8 * GI


def test_a_cap_past_what_kubernetes_can_hold_is_malformed() -> None:
    record = PodRecord.from_annotations({keys.ANNOTATION_GPU_MEMORY_LIMIT: "999999999999Ei"})
    assert record.gpu_memory_limit is None and len(record.problems) == 1
    assert PodRecord.from_annotations(
        {keys.ANNOTATION_GPU_MEMORY_LIMIT: "7Ei"}
    ).gpu_memory_limit == (7 * 2**60)
