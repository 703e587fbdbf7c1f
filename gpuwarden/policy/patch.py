"""Build RFC 6902 JSON Patches while applying them to a working copy.

Every operation is recorded and applied at once, so each path is valid against the document as the
previous operations left it; operations that would change nothing are not recorded, which is what
makes a second decision on a mutated pod an empty patch.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

JsonPatch = list[dict[str, Any]]


def escape(token: str) -> str:
    """Escape one JSON Pointer reference token (RFC 6901): '~' -> '~0', '/' -> '~1'."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(path: Sequence[str | int]) -> str:
    return "".join(f"/{escape(str(part))}" for part in path)


class PatchBuilder:
    """A working copy of a document plus the operations that produced it from the original."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document: dict[str, Any] = copy.deepcopy(dict(document))
        self.ops: JsonPatch = []

    def get(self, path: Sequence[str | int]) -> Any:
        node: Any = self.document
        for part in path:
            if isinstance(node, dict) and isinstance(part, str) and part in node:
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node = node[part]
            else:
                return None
        return node

    def _record(self, op: str, path: Sequence[str | int], value: Any = None) -> None:
        entry: dict[str, Any] = {"op": op, "path": pointer(path)}
        if op != "remove":
            entry["value"] = copy.deepcopy(value)
        self.ops.append(entry)

    def set(self, path: Sequence[str | int], value: Any) -> None:
        """Make ``path`` hold ``value``, adding whole maps for missing parents."""
        if not path:
            raise ValueError("cannot set the document root")
        parent_path, key = list(path[:-1]), path[-1]
        # Find the deepest existing map along the path; add the rest as one nested value.
        depth = len(parent_path)
        while depth > 0 and not isinstance(self.get(parent_path[:depth]), dict):
            depth -= 1
        base = self.get(parent_path[:depth]) if depth else self.document
        if not isinstance(base, dict):
            raise ValueError(f"{pointer(parent_path[:depth])} is not an object")
        if depth < len(parent_path):
            nested: Any = value
            for part in reversed([*parent_path[depth + 1 :], key]):
                nested = {part: nested}
            first = str(parent_path[depth])
            op = "replace" if first in base else "add"
            base[first] = copy.deepcopy(nested)
            self._record(op, [*parent_path[: depth + 1]], nested)
            return
        if isinstance(key, int):
            raise ValueError("use set_list_item for list elements")
        if key in base:
            if base[key] == value:
                return
            base[key] = copy.deepcopy(value)
            self._record("replace", path, value)
        else:
            base[key] = copy.deepcopy(value)
            self._record("add", path, value)

    def remove(self, path: Sequence[str | int]) -> None:
        """Remove ``path`` if it exists."""
        parent = self.get(path[:-1]) if len(path) > 1 else self.document
        key = path[-1]
        if isinstance(parent, dict) and isinstance(key, str) and key in parent:
            del parent[key]
            self._record("remove", path)
        elif isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent):
            del parent[key]
            self._record("remove", path)

    def set_list_item(self, path: Sequence[str | int], index: int, value: Any) -> None:
        current = self.get(path)
        if not isinstance(current, list) or not 0 <= index < len(current):
            raise IndexError(f"{pointer(path)}/{index} does not exist")
        if current[index] == value:
            return
        current[index] = copy.deepcopy(value)
        self._record("replace", [*path, index], value)

    def append(self, path: Sequence[str | int], value: Any) -> None:
        """Append to the list at ``path``, adding the whole list when it is absent."""
        current = self.get(path)
        if current is None:
            self.set(path, [value])
            return
        if not isinstance(current, list):
            raise ValueError(f"{pointer(path)} is not a list")
        current.append(copy.deepcopy(value))
        self._record("add", [*path, "-"], value)
