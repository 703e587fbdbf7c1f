"""The GPUPolicy CRD and the field table of docs/reference.md, generated from the pydantic model.

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
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from gpuwarden.policy.pod import keys
from gpuwarden.policy.spec.model import GPUPolicy

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
    # A field one variant requires: the merged object cannot list it as required, so a rule
    # asks for it under that variant's tag.
    rules += [
        {
            "rule": f"self.{_cel_field(tag)} != {json.dumps(name)} || has(self.{_cel_field(prop)})",
            "message": f"{tag} {name} needs {prop}",
        }
        for name, variant in variants
        for prop in variant.get("required", ())
        if prop != tag
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
            "status": status_schema(),
        },
        "required": ["spec"],
    }


def status_schema() -> dict[str, Any]:
    """The status the webhook writes (gpuwarden.kube.gpupolicies): metav1.Condition's schema."""
    generation = {"type": "integer", "format": "int64", "minimum": 0}
    return {
        "type": "object",
        "description": "Written by the gpuwarden webhook: whether this generation is in force.",
        "properties": {
            "observedGeneration": {
                **generation,
                "description": "The generation the conditions describe.",
            },
            "conditions": {
                "type": "array",
                "description": "Ready: True (reason Valid) when this generation is in force; "
                "False (reason Invalid) when it cannot be, with the loader's message naming the "
                "field. An invalid generation never replaces the last valid one in a running "
                "webhook.",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": {
                    "type": "object",
                    "required": ["type", "status", "lastTransitionTime", "reason", "message"],
                    "properties": {
                        "type": {"type": "string", "maxLength": 316},
                        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                        "observedGeneration": generation,
                        "lastTransitionTime": {"type": "string", "format": "date-time"},
                        "reason": {"type": "string", "minLength": 1, "maxLength": 1024},
                        "message": {"type": "string", "maxLength": 32768},
                    },
                },
            },
        },
    }


def _ready(field: str) -> str:
    return f'.status.conditions[?(@.type=="Ready")].{field}'


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
                    # spec and status are written apart: the webhook writes only status.
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {
                            "name": "Ready",
                            "type": "string",
                            "jsonPath": _ready("status"),
                        },
                        {
                            "name": "Reason",
                            "type": "string",
                            "jsonPath": _ready("reason"),
                        },
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
                        {
                            "name": "Message",
                            "type": "string",
                            "priority": 1,  # -o wide
                            "jsonPath": _ready("message"),
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
        "# gpuwarden/policy/spec/model.py. Do not edit: change the model and regenerate.\n"
    )
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)


# --- field table (docs/reference.md) ----------------------------------------------------


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


# --- Portable JSON Schema: Helm's values.schema.json and the chart's render-time check --------

# The keywords the portable schema uses, besides annotations (description, default). The chart's
# template "gpuwarden.schemaProblems" (charts/gpuwarden/templates/_policy-check.tpl) implements
# exactly these, so that a policy given to the chart as YAML text, which Helm's own schema
# validation cannot see into, is checked against the same schema. Two restrictions keep that
# template small: ``anyOf`` is only ever ``[X, {"type": "null"}]``, and a tagged union carries a
# ``discriminator`` (the template dispatches on its mapping; standard validators read the
# ``allOf`` of if/then beside it, which the template does not).
PORTABLE_KEYWORDS = frozenset(
    {
        "$ref",
        "type",
        "const",
        "enum",
        "minimum",
        "maximum",
        "pattern",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "anyOf",
        "discriminator",
    }
)
_ANNOTATIONS = frozenset({"description", "default"})
POLICY_DOCUMENT = "PolicyDocument"  # the $defs entry of one policy document (either form)
_GENERATED = (
    "GENERATED by hack/update-docs.py from the pydantic model in gpuwarden/policy/spec/model.py. "
    "Do not edit: change the model and run `make docs`."
)


@dataclass(frozen=True)
class _Portable:
    defs: Mapping[str, Any]  # pydantic's $defs
    models: Mapping[str, type[BaseModel]]  # the model class behind each of them


def _model_classes(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _model_classes(arg)


def _models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model reachable from root's fields, by class name (pydantic's $defs key)."""
    found: dict[str, type[BaseModel]] = {}
    todo = [root]
    while todo:
        model = todo.pop()
        if model.__name__ not in found:
            found[model.__name__] = model
            for field in model.model_fields.values():
                todo.extend(_model_classes(field.annotation))
    return found


def _takes_shorthand(model: type[BaseModel], field: str, tag: str) -> bool:
    """Whether the model takes a union field given as its tag alone (``backend: hami``): a
    before-validator that JSON Schema does not show."""
    try:
        model.model_validate({field: tag})
    except ValidationError as exc:
        return not any(error["loc"][:1] == (field,) for error in exc.errors())
    return True


def _portable(node: Mapping[str, Any], ctx: _Portable, path: str) -> dict[str, Any]:
    """One pydantic JSON Schema node in the portable subset; :class:`SchemaError` otherwise."""
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or ref.removeprefix("#/$defs/") not in ctx.defs:
            raise SchemaError(f"{path}: unsupported reference {ref!r}")
        extra = set(node) - {"$ref", "title", *_ANNOTATIONS}
        if extra:
            raise SchemaError(f"{path}: keywords {sorted(extra)} beside $ref")
        return {"$ref": ref, **{k: node[k] for k in ("description", "default") if k in node}}
    if "anyOf" in node:
        return _portable_optional(node, ctx, path)
    if "oneOf" in node:
        return _portable_union(node, ctx, path)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "x-kubernetes-int-or-string"):
            continue
        if key in _ANNOTATIONS or key in PORTABLE_KEYWORDS - {"properties", "items"}:
            if key == "additionalProperties" and not isinstance(value, bool):
                value = _portable(value, ctx, f"{path}.*")
            out[key] = copy.deepcopy(value)
        elif key == "properties":
            out[key] = {
                name: _portable(child, ctx, f"{path}.{name}") for name, child in value.items()
            }
        elif key == "items":
            out[key] = _portable(value, ctx, f"{path}[]")
        else:
            raise SchemaError(f"{path or '<root>'}: keyword {key!r} has no portable form")
    if node.get("x-kubernetes-int-or-string"):
        # A quantity: YAML gives 8Gi as a string and 8 as a number; the loader takes both.
        out["type"] = ["string", "number"]
    if "type" not in out:
        raise SchemaError(f"{path or '<root>'}: schema has no type")
    return out


def _portable_optional(node: Mapping[str, Any], ctx: _Portable, path: str) -> dict[str, Any]:
    """``anyOf: [X, {type: null}]``: a plain X takes ``null`` into its type list; an enum or a
    union stays a two-option anyOf (null would have to join the enum, or fail the union)."""
    options = list(node["anyOf"])
    others = [option for option in options if option != {"type": "null"}]
    if len(others) != 1 or len(options) != 2:
        raise SchemaError(f"{path}: anyOf other than [X, null] has no portable form")
    extra = set(node) - {"anyOf", "title", *_ANNOTATIONS}
    if extra:
        raise SchemaError(f"{path}: keywords {sorted(extra)} beside anyOf")
    inner = _portable(others[0], ctx, path)
    annotations = {k: node[k] for k in ("description", "default") if k in node}
    if "type" in inner and not {"enum", "const", "discriminator"} & set(inner):
        types = [inner["type"]] if isinstance(inner["type"], str) else list(inner["type"])
        return {**inner, "type": [*types, "null"], **annotations}
    return {"anyOf": [inner, {"type": "null"}], **annotations}


def _portable_union(node: Mapping[str, Any], ctx: _Portable, path: str) -> dict[str, Any]:
    """A discriminated union: the tag is a required enum and each tag value selects its model;
    where the loader takes the tag alone as a string, so does the schema."""
    discriminator = node.get("discriminator")
    if not isinstance(discriminator, Mapping) or not isinstance(
        discriminator.get("propertyName"), str
    ):
        raise SchemaError(f"{path}: oneOf without a discriminator has no portable form")
    tag: str = discriminator["propertyName"]
    mapping: dict[str, str] = {}
    for option in _flat_options(node["oneOf"]):
        ref = option.get("$ref")
        name = ref.removeprefix("#/$defs/") if isinstance(ref, str) else ""
        if name not in ctx.defs or set(option) != {"$ref"}:
            raise SchemaError(f"{path}: union member {option!r} is not a model reference")
        value = ctx.defs[name].get("properties", {}).get(tag, {}).get("const")
        if not isinstance(value, str):
            raise SchemaError(f"{path}: union member {name} has no single {tag!r} value")
        mapping[value] = f"#/$defs/{name}"
    owner, _, field = path.partition(".")
    model = ctx.models.get(owner)
    shorthand = model is not None and _takes_shorthand(model, field, next(iter(mapping)))
    tags = list(mapping)
    branches: list[dict[str, Any]] = [{"if": {"type": "string"}, "then": {"enum": tags}}]
    branches = branches if shorthand else []
    branches += [
        {
            "if": {"type": "object", "required": [tag], "properties": {tag: {"const": value}}},
            "then": {"$ref": ref},
        }
        for value, ref in mapping.items()
    ]
    out: dict[str, Any] = {
        "type": ["object", "string"] if shorthand else "object",
        "required": [tag],
        "properties": {tag: {"type": "string", "enum": tags}},
        "discriminator": {"propertyName": tag, "mapping": mapping},
        "allOf": branches,
    }
    out.update({k: node[k] for k in ("description", "default") if k in node})
    return out


def _portable_defs() -> dict[str, Any]:
    raw = GPUPolicy.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, Any] = raw.get("$defs", {})
    body = {key: value for key, value in raw.items() if key != "$defs"}
    ctx = _Portable(defs, _models(GPUPolicy))
    clash = {keys.POLICY_KIND, POLICY_DOCUMENT} & set(defs)
    if clash:
        raise SchemaError(f"model names {sorted(clash)} clash with the schema's own definitions")
    out = {name: _portable(node, ctx, name) for name, node in sorted(defs.items())}
    out[keys.POLICY_KIND] = _portable(body, ctx, keys.POLICY_KIND)
    for name, node in out.items():
        _check_portable(node, name)
    # As the loader reads a document: with kind or apiVersion, a GPUPolicy (or a ConfigMap
    # holding policy files, which is loaded and checked at start); without either, a bare spec.
    out[POLICY_DOCUMENT] = {
        "description": (
            "One policy document: a GPUPolicy (apiVersion gpuwarden.io/v1alpha1, kind "
            "GPUPolicy), or a bare spec (backend, profiles, workloads, tenants, defaultProfile, "
            "mps) with neither apiVersion nor kind"
        ),
        "type": "object",
        "if": {"anyOf": [{"required": ["kind"]}, {"required": ["apiVersion"]}]},
        "then": {
            "if": {"required": ["kind"], "properties": {"kind": {"const": "ConfigMap"}}},
            "else": {"$ref": f"#/$defs/{keys.POLICY_KIND}"},
        },
        "else": {"$ref": "#/$defs/PolicySpec"},
    }
    return out


def _check_portable(node: Any, path: str) -> None:
    """A definition uses only PORTABLE_KEYWORDS (and annotations), all the way down."""
    if not isinstance(node, Mapping):
        raise SchemaError(f"{path}: a schema must be an object")
    unknown = set(node) - PORTABLE_KEYWORDS - _ANNOTATIONS - {"allOf"}
    if unknown:
        raise SchemaError(f"{path}: the chart's template does not implement {sorted(unknown)}")
    if "allOf" in node and "discriminator" not in node:
        raise SchemaError(f"{path}: allOf only beside a discriminator")
    for name, child in node.get("properties", {}).items():
        _check_portable(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), Mapping):
            _check_portable(node[key], f"{path}.{key}")
    for child in node.get("anyOf", ()):
        _check_portable(child, f"{path}.anyOf")


def policy_document_schema() -> dict[str, Any]:
    """One policy document (a GPUPolicy, or a bare spec) as JSON Schema 2020-12, in the subset
    that standard validators and the chart's template both check: the chart's
    files/gpupolicy.schema.json. :class:`SchemaError` if the model needs more."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": _GENERATED,
        "title": "GPUPolicy document",
        "$ref": f"#/$defs/{POLICY_DOCUMENT}",
        "$defs": _portable_defs(),
    }


def values_schema() -> dict[str, Any]:
    """The chart's values.schema.json: ``policies`` checked against the model. Only that key is
    constrained; the chart's other values are left to its templates."""
    document = policy_document_schema()
    return {
        "$schema": document["$schema"],
        "$comment": _GENERATED,
        "type": "object",
        "properties": {
            "policies": {
                "description": (
                    "Policy files by file name: each value is YAML text (checked by the chart's "
                    "templates against files/gpupolicy.schema.json) or one policy document as "
                    "a mapping (checked here)"
                ),
                "type": ["object", "null"],
                "additionalProperties": {
                    "if": {"type": "string"},
                    "else": {"$ref": f"#/$defs/{POLICY_DOCUMENT}"},
                },
            }
        },
        "$defs": document["$defs"],
    }


def schema_json(schema: Mapping[str, Any]) -> str:
    """A schema as the stable JSON text the chart ships."""
    return json.dumps(schema, indent=2) + "\n"
