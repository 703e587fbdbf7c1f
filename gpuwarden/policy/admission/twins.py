"""A pod's JSON Patch written onto the fields of a job that make the pod, where the job holds
no pod template but builds the pod from its own fields (a KServe component:
:attr:`gpuwarden.policy.pod.jobs.ReplicaTemplate.twins` pairs each pod field with its twin in
the job)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jsonpatch

from gpuwarden.policy.pod.pointer import escape, pointer, tokens

_MISSING = object()


def _resolve(document: Any, tokens: Sequence[str]) -> Any:
    for token in tokens:
        if isinstance(document, Mapping):
            document = document.get(token, _MISSING)
        elif isinstance(document, list) and token.isdigit() and int(token) < len(document):
            document = document[int(token)]
        else:
            return _MISSING
    return document


def value_at(document: Any, where: str) -> Any:
    """The value at a JSON Pointer into ``document``, or None where it is absent."""
    found = _resolve(document, tokens(where))
    return None if found is _MISSING else found


def twin_of(twins: Sequence[tuple[str, str]], path: str) -> str | None:
    """The job's JSON pointer that holds the pod's field at ``path``, or None."""
    found = [(pod, job) for pod, job in twins if path == pod or path.startswith(pod + "/")]
    if not found:
        return None
    pod, job = max(found, key=lambda pair: len(pair[0]))
    return job + path[len(pod) :]


def twin_patch(
    job: Mapping[str, Any],
    twins: Sequence[tuple[str, str]],
    pod_patch: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[str]]:
    """The pod's JSON Patch written onto the job's fields that make the pod (``twins``), valid
    against ``job``: the maps an operation needs created first, a map added where the job has
    one merged key by key; and the pod paths that have no twin."""
    document: Any = job
    ops: list[dict[str, Any]] = []
    lost: list[str] = []

    def emit(op: dict[str, Any]) -> None:
        nonlocal document
        ops.append(op)
        document = jsonpatch.apply_patch(document, [op])

    for op in pod_patch:
        target = twin_of(twins, op["path"])
        if target is None:
            lost.append(op["path"])
            continue
        parts = tokens(target)
        current = _resolve(document, parts)
        if op["op"] == "remove":
            if current is _MISSING:
                lost.append(op["path"])
            else:
                emit({"op": "remove", "path": target})
            continue
        parent_ok = True
        for depth in range(1, len(parts)):
            here = _resolve(document, parts[:depth])
            if here is _MISSING:
                emit({"op": "add", "path": pointer(parts[:depth]), "value": {}})
            elif not isinstance(here, (Mapping, list)):
                parent_ok = False
                break
        if not parent_ok:
            lost.append(op["path"])
        elif isinstance(op.get("value"), Mapping) and isinstance(current, Mapping):
            for key, value in op["value"].items():
                emit({"op": "add", "path": f"{target}/{escape(str(key))}", "value": value})
        else:
            verb = "add" if current is _MISSING else op["op"]
            emit({"op": verb, "path": target, "value": op.get("value")})
    return ops, lost


def _writes_under(
    twins: Sequence[tuple[str, str]], pod_patch: Sequence[Mapping[str, Any]], prefix: str
) -> dict[str, Any]:
    """What a pod's patch writes under the job's ``prefix`` through ``twins``, key by key."""
    writes: dict[str, Any] = {}
    for op in pod_patch:
        target = twin_of(twins, op["path"])
        if target is None:
            continue
        value = op.get("value") if op["op"] != "remove" else _MISSING
        if isinstance(value, Mapping):
            items = {f"{target}/{escape(str(k))}": v for k, v in value.items()}
        else:
            items = {target: value}
        writes |= {t: v for t, v in items.items() if t == prefix or t.startswith(prefix + "/")}
    return writes


Writes = tuple[str, Sequence[tuple[str, str]], Sequence[Mapping[str, Any]]]


def split_twins(replicas: Sequence[Writes]) -> tuple[str, str, str] | None:
    """Two replicas (name, twins, pod patch) whose pods share a field of the job (the labels of
    an LLMInferenceService's leader and workers) but would get different values in it: their
    names and the field."""
    holders: dict[str, list[Writes]] = {}
    for replica in replicas:
        for _, target in replica[1]:
            holders.setdefault(target, []).append(replica)
    for prefix, sharing in holders.items():
        (first, twins, patch), *others = sharing
        seen = _writes_under(twins, patch, prefix)
        for other, other_twins, other_patch in others:
            if _writes_under(other_twins, other_patch, prefix) != seen:
                return first, other, field_name(prefix)
    return None


def field_name(pointer: str) -> str:
    """A JSON pointer as messages name fields, as Kubernetes' field paths do:
    ``/spec/containers/0`` is spec.containers[0], and a key holding a dot or a slash is
    bracketed, ``/metadata/labels/app.kubernetes.io~1name`` metadata.labels[app.kubernetes.io/name]."""
    name = ""
    for token in tokens(pointer):
        if token.isdigit() or "." in token or "/" in token:
            name += f"[{token}]"
        else:
            name += f".{token}" if name else token
    return name


def job_field(twins: Sequence[tuple[str, str]], pod_field: str) -> str | None:
    """The job's field, as messages name it, that holds the pod's ``pod_field``
    (``spec.containers[0].resources``), or None."""
    twin = twin_of(twins, "/" + re.sub(r"\[(\d+)\]", r".\1", pod_field).replace(".", "/"))
    return None if twin is None else field_name(twin)


def in_job_terms(twins: Sequence[tuple[str, str]], pod: Mapping[str, Any], message: str) -> str:
    """A pod's denial naming the job's fields where the pod was built from them: the
    container ``spec.containers[kserve-container]`` as ``spec.predictor.model``."""
    spec = pod.get("spec")
    if not twins or not isinstance(spec, Mapping):
        return message
    for field in ("containers", "initContainers"):
        items = spec.get(field)
        for i, c in enumerate(items if isinstance(items, list) else ()):
            name = c.get("name") if isinstance(c, Mapping) else None
            twin = twin_of(twins, f"/spec/{field}/{i}")
            if isinstance(name, str) and twin is not None:
                message = message.replace(f"spec.{field}[{name}]", field_name(twin))
    return message
