"""Issue 29 item 5: a restart's list of ConfigMaps is bounded in memory. Pages are small, each
is parsed one object at a time (never a whole page of parsed objects), and the cache keeps of a
ConfigMap only what the environment check needs (SourceKeys), reused while its resourceVersion
stays the same."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuwarden.kube.cluster import ConfigMapKeys
from gpuwarden.kube.informer import Informer, list_fields
from gpuwarden.policy.pod.environment import SourceKeys


def config_map(name: str, keys: int, version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team", "resourceVersion": version},
        "data": {f"KEY_{i}": "x" * 20 for i in range(keys)},
    }


@dataclass
class Page:
    """An answer read in chunks of an odd size, so objects and numbers are cut across them."""

    data: bytes

    def stream(self, amount: int) -> Iterator[bytes]:
        for at in range(0, len(self.data), 4093):
            yield self.data[at : at + 4093]

    def release_conn(self) -> None:
        return None


def chunked(text: str, size: int) -> list[bytes]:
    data = text.encode()
    return [data[at : at + size] for at in range(0, len(data), size)]


class Server:
    """A list endpoint serving ConfigMaps in pages of the size asked for."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects
        self.limits: list[int] = []

    def __call__(self, **kwargs: Any) -> Page:
        limit = int(kwargs["limit"])
        self.limits.append(limit)
        start = int(kwargs.get("_continue") or 0)
        page = self.objects[start : start + limit]
        more = start + limit < len(self.objects)
        meta = {"resourceVersion": "42", **({"continue": str(start + limit)} if more else {})}
        # Items first, metadata last: the order is the server's to choose.
        body = {"kind": "ConfigMapList", "items": page, "apiVersion": "v1", "metadata": meta}
        return Page(json.dumps(body).encode())


def test_a_list_asks_for_small_pages_and_keeps_only_what_the_checks_need() -> None:
    server = Server([config_map(f"cm-{i}", 2000) for i in range(120)])
    sink = ConfigMapKeys()
    informer: Informer[Any] = Informer("configmaps", server, sink.transform, sink)
    assert informer._list() == "42"  # one list, as a (re)start of the informer runs it
    assert max(server.limits) <= 50
    assert len(server.limits) == 3
    assert len(sink.items) == 120
    version, kept = sink.items["team/cm-7"]
    assert version == "1"
    assert isinstance(kept, SourceKeys)
    # 2,000 harmless key names are not kept: a count, and the five CUDA_MPS_ would name.
    assert (kept.size, kept.near) == (2000, {})
    assert len(kept.formed("CUDA_MPS_").first) == 5


def test_an_unchanged_config_map_is_not_indexed_again() -> None:
    server = Server([config_map("a", 10), config_map("b", 10)])
    sink = ConfigMapKeys()
    informer: Informer[Any] = Informer("configmaps", server, sink.transform, sink)
    informer._list()
    before = dict(sink.items)
    server.objects = [config_map("a", 10), config_map("b", 11, version="2")]
    informer._list()
    assert sink.items["team/a"] is before["team/a"]
    assert sink.items["team/b"][0] == "2"
    assert sink.items["team/b"][1].size == 11


@pytest.mark.parametrize(
    "text",
    [
        '{"items": [{"a": 1}, {"b": [2, {"c": "]"}]}], "metadata": {"continue": "x"}}',
        ' {\n "metadata" : {"continue": "x"} ,"items":[ {"a":1} ,\t{"b":[2,{"c":"]"}]} ] } ',
    ],
)
@pytest.mark.parametrize("size", [1, 3, 1000])
def test_list_fields_hands_out_items_one_at_a_time(text: str, size: int) -> None:
    seen: list[Any] = []
    assert list_fields(chunked(text, size), seen.append) == {"metadata": {"continue": "x"}}
    assert seen == [{"a": 1}, {"b": [2, {"c": "]"}]}]


def test_numbers_and_characters_cut_across_chunks() -> None:
    text = '{"count": 123456, "items": [{"name": "caf\u00e9 é"}], "n": 78}'
    seen: list[Any] = []
    assert list_fields(chunked(text, 1), seen.append) == {"count": 123456, "n": 78}
    assert seen == [{"name": "café é"}]


@pytest.mark.parametrize("text", ['{"items": [], "metadata": {}}', '{"items": null}', "{}"])
def test_list_fields_of_empty_lists(text: str) -> None:
    seen: list[Any] = []
    list_fields(chunked(text, 2), seen.append)
    assert seen == []


@pytest.mark.parametrize("text", ["", "[]", '{"items": [1,', '{"items": [1] "x": 2}', '{"a" 1}'])
def test_list_fields_refuses_what_is_not_a_list_response(text: str) -> None:
    with pytest.raises(ValueError):
        list_fields(chunked(text, 2), lambda _: None)
