"""The GPUPolicy CRD and the README's field table, generated from the pydantic model.

Pydantic writes JSON Schema (2020-12): ``$defs``/``$ref``, ``anyOf`` with ``null`` for optional
fields, ``oneOf`` plus ``discriminator`` for tagged unions, ``const`` and ``title``. A CRD needs a
*structural* OpenAPI v3 schema instead: every node typed, no references, no ``discriminator`` or
``const``, and no types or descriptions inside ``oneOf``/``anyOf``. The conversion here is
explicit about every keyword it meets: one it does not know raises :class:`SchemaError`, so a
model change that needs a new rule fails the schema test instead of producing a wrong CRD.

Tagged unions (``backend`` by ``type``, ``match`` by ``kind``) become one object holding every
variant's fields, with the tag as a required enum, and CEL rules
(``x-kubernetes-validations``) that refuse a field under a tag that does not have it. Defaults
are not written into the CRD (the API server would store them, and the loader applies them
anyway); each field's description says its default instead.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from gpuwarden.policy import keys
from gpuwarden.policy.model import GPUPolicy

CRD_PLURAL = "gpupolicies"
CRD_SINGULAR = "gpupolicy"
CRD_NAME = f"{CRD_PLURAL}.{keys.API_GROUP}"
CRD_VERSION = keys.API_VERSION.split("/", 1)[1]
CRD_SHORT_NAMES = ("gpol",)

# Private keys of the intermediate tree (never written into the CRD).
_DEFAULT = "x-gpuwarden-default"
_VARIANTS = "x-gpuwarden-variants"  # property name -> tags of the union variants that have it
_TAG = "x-gpuwarden-tag"  # the discriminator property of a merged union
_DEFAULT_TEXT = "x-gpuwarden-default-text"  # per-variant defaults, as text

# Keywords the structural schema keeps as they are.
_KEPT = frozenset(
    {
        "description",
        "type",
        "enum",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "uniqueItems",
        "format",
        "x-kubernetes-int-or-string",
    }
)
# Keywords that only label the schema: dropped.
_DROPPED = frozenset({"title", "examples"})

# CEL identifiers Kubernetes escapes in x-kubernetes-validations (see "Escaping" in the CRD docs).
_CEL_RESERVED = frozenset(
    {
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    }
)


class SchemaError(ValueError):
    """The model uses a JSON Schema construct that has no structural-schema equivalent here."""


# --- pydantic JSON Schema -> intermediate tree ----------------------------------------------


@dataclass(frozen=True)
class _Context:
    defs: Mapping[str, Any]
    path: str
    seen: tuple[str, ...] = ()

    def at(self, part: str) -> _Context:
        if part.startswith("[") or not self.path:
            return _Context(self.defs, f"{self.path}{part}", self.seen)
        return _Context(self.defs, f"{self.path}.{part}", self.seen)


def _resolve(node: Mapping[str, Any], ctx: _Context) -> tuple[dict[str, Any], _Context]:
    """Inline a ``$ref`` (keeping sibling keywords such as description), refusing recursion."""
    if "$ref" not in node:
        return dict(node), ctx
    ref = node["$ref"]
    prefix = "#/$defs/"
    if not isinstance(ref, str) or not ref.startswith(prefix) or ref[len(prefix) :] not in ctx.defs:
        raise SchemaError(f"{ctx.path}: unsupported reference {ref!r}")
    name = ref[len(prefix) :]
    if name in ctx.seen:
        raise SchemaError(f"{ctx.path}: recursive model {name} cannot be a structural schema")
    target = dict(ctx.defs[name])
    siblings = {key: value for key, value in node.items() if key != "$ref"}
    target.update(siblings)
    return target, _Context(ctx.defs, ctx.path, (*ctx.seen, name))


def _join_descriptions(*parts: object) -> str | None:
    texts: list[str] = []
    for part in parts:
        if isinstance(part, str) and part.strip() and part.strip() not in texts:
            texts.append(part.strip())
    return "; ".join(texts) if texts else None


def _convert(node: Mapping[str, Any], ctx: _Context) -> dict[str, Any]:
    node, ctx = _resolve(node, ctx)
    if "anyOf" in node:
        return _convert_any_of(node, ctx)
    if "oneOf" in node:
        return _convert_union(node, ctx)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key in _KEPT:
            out[key] = copy.deepcopy(value)
        elif key == "const":
            out["enum"] = [value]
        elif key == "default":
            out[_DEFAULT] = copy.deepcopy(value)
        elif key == "properties":
            out["properties"] = {
                name: _convert(child, ctx.at(name)) for name, child in value.items()
            }
        elif key == "required":
            out["required"] = list(value)
        elif key == "additionalProperties":
            if value is False:
                # Unknown fields: the loader refuses them; the API server prunes them (and
                # refuses them under kubectl's default strict field validation).
                continue
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
                continue
            out["additionalProperties"] = _convert(value, ctx.at("*"))
        elif key == "items":
            out["items"] = _convert(value, ctx.at("[]"))
        elif key == "prefixItems":
            out.update(_convert_tuple(node, ctx))
        else:
            raise SchemaError(f"{ctx.path or '<root>'}: unsupported JSON Schema keyword {key!r}")
    if out.get("x-kubernetes-int-or-string"):
        # Structural rule: an int-or-string node has no type of its own.
        out.pop("type", None)
    elif "type" not in out and "x-kubernetes-preserve-unknown-fields" not in out:
        raise SchemaError(f"{ctx.path or '<root>'}: schema has no type")
    if out.get("type") == "object" and "properties" in out and "additionalProperties" in out:
        raise SchemaError(f"{ctx.path}: properties and additionalProperties together")
    return out


def _convert_tuple(node: Mapping[str, Any], ctx: _Context) -> dict[str, Any]:
    """A fixed-length tuple of one item type becomes an array with exact bounds."""
    items = [_convert(item, ctx.at(f"[{i}]")) for i, item in enumerate(node["prefixItems"])]
    if not items or any(item != items[0] for item in items[1:]):
        raise SchemaError(f"{ctx.path}: tuples of mixed item types have no structural form")
    return {"items": items[0], "minItems": len(items), "maxItems": len(items)}


def _convert_any_of(node: Mapping[str, Any], ctx: _Context) -> dict[str, Any]:
    """``anyOf: [X, {type: null}]`` (an optional field) becomes X with ``nullable: true``."""
    options = list(node["anyOf"])
    nulls = [option for option in options if option == {"type": "null"}]
    others = [option for option in options if option != {"type": "null"}]
    if len(others) != 1:
        raise SchemaError(f"{ctx.path}: anyOf of several non-null schemas is not structural")
    inner = _convert(others[0], ctx)
    outer = {key: value for key, value in node.items() if key != "anyOf"}
    for key in outer:
        if key not in _DROPPED and key not in ("description", "default"):
            raise SchemaError(f"{ctx.path}: unsupported keyword {key!r} beside anyOf")
    description = _join_descriptions(outer.get("description"), inner.get("description"))
    if description:
        inner["description"] = description
    if "default" in outer:
        inner[_DEFAULT] = copy.deepcopy(outer["default"])
    if nulls:
        inner["nullable"] = True
    return inner


def _convert_union(node: Mapping[str, Any], ctx: _Context) -> dict[str, Any]:
    """A discriminated union becomes one object: the tag is a required enum, and each field
    that only some variants have carries a CEL rule naming the tags it belongs to."""
    discriminator = node.get("discriminator")
    if not isinstance(discriminator, Mapping) or not isinstance(
        discriminator.get("propertyName"), str
    ):
        raise SchemaError(f"{ctx.path}: oneOf without a discriminator is not structural")
    tag: str = discriminator["propertyName"]
    variants: list[tuple[str, dict[str, Any]]] = []
    for option in _flat_options(node["oneOf"]):
        converted = _convert(option, ctx)
        tag_schema = converted.get("properties", {}).get(tag, {})
        values = tag_schema.get("enum")
        if converted.get("type") != "object" or not values or len(values) != 1:
            raise SchemaError(f"{ctx.path}: union variant without a single {tag!r} value")
        variants.append((str(values[0]), converted))
    tags = [name for name, _ in variants]
    members: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, variant in variants:
        for prop, schema in variant.get("properties", {}).items():
            if prop != tag:
                members.setdefault(prop, []).append((name, schema))
    properties = {
        prop: _merge_variant_field(found, ctx.at(prop)) for prop, found in members.items()
    }
    owners = {prop: [name for name, _ in found] for prop, found in members.items()}
    lines = [
        f"{name}: {variant['description']}"
        for name, variant in variants
        if variant.get("description")
    ]
    description = _join_descriptions(
        node.get("description"), f"One of, by {tag}: " + " | ".join(lines) if lines else None
    )
    merged: dict[str, Any] = {
        "type": "object",
        "properties": {
            tag: {
                "type": "string",
                "enum": tags,
                "description": f"Which kind of {ctx.path.rsplit('.', 1)[-1]} this is",
            },
            **properties,
        },
        "required": [tag],
        _TAG: tag,
        _VARIANTS: {prop: tuple(names) for prop, names in owners.items()},
    }
    if description:
        merged["description"] = description
    if "default" in node:
        merged[_DEFAULT] = copy.deepcopy(node["default"])
    rules = [
        {
            "rule": f"!has(self.{_cel_field(prop)}) || self.{_cel_field(tag)} in "
            + json.dumps(names),
            "message": f"{prop} applies only to {tag} {', '.join(names)}",
        }
        for prop, names in owners.items()
        if len(names) < len(tags)
    ]
    if rules:
        merged["x-kubernetes-validations"] = rules
    return merged


def _flat_options(options: list[Any]) -> Iterator[Mapping[str, Any]]:
    """Union members, with nested bare ``anyOf`` lists spread out (pydantic nests them when an
    optional field holds an annotated union), each reference once."""
    seen: set[str] = set()
    for option in options:
        if isinstance(option, Mapping) and set(option) == {"anyOf"}:
            yield from _flat_options(list(option["anyOf"]))
            continue
        marker = json.dumps(option, sort_keys=True)
        if marker not in seen:
            seen.add(marker)
            yield option


def _merge_variant_field(found: list[tuple[str, dict[str, Any]]], ctx: _Context) -> dict[str, Any]:
    """One field of several union variants: the variants must agree on its schema; they may
    differ in description and default, which are then said per variant."""
    bare = [
        {key: value for key, value in schema.items() if key not in ("description", _DEFAULT)}
        for _, schema in found
    ]
    if any(schema != bare[0] for schema in bare[1:]):
        raise SchemaError(f"{ctx.path}: union variants disagree on this field's schema")
    merged = dict(bare[0])
    descriptions = _grouped([(name, schema.get("description")) for name, schema in found])
    if len(descriptions) == 1 and descriptions[0][1] is not None:
        merged["description"] = descriptions[0][1]
    else:
        joined = _join_descriptions(
            *(f"({', '.join(names)}) {text}" for names, text in descriptions if text)
        )
        if joined:
            merged["description"] = joined
    defaults = _grouped([(name, schema.get(_DEFAULT)) for name, schema in found])
    if len(defaults) == 1:
        if defaults[0][1] is not None:
            merged[_DEFAULT] = defaults[0][1]
    elif any(value is not None for _, value in defaults):
        text = ", ".join(
            f"{_show(value)} ({', '.join(names)})" for names, value in defaults if value is not None
        )
        merged[_DEFAULT_TEXT] = text
        merged["description"] = _join_descriptions(merged.get("description"), f"default: {text}")
    return merged


def _grouped(pairs: list[tuple[str, Any]]) -> list[tuple[tuple[str, ...], Any]]:
    """(variant, value) pairs grouped by equal value, in first-seen order."""
    groups: list[tuple[list[str], Any]] = []
    for name, value in pairs:
        for names, seen in groups:
            if seen == value:
                names.append(name)
                break
        else:
            groups.append(([name], value))
    return [(tuple(names), value) for names, value in groups]


def _cel_field(name: str) -> str:
    """A property name as a CEL identifier, escaped the way Kubernetes does it."""
    if name in _CEL_RESERVED:
        return f"__{name}__"
    escaped = name.replace("__", "__underscores__")
    for char, word in ((".", "dot"), ("-", "dash"), ("/", "slash")):
        escaped = escaped.replace(char, f"__{word}__")
    return escaped


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


# --- intermediate tree -> structural schema -------------------------------------------------


def _structural(node: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    default = node.get(_DEFAULT)
    for key, value in node.items():
        if key in (_DEFAULT, _VARIANTS, _TAG, _DEFAULT_TEXT):
            continue
        if key == "properties":
            out[key] = {name: _structural(child) for name, child in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            out[key] = _structural(value)
        else:
            out[key] = copy.deepcopy(value)
    if default not in (None, [], {}) and not _in_description(out.get("description"), default):
        out["description"] = _join_descriptions(
            out.get("description"), f"default: {_show(default)}"
        )
    first = [key for key in ("type", "description") if key in out]
    return {key: out[key] for key in [*first, *(key for key in out if key not in first)]}


def _in_description(description: object, default: Any) -> bool:
    return isinstance(description, str) and f"default: {_show(default)}" in description


def _model_tree(model: type[BaseModel] = GPUPolicy) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    body = {key: value for key, value in raw.items() if key != "$defs"}
    return _convert(body, _Context(defs, ""))


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Any pydantic model as a structural OpenAPI schema; :class:`SchemaError` if it has none."""
    return _structural(_model_tree(model))


def openapi_schema() -> dict[str, Any]:
    """The structural ``openAPIV3Schema`` of the GPUPolicy CRD."""
    tree = _model_tree()
    spec = _structural(tree["properties"]["spec"])
    return {
        "type": "object",
        "description": tree.get("description", ""),
        "properties": {
            "apiVersion": {"type": "string", "description": "gpuwarden.io/v1alpha1"},
            "kind": {"type": "string", "description": "GPUPolicy"},
            # Structural rule: only metadata.name and generateName may be constrained.
            "metadata": {"type": "object"},
            "spec": spec,
        },
        "required": ["spec"],
    }


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) for GPUPolicy."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "gpuwarden"},
        },
        "spec": {
            "group": keys.API_GROUP,
            "scope": "Cluster",
            "names": {
                "plural": CRD_PLURAL,
                "singular": CRD_SINGULAR,
                "kind": keys.POLICY_KIND,
                "listKind": f"{keys.POLICY_KIND}List",
                "shortNames": list(CRD_SHORT_NAMES),
                "categories": ["gpuwarden"],
            },
            "versions": [
                {
                    "name": CRD_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "additionalPrinterColumns": [
                        {
                            "name": "Backend",
                            "type": "string",
                            "jsonPath": ".spec.backend.type",
                        },
                        {
                            "name": "Default profile",
                            "type": "string",
                            "jsonPath": ".spec.defaultProfile",
                        },
                        {
                            "name": "Age",
                            "type": "date",
                            "jsonPath": ".metadata.creationTimestamp",
                        },
                    ],
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML file the Helm chart ships (stable text, so a test can diff it)."""
    header = (
        "# GENERATED by `gpuwarden render --crd` from the pydantic model in\n"
        "# gpuwarden/policy/model.py. Do not edit: change the model and regenerate.\n"
    )
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)


# --- README field table -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    path: str
    type: str
    default: str
    description: str


def _type_of(node: Mapping[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        text = "quantity"
    elif "enum" in node:
        text = " \\| ".join(f"`{value}`" for value in node["enum"])
    elif node.get("type") == "array":
        text = f"list of {_type_of(node.get('items', {}))}"
    elif node.get("type") == "object" and "additionalProperties" in node:
        text = f"map of {_type_of(node['additionalProperties'])}"
    else:
        text = str(node.get("type", "any"))
        bounds = [node.get("minimum"), node.get("maximum")]
        if bounds != [None, None]:
            low = "" if bounds[0] is None else _show(bounds[0])
            high = "" if bounds[1] is None else _show(bounds[1])
            text += f" ({low}..{high})"
    return text


def _rows(node: Mapping[str, Any], path: str) -> Iterator[_Row]:
    variants: Mapping[str, tuple[str, ...]] = node.get(_VARIANTS, {})
    tag = node.get(_TAG)
    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.{name}"
        default = child.get(_DEFAULT)
        shown = "" if default in (None, [], {}) else f"`{_show(default)}`"
        description = str(child.get("description", ""))
        if _DEFAULT_TEXT in child:
            text = str(child[_DEFAULT_TEXT])
            shown = re.sub(r"(\S+) \(", r"`\1` (", text)
            description = description.replace(f"default: {text}", "").strip("; ")
        owners = variants.get(name)
        if tag and owners is not None and len(owners) < len(node["properties"][tag]["enum"]):
            prefix = f"({', '.join(owners)}) "
            description = " ".join(
                filter(None, (f"{tag} {', '.join(owners)} only.", description.removeprefix(prefix)))
            )
        yield _Row(
            path=child_path,
            type=_type_of(child) + (", required" if name in node.get("required", ()) else ""),
            default=shown,
            description=description.replace("|", "\\|").replace("\n", " "),
        )
        yield from _rows_below(child, child_path)


def _rows_below(node: Mapping[str, Any], path: str) -> Iterator[_Row]:
    if node.get("type") == "object" and "properties" in node:
        yield from _rows(node, path)
    elif node.get("type") == "array" and isinstance(node.get("items"), Mapping):
        yield from _rows_below(node["items"], f"{path}[]")
    elif node.get("type") == "object" and isinstance(node.get("additionalProperties"), Mapping):
        yield from _rows_below(node["additionalProperties"], f"{path}.<key>")


def policy_field_table() -> str:
    """Every GPUPolicy field as a Markdown table (path, type, default, description)."""
    spec = _model_tree()["properties"]["spec"]
    lines = [
        "| Field | Type | Default | Description |",
        "| --- | --- | --- | --- |",
    ]
    for row in _rows(spec, "spec"):
        lines.append(f"| `{row.path}` | {row.type} | {row.default} | {row.description} |")
    return "\n".join(lines) + "\n"
