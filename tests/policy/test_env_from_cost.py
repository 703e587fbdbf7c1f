"""Issue 29 item 2: the cost of judging envFrom is bounded by the pod, not by the keys of the
sources it names. A ConfigMap's keys are indexed once (SourceKeys), each distinct entry is
judged once, and what a prefix forms is one lookup; the answers are those of reading every key
with every prefix, as before."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pytest

from gpuwarden.policy import ClusterView, PolicySet, admit
from gpuwarden.policy.admission.validate import violations
from gpuwarden.policy.pod.environment import (
    EXACT_NAMES,
    FORBIDDEN_ENV,
    FORBIDDEN_SHAPES,
    LISTED,
    OPEN_STARTS,
    SourceKeys,
)

from .support import container, create, gpu_pod, policies_from

SPEC = """
profiles:
  - {name: shared, maxMemory: 8Gi}
tenants:
  - {name: team, namespaces: [team]}
defaultProfile: shared
"""


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return policies_from(SPEC)


class CountedKeys(frozenset[str]):
    """Key names that count how often they are read whole."""

    reads = 0

    def __iter__(self) -> Iterator[str]:
        type(self).reads += 1
        return super().__iter__()


def test_a_source_named_in_hundreds_of_entries_is_read_once(policies: PolicySet) -> None:
    """The attack of issue 29: a ConfigMap of many keys named by 800 envFrom entries. Before, the
    check sorted and matched every key for every entry (800 reads of 4,000 keys); now the keys
    are read once per decision, and not at all where the cache keeps them indexed."""
    keys = CountedKeys(f"KEY_{i}" for i in range(4000))
    cluster = ClusterView(env_source_keys={("ConfigMap", "team", "big"): keys})
    pod = gpu_pod(namespace="team")
    container(pod, "main")["envFrom"] = [{"configMapRef": {"name": "big"}}] * 400 + [
        {"configMapRef": {"name": "big"}, "prefix": f"APP{i}_"} for i in range(400)
    ]
    CountedKeys.reads = 0
    assert admit(create(pod), policies, cluster).allowed
    assert CountedKeys.reads <= 1
    indexed = ClusterView(env_source_keys={("ConfigMap", "team", "big"): SourceKeys.of(keys)})
    CountedKeys.reads = 0
    assert admit(create(pod), policies, indexed).allowed
    assert CountedKeys.reads == 0


def test_repeated_entries_are_judged_once_and_many_keys_are_counted(
    policies: PolicySet,
) -> None:
    keys = [f"CUDA_MPS_{i:03d}" for i in range(40)]
    cluster = ClusterView(env_source_keys={("ConfigMap", "team", "mps"): frozenset(keys)})
    pod = gpu_pod(namespace="team")
    container(pod, "main")["envFrom"] = [{"configMapRef": {"name": "mps"}}] * 50
    where = "spec.containers[main].envFrom[mps]"
    # The first five keys by name, then how many more: six violations, not 50 times 40.
    found = violations(create(pod), policies, cluster)[1]
    assert [v.message for v in found if "envFrom" in v.message] == [
        *(
            f"{where}: ConfigMap key {key} sets {key}, which can escape GPU isolation; "
            "remove that key"
            for key in keys[:LISTED]
        ),
        f"{where}: {len(keys) - LISTED} more ConfigMap keys set denied variables; remove them",
    ]
    message = admit(create(pod), policies, cluster).validation.message
    assert f"{where}: ConfigMap key CUDA_MPS_000 sets CUDA_MPS_000" in message


# --- SourceKeys answers what reading every key answered -------------------------------------


def _brute(keys: set[str], prefix: str) -> list[str]:
    return [key for key in sorted(keys) if FORBIDDEN_ENV.match(prefix + key)]


def _prefixes() -> list[str]:
    names = [*EXACT_NAMES, *FORBIDDEN_SHAPES, *OPEN_STARTS, "CUDA_MPS_PIPE_DIRECTORY"]
    cuts = {name[:i] for name in names for i in range(len(name) + 1)}
    extra = {
        "APP_",
        "CUDA_MPS_X",
        "CUDA_MPS_\n",
        "CUDA_MPS_A\nB",
        "CUDA_DEVICE_SM_LIMIT_1",
        "CUDA_DEVICE_SM_LIMIT_12",
        "CUDA_DEVICE_SM_LIMIT_1\n",
        "CUDA_DEVICE_SM_LIMIT_x",
        "CUDA_DEVICE_MEMORY_LIMIT_\u0663",
        "NVIDIA_VISIBLE_DEVICES\n",
        "NVIDIA_VISIBLE_DEVICESX",
    }
    return sorted(cuts | extra)


def _keys(seed: int) -> set[str]:
    rng = random.Random(seed)
    names = [*EXACT_NAMES, *FORBIDDEN_SHAPES, "CUDA_MPS_PIPE_DIRECTORY", "CUDA_DEVICE_SM_LIMIT_7"]
    pieces = [name[i:] for name in names for i in range(len(name) + 1)]
    pieces += ["1", "12", "\u0663", "\n", "0\n", "x\ny", "LOG_LEVEL", "_", "_1", "T_2", "S_"]
    keys = {rng.choice(pieces) + rng.choice(["", "", "\n", "1", "X", "_0"]) for _ in range(300)}
    return {key for key in keys if key}


@pytest.mark.parametrize("seed", range(4))
def test_source_keys_answer_what_reading_every_key_answers(seed: int) -> None:
    keys = _keys(seed)
    index = SourceKeys.of(keys)
    assert index.size == len(keys)
    for prefix in _prefixes():
        expected = _brute(keys, prefix)
        formed = index.formed(prefix)
        assert (formed.first, formed.count) == (tuple(expected[:LISTED]), len(expected)), prefix


def test_every_cut_of_every_denied_name_is_found() -> None:
    for name, extra in itertools.product(
        [*EXACT_NAMES, "CUDA_MPS_X", "CUDA_DEVICE_SM_LIMIT_12"], ["", "\n"]
    ):
        whole = name + extra
        for i in range(len(whole)):
            prefix, key = whole[:i], whole[i:]
            formed = SourceKeys.of({key, "LOG_LEVEL"}).formed(prefix)
            assert key in formed.first, (prefix, key)


def test_a_harmless_source_of_many_keys_keeps_a_few() -> None:
    index = SourceKeys.of(f"KEY_{i:05d}" for i in range(40_000))
    assert index.near == {}
    # CUDA_MPS_ makes every key a denied variable: five named, the rest counted.
    assert index.formed("CUDA_MPS_").count == 40_000
    assert len(index.formed("CUDA_MPS_").first) == LISTED
    assert index.formed("").count == 0
