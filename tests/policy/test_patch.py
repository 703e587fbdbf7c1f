"""The JSON Patch builder: RFC 6901 pointers, whole maps when absent, no no-op operations."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from gpuwarden.policy.admission.patch import PatchBuilder
from gpuwarden.policy.pod.pointer import escape, pointer, tokens


def check(original: dict[str, Any], builder: PatchBuilder) -> None:
    """The recorded ops turn the original into the builder's document, by another implementation."""
    assert jsonpatch.apply_patch(copy.deepcopy(original), builder.ops) == builder.document


@pytest.mark.parametrize(
    ("token", "escaped"),
    [
        ("plain", "plain"),
        ("nvidia.com/gpu", "nvidia.com~1gpu"),
        ("a~b", "a~0b"),
        ("~1", "~01"),  # escape '~' first, or '~1' would read back as '/'
        ("/~/", "~1~0~1"),
        ("", ""),
    ],
)
def test_escape(token: str, escaped: str) -> None:
    assert escape(token) == escaped
    assert jsonpatch.JsonPointer(f"/{escaped}").parts == [token]


def test_pointer_mixes_keys_and_indices() -> None:
    assert pointer(["spec", "containers", 1, "resources", "limits", "nvidia.com/gpu"]) == (
        "/spec/containers/1/resources/limits/nvidia.com~1gpu"
    )


@pytest.mark.parametrize(
    "path",
    [[], [""], ["spec", "containers", 1], ["a~b", "a/b", "~1", "/~/", "x~0y", "nvidia.com/gpu"]],
)
def test_tokens_read_back_what_pointer_wrote(path: list[str | int]) -> None:
    written = pointer(path)
    assert tokens(written) == [str(part) for part in path]
    assert tokens(written) == jsonpatch.JsonPointer(written).parts


def test_absent_maps_are_added_whole_in_one_op() -> None:
    original: dict[str, Any] = {"metadata": {"name": "p"}}
    builder = PatchBuilder(original)
    builder.set(["metadata", "annotations", "gpuwarden.io/profile"], "x")
    builder.set(["spec", "nodeSelector", "pool"], "a100")
    assert builder.ops == [
        {"op": "add", "path": "/metadata/annotations", "value": {"gpuwarden.io/profile": "x"}},
        {"op": "add", "path": "/spec", "value": {"nodeSelector": {"pool": "a100"}}},
    ]
    check(original, builder)


@pytest.mark.parametrize(
    ("original", "path", "op"),
    [
        ({"metadata": {"annotations": None}}, ["metadata", "annotations", "k"], "replace"),
        ({"metadata": None}, ["metadata", "annotations", "k"], "replace"),
        ({"metadata": {"annotations": "junk"}}, ["metadata", "annotations", "k"], "replace"),
        ({"metadata": {}}, ["metadata", "annotations", "k"], "add"),
    ],
)
def test_null_or_non_map_parents_are_replaced(
    original: dict[str, Any], path: list[str], op: str
) -> None:
    builder = PatchBuilder(original)
    builder.set(path, "v")
    assert [o["op"] for o in builder.ops] == [op]
    assert builder.document["metadata"]["annotations"] == {"k": "v"}
    check(original, builder)


@pytest.mark.parametrize("junk", [[], ["a"], "text", 3, True])
def test_maps_of_the_wrong_kind_are_replaced_not_a_crash(junk: Any) -> None:
    original: dict[str, Any] = {"metadata": junk, "spec": {"nodeSelector": junk}}
    builder = PatchBuilder(original)
    builder.merge(["metadata", "annotations"], {"a/b": "1"})
    builder.set(["spec", "nodeSelector", "pool"], "a100")
    assert builder.document == {
        "metadata": {"annotations": {"a/b": "1"}},
        "spec": {"nodeSelector": {"pool": "a100"}},
    }
    assert [op["op"] for op in builder.ops] == ["replace", "replace"]
    check(original, builder)


@pytest.mark.parametrize("junk", [{"a": 1}, "text", 3, True])
def test_lists_of_the_wrong_kind_are_replaced_not_a_crash(junk: Any) -> None:
    original: dict[str, Any] = {"spec": {"containers": [{"env": junk}], "tolerations": junk}}
    builder = PatchBuilder(original)
    builder.append(["spec", "containers", 0, "env"], {"name": "X", "value": "1"})
    builder.append(["spec", "tolerations"], {"key": "k"})
    assert builder.document == {
        "spec": {
            "containers": [{"env": [{"name": "X", "value": "1"}]}],
            "tolerations": [{"key": "k"}],
        }
    }
    check(original, builder)


def test_null_resources_in_a_list_item() -> None:
    original = {"spec": {"containers": [{"name": "a", "resources": None}]}}
    builder = PatchBuilder(original)
    builder.set(["spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"], "1")
    assert builder.ops == [
        {
            "op": "replace",
            "path": "/spec/containers/0/resources",
            "value": {"limits": {"nvidia.com/gpu": "1"}},
        }
    ]
    check(original, builder)


def test_setting_the_same_value_records_nothing() -> None:
    original = {"spec": {"schedulerName": "volcano", "priority": 0}}
    builder = PatchBuilder(original)
    builder.set(["spec", "schedulerName"], "volcano")
    builder.merge(["spec"], {"priority": 0})
    builder.merge(["spec"], {})
    builder.remove(["spec", "absent"])
    builder.remove(["nothing", "here"])
    assert builder.ops == []


def test_priority_zero_is_not_the_same_as_false_or_absent() -> None:
    builder = PatchBuilder({"spec": {"priority": None}})
    builder.merge(["spec"], {"priority": 0})
    assert builder.ops == [{"op": "replace", "path": "/spec/priority", "value": 0}]


def test_merge_adds_a_whole_absent_map_then_one_op_per_changed_key() -> None:
    original: dict[str, Any] = {"metadata": {}}
    builder = PatchBuilder(original)
    builder.merge(["metadata", "annotations"], {"a/b": "1", "c~d": "2"})
    assert builder.ops == [
        {"op": "add", "path": "/metadata/annotations", "value": {"a/b": "1", "c~d": "2"}}
    ]
    builder.merge(["metadata", "annotations"], {"a/b": "1", "c~d": "3", "e": "4"})
    assert builder.ops[1:] == [
        {"op": "replace", "path": "/metadata/annotations/c~0d", "value": "3"},
        {"op": "add", "path": "/metadata/annotations/e", "value": "4"},
    ]
    check(original, builder)


def test_merge_leaves_keys_it_does_not_name() -> None:
    original = {"metadata": {"annotations": {"theirs": "keep", "ours": "old"}}}
    builder = PatchBuilder(original)
    builder.merge(["metadata", "annotations"], {"ours": "new"})
    assert builder.document["metadata"]["annotations"] == {"theirs": "keep", "ours": "new"}
    check(original, builder)


def test_remove_and_list_operations() -> None:
    original = {
        "spec": {
            "containers": [{"name": "a", "env": [{"name": "X", "value": "1"}]}, {"name": "b"}],
            "tolerations": None,
        }
    }
    builder = PatchBuilder(original)
    builder.append(["spec", "containers", 0, "env"], {"name": "Y", "value": "2"})
    builder.append(["spec", "containers", 1, "env"], {"name": "Z", "value": "3"})
    builder.set_list_item(["spec", "containers", 0, "env"], 0, {"name": "X", "value": "1"})
    builder.set_list_item(["spec", "containers", 0, "env"], 0, {"name": "X", "value": "9"})
    builder.append(["spec", "tolerations"], {"key": "gpu", "operator": "Exists"})
    builder.remove(["spec", "containers", 1, "name"])
    assert builder.ops == [
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "Y", "value": "2"}},
        {"op": "add", "path": "/spec/containers/1/env", "value": [{"name": "Z", "value": "3"}]},
        {"op": "replace", "path": "/spec/containers/0/env/0", "value": {"name": "X", "value": "9"}},
        {
            "op": "replace",
            "path": "/spec/tolerations",
            "value": [{"key": "gpu", "operator": "Exists"}],
        },
        {"op": "remove", "path": "/spec/containers/1/name"},
    ]
    check(original, builder)


def test_set_list_item_outside_the_list_is_an_error() -> None:
    builder = PatchBuilder({"spec": {"containers": []}})
    with pytest.raises(IndexError):
        builder.set_list_item(["spec", "containers"], 0, {})


def test_the_original_document_is_never_modified() -> None:
    original: dict[str, Any] = {
        "metadata": {"annotations": {"a": "1"}, "labels": {"x": "y"}},
        "spec": {"containers": [{"name": "c", "env": [], "resources": {"limits": {"cpu": "1"}}}]},
    }
    frozen = copy.deepcopy(original)
    builder = PatchBuilder(original)
    builder.merge(["metadata", "annotations"], {"a": "2", "b": "3"})
    builder.append(["spec", "containers", 0, "env"], {"name": "E", "value": "v"})
    builder.set(["spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"], "1")
    builder.remove(["spec", "containers", 0, "resources", "limits", "cpu"])
    builder.set(["spec", "schedulerName"], "volcano")
    assert original == frozen
    check(frozen, builder)
    # Values handed to the builder are copied: changing them later changes neither side.
    value = {"k": ["v"]}
    builder.set(["spec", "nodeSelector"], value)
    value["k"].append("changed")
    assert builder.document["spec"]["nodeSelector"] == {"k": ["v"]}
    assert builder.ops[-1]["value"] == {"k": ["v"]}


def test_cannot_set_the_root() -> None:
    with pytest.raises(ValueError):
        PatchBuilder({}).set([], 1)
