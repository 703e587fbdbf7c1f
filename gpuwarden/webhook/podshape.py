"""The JSON types of the Pod fields gpuwarden reads, checked as the API server's typed decoding would.

A real API server decodes every pod into its Go struct before calling a webhook, so a
``resources`` that is a string, or a label value that is a number, never arrives from it. A
review that carries one anyway is a client mistake: it gets a 400 naming the field, rather
than reaching the policy core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwarden.webhook.review import short_repr

_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
_SPEC_STRINGS = (
    "schedulerName",
    "priorityClassName",
    "preemptionPolicy",
    "nodeName",
    "runtimeClassName",
)
_SPEC_BOOLS = ("hostIPC", "hostPID", "hostNetwork")
_SPEC_LISTS = ("volumes", "tolerations")


class ShapeError(ValueError):
    """A field whose JSON type no Kubernetes Pod can have; the message names it."""


def _type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _fail(path: str, wanted: str, value: Any) -> ShapeError:
    return ShapeError(f"{path} must be {wanted}, not {_type(value)}")


# The hot path: JSON decodes objects to dicts, so plain ``dict`` checks (not the Mapping ABC),
# and a field's path is formatted only for an error.
_QUANTITY_TYPES = (str, int, float)


def _string_map(value: Any, parent: str, field: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _fail(f"{parent}.{field}", "an object", value)
    for key, item in value.items():
        if type(item) is not str:
            raise _fail(f"{parent}.{field}[{short_repr(key)}]", "a string", item)


def _quantities(value: Any, resources_path: str, section: str) -> None:
    if not isinstance(value, dict):
        raise _fail(f"{resources_path}.{section}", "an object", value)
    for key, item in value.items():
        if type(item) not in _QUANTITY_TYPES:
            raise _fail(
                f"{resources_path}.{section}[{short_repr(key)}]",
                "a quantity (string or number)",
                item,
            )


def _container(body: Any, spec_path: str, field: str, index: int) -> None:
    if not isinstance(body, dict):
        raise _fail(f"{spec_path}.{field}[{index}]", "an object", body)
    path = f"{spec_path}.{field}[{index}]"
    name = body.get("name")
    if name is not None and type(name) is not str:
        raise _fail(f"{path}.name", "a string", name)
    resources = body.get("resources")
    if resources is not None:
        if not isinstance(resources, dict):
            raise _fail(f"{path}.resources", "an object", resources)
        for section in ("limits", "requests"):
            values = resources.get(section)
            if values is not None:
                _quantities(values, f"{path}.resources", section)
    env = body.get("env")
    if env is not None:
        if not isinstance(env, list):
            raise _fail(f"{path}.env", "an array", env)
        for index, item in enumerate(env):
            if not isinstance(item, dict):
                raise _fail(f"{path}.env[{index}]", "an object", item)
            for key in ("name", "value"):
                value = item.get(key)
                if value is not None and type(value) is not str:
                    raise _fail(f"{path}.env[{index}].{key}", "a string", value)
            source = item.get("valueFrom")
            if source is not None and not isinstance(source, dict):
                raise _fail(f"{path}.env[{index}].valueFrom", "an object", source)
    env_from = body.get("envFrom")
    if env_from is not None:
        if not isinstance(env_from, list):
            raise _fail(f"{path}.envFrom", "an array", env_from)
        for index, item in enumerate(env_from):
            if not isinstance(item, dict):
                raise _fail(f"{path}.envFrom[{index}]", "an object", item)
    context = body.get("securityContext")
    if context is not None and not isinstance(context, dict):
        raise _fail(f"{path}.securityContext", "an object", context)
    mounts = body.get("volumeMounts")
    if mounts is not None and not isinstance(mounts, list):
        raise _fail(f"{path}.volumeMounts", "an array", mounts)


def check_pod(pod: Mapping[str, Any], path: str = "request.object") -> None:
    """Raise ShapeError for the first field whose JSON type a Pod cannot have."""
    metadata = pod.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _fail(f"{path}.metadata", "an object", metadata)
    if metadata is not None:
        for key in ("name", "namespace", "generateName"):
            value = metadata.get(key)
            if value is not None and type(value) is not str:
                raise _fail(f"{path}.metadata.{key}", "a string", value)
        for key in ("labels", "annotations"):
            _string_map(metadata.get(key), path, f"metadata.{key}")
    spec = pod.get("spec")
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise _fail(f"{path}.spec", "an object", spec)
    for field in _CONTAINER_LISTS:
        items = spec.get(field)
        if items is None:
            continue
        if not isinstance(items, list):
            raise _fail(f"{path}.spec.{field}", "an array", items)
        for index, body in enumerate(items):
            _container(body, f"{path}.spec", field, index)
    for key in _SPEC_STRINGS:
        value = spec.get(key)
        if value is not None and type(value) is not str:
            raise _fail(f"{path}.spec.{key}", "a string", value)
    for key in _SPEC_BOOLS:
        value = spec.get(key)
        if value is not None and type(value) is not bool:
            raise _fail(f"{path}.spec.{key}", "a boolean", value)
    for key in _SPEC_LISTS:
        items = spec.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            raise _fail(f"{path}.spec.{key}", "an array", items)
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise _fail(f"{path}.spec.{key}[{index}]", "an object", item)
    _string_map(spec.get("nodeSelector"), path, "spec.nodeSelector")
    priority = spec.get("priority")
    if priority is not None and type(priority) is not int:
        raise _fail(f"{path}.spec.priority", "an integer", priority)
    context = spec.get("securityContext")
    if context is not None and not isinstance(context, dict):
        raise _fail(f"{path}.spec.securityContext", "an object", context)
