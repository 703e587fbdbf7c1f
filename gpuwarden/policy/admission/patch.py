"""Build RFC 6902 JSON Patches while applying them to a working copy.

Every operation is recorded and applied at once, so each path is valid against the document as the
previous operations left it; operations that would change nothing are not recorded, which is what
makes a second decision on a mutated pod an empty patch. The working copy shares structure with
the original and copies only the maps and lists along the paths it writes (the original is never
modified), which keeps a decision cheap on large pods.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpuwarden.policy.pod.pointer import escape, pointer

JsonPatch = list[dict[str, Any]]


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _clone(value: Any) -> Any:
    """A deep copy of JSON data (much cheaper than copy.deepcopy, which keeps a memo)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {key: _clone(item) for key, item in value.items()}
    if kind is list:
        return [_clone(item) for item in value]
    return copy.deepcopy(value)


def _can_hold(node: Any, part: str | int) -> bool:
    """Whether ``part`` can be looked up in ``node``: a key in a map, an index in a list."""
    if isinstance(node, dict):
        return isinstance(part, str)
    return isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)


class PatchBuilder:
    """A working copy of a document plus the operations that produced it from the original."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document: dict[str, Any] = dict(document)
        self.ops: JsonPatch = []
        self._owned: set[int] = {id(self.document)}

    def _writable(self, path: Sequence[str | int]) -> Any:
        """The container at ``path`` (which must exist), each map and list along the way copied
        first unless this builder already made it."""
        owned = self._owned
        node: Any = self.document
        for part in path:
            child = node[part]
            if id(child) not in owned:
                if isinstance(child, dict):
                    child = dict(child)
                elif isinstance(child, list):
                    child = list(child)
                else:
                    return child
                node[part] = child
                owned.add(id(child))
            node = child
        return node

    def get(self, path: Sequence[str | int]) -> Any:
        """The value at ``path``, or None where it is absent (or a parent is not a container)."""
        node: Any = self.document
        for part in path:
            kind = type(node)
            if kind is dict and type(part) is str:
                node = node.get(part)
            elif kind is list and type(part) is int and 0 <= part < len(node):
                node = node[part]
            else:
                return None
        return node

    def _record(self, op: str, path: Sequence[str | int], value: Any = None) -> None:
        entry: dict[str, Any] = {"op": op, "path": pointer(path)}
        if op != "remove":
            entry["value"] = _clone(value)
        self.ops.append(entry)

    def set(self, path: Sequence[str | int], value: Any) -> None:
        """Make ``path`` hold ``value``, adding whole maps for missing parents."""
        if not path:
            raise ValueError("cannot set the document root")
        parent_path, key = list(path[:-1]), path[-1]
        # Find the deepest existing container along the path; add the rest as one nested value.
        # A value of the wrong kind on the way (metadata: [], resources: "x") is replaced whole.
        node: Any = self.document
        depth = 0
        for part, following in zip(parent_path, [*parent_path[1:], key], strict=True):
            if isinstance(node, dict) and isinstance(part, str):
                node = node.get(part)
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node = node[part]
            else:
                break
            if not _can_hold(node, following):
                break
            depth += 1
        base = self._writable(parent_path[:depth])
        if not isinstance(base, dict):
            raise ValueError(f"{pointer(parent_path[:depth])} is not an object")
        if depth < len(parent_path):
            nested: Any = value
            for part in reversed([*parent_path[depth + 1 :], key]):
                nested = {part: nested}
            first = str(parent_path[depth])
            op = "replace" if first in base else "add"
            base[first] = _clone(nested)
            self._record(op, [*parent_path[: depth + 1]], nested)
            return
        if isinstance(key, int):
            raise ValueError("use set_list_item for list elements")
        if key in base:
            if base[key] == value:
                return
            base[key] = _clone(value)
            self._record("replace", path, value)
        else:
            base[key] = _clone(value)
            self._record("add", path, value)

    def merge(self, path: Sequence[str | int], values: Mapping[str, Any]) -> None:
        """Make the map at ``path`` hold these keys: one op for a whole absent map, else one per
        changed key. Keys not named are left alone: they are not ours."""
        self.update(path, values)

    def discard(self, path: Sequence[str | int], keys: Collection[str]) -> None:
        """Remove these keys from the map at ``path``, where they are present."""
        self.update(path, {}, keys)

    def update(
        self, path: Sequence[str | int], values: Mapping[str, Any], removed: Collection[str] = ()
    ) -> None:
        """Remove the keys ``removed`` (none of them in ``values``) from the map at ``path`` where
        present, then merge ``values`` into it: one walk down the path for both."""
        if not values and not removed:
            return
        current = self.get(path)
        if not isinstance(current, dict):
            if values:
                self.set(path, dict(values))
            return
        self._update_map(path, None, current, values, removed)

    def update_each(
        self,
        path: Sequence[str | int],
        changes: Sequence[tuple[str, Mapping[str, Any], Collection[str]]],
    ) -> None:
        """``update([*path, name], values, removed)`` for each (name, values, removed) in order,
        the names distinct: one walk to ``path`` and one pointer to it for all of them."""
        parent = self.get(path)
        prefix = pointer(path) + "/" if isinstance(parent, dict) else None
        for name, values, removed in changes:
            # The other names' changes leave this one's map as it was in ``parent``.
            current = parent.get(name) if prefix is not None else None
            if isinstance(current, dict) and (values or removed):
                child_prefix = f"{prefix}{escape(name)}/"
                self._update_map([*path, name], child_prefix, current, values, removed)
            else:
                self.update([*path, name], values, removed)

    def _update_map(
        self,
        path: Sequence[str | int],
        prefix: str | None,
        current: dict[str, Any],
        values: Mapping[str, Any],
        removed: Collection[str],
    ) -> None:
        """update() of ``current``, the map at ``path`` (its pointer and a slash: ``prefix``,
        where known)."""
        changed = [(k, v) for k, v in values.items() if k not in current or current[k] != v]
        present = [key for key in removed if key in current] if removed else removed
        if not present and not changed:
            return
        base = self._writable(path)
        if prefix is None:
            prefix = pointer(path) + "/"
        ops = self.ops
        for key in present:
            del base[key]
            ops.append({"op": "remove", "path": prefix + escape(key)})
        for key, value in changed:
            op = "replace" if key in base else "add"
            if type(value) in _SCALARS:
                base[key] = value
            else:
                base[key], value = _clone(value), _clone(value)
            ops.append({"op": op, "path": prefix + escape(key), "value": value})

    def remove(self, path: Sequence[str | int]) -> None:
        """Remove ``path`` if it exists."""
        if self.get(path) is None and not self._exists(path):
            return
        parent = self._writable(path[:-1])
        key = path[-1]
        if isinstance(parent, dict) and isinstance(key, str) and key in parent:
            del parent[key]
            self._record("remove", path)
        elif isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent):
            del parent[key]
            self._record("remove", path)

    def _exists(self, path: Sequence[str | int]) -> bool:
        parent = self.get(path[:-1]) if len(path) > 1 else self.document
        key = path[-1]
        if isinstance(parent, dict):
            return key in parent
        return isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent)

    def set_list_item(self, path: Sequence[str | int], index: int, value: Any) -> None:
        current = self.get(path)
        if not isinstance(current, list) or not 0 <= index < len(current):
            raise IndexError(f"{pointer(path)}/{index} does not exist")
        if current[index] == value:
            return
        current = self._writable(path)
        current[index] = _clone(value)
        self._record("replace", [*path, index], value)

    def append(self, path: Sequence[str | int], value: Any) -> None:
        """Append to the list at ``path``, adding the whole list when it is absent (or not a list)."""
        current = self.get(path)
        if not isinstance(current, list):
            self.set(path, [value])
            return
        current = self._writable(path)
        current.append(_clone(value))
        self._record("add", [*path, "-"], value)
