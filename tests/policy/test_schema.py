"""The GPUPolicy CRD schema generated from the pydantic model: structural, and in agreement
with the loader on what a policy may say."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from gpuwarden.policy import PolicyError, load_texts
from gpuwarden.policy.spec.model import GPUPolicy, PolicySpec, Profile, Tenant
from gpuwarden.policy.spec.schema import (
    CRD_NAME,
    SchemaError,
    _cel_field,
    crd_manifest,
    openapi_schema,
    policy_field_table,
    structural_schema,
)

REPO = Path(__file__).resolve().parents[2]
# JSON Schema keywords a structural schema may not use (or Kubernetes does not know).
FORBIDDEN = {
    "$ref",
    "$defs",
    "const",
    "discriminator",
    "title",
    "oneOf",
    "anyOf",
    "allOf",
    "not",
    "prefixItems",
    "default",
}


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path or "<root>", node
    for name, child in node.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}.*")


def test_schema_is_structural() -> None:
    schema = openapi_schema()
    for path, node in _nodes(schema):
        assert not FORBIDDEN & set(node), f"{path}: {FORBIDDEN & set(node)}"
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
        else:
            assert node.get("type") in {
                "object",
                "array",
                "string",
                "integer",
                "number",
                "boolean",
            }, path
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("additionalProperties") is not False, path
    assert schema["properties"]["metadata"] == {"type": "object"}


def test_every_model_field_is_in_the_schema_and_the_field_table() -> None:
    table = policy_field_table()
    spec = openapi_schema()["properties"]["spec"]

    def aliases(model: type[BaseModel]) -> set[str]:
        return {field.alias or name for name, field in model.model_fields.items()}

    assert set(spec["properties"]) == aliases(PolicySpec)
    assert set(spec["properties"]["profiles"]["items"]["properties"]) == aliases(Profile)
    assert set(spec["properties"]["tenants"]["items"]["properties"]) == aliases(Tenant)
    for name in aliases(Profile):
        assert f"| `spec.profiles[].{name}` |" in table
    for name in aliases(Tenant):
        assert f"| `spec.tenants[].{name}` |" in table
    assert "| `spec.workloads[].match.taskNames` | list of string |  | kind kfp-step only." in table
    assert "| `spec.profiles[].gpus` | integer (0..64) |  | GPUs per container" in table


def test_descriptions_survive_and_defaults_are_described() -> None:
    profile = openapi_schema()["properties"]["spec"]["properties"]["profiles"]["items"]
    overcommit = profile["properties"]["overcommitRatio"]
    assert overcommit["type"] == "number" and overcommit["nullable"] is True
    assert overcommit["minimum"] == 1.0 and overcommit["maximum"] == 16.0
    assert "the cap stays maxMemory" in overcommit["description"]
    assert "default: 1.0" in overcommit["description"]
    assert profile["properties"]["maxMemory"]["x-kubernetes-int-or-string"] is True


def test_tagged_unions_become_one_object_with_cel_rules() -> None:
    backend = openapi_schema()["properties"]["spec"]["properties"]["backend"]
    assert backend["required"] == ["type"]
    assert backend["properties"]["type"]["enum"] == ["volcano", "hami", "nvidia", "native", "dra"]
    rules = {rule["rule"] for rule in backend["x-kubernetes-validations"]}
    assert '!has(self.queue) || self.type in ["volcano"]' in rules
    # Every backend names its scheduler: a field all variants share needs no rule.
    assert not any("schedulerName" in rule for rule in rules)
    # A field every variant has needs no rule.
    assert not any("foreignScheduler" in rule for rule in rules)


def test_cel_names_are_escaped_as_kubernetes_does() -> None:
    assert _cel_field("namespace") == "__namespace__"
    assert _cel_field("gpu-count") == "gpu__dash__count"
    assert _cel_field("a.b/c") == "a__dot__b__slash__c"
    assert _cel_field("x__y") == "x__underscores__y"


class _Node(BaseModel):
    children: list[_Node] = []


class _Untagged(BaseModel):
    value: int | str


class _Pair(BaseModel):
    pair: tuple[int, str]


class _Same(BaseModel):
    pair: tuple[int, int]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (_Node, "recursive model"),
        (_Untagged, "anyOf of several non-null schemas"),
        (_Pair, "tuples of mixed item types"),
    ],
)
def test_constructs_without_a_structural_form_are_refused(
    model: type[BaseModel], message: str
) -> None:
    with pytest.raises(SchemaError, match=message):
        structural_schema(model)


def test_fixed_tuples_of_one_type_become_bounded_arrays() -> None:
    pair = structural_schema(_Same)["properties"]["pair"]
    assert pair == {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}


def _as_json_schema(node: Any) -> Any:
    """The OpenAPI dialect as plain JSON Schema, so jsonschema can check documents offline."""
    if isinstance(node, list):
        return [_as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _as_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if "properties" in node:
        out["properties"] = {k: _as_json_schema(v) for k, v in node["properties"].items()}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if out.pop("nullable", False):
        return {"anyOf": [out, {"type": "null"}]}
    return out


def _schema_errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(_as_json_schema(copy.deepcopy(openapi_schema())))
    return [error.message for error in validator.iter_errors(doc)]


def _loader_errors(doc: dict[str, Any]) -> list[str]:
    try:
        load_texts([("doc.yaml", yaml.safe_dump(doc))])
    except PolicyError as exc:
        return [str(issue) for issue in exc.issues]
    return []


def _example_policies() -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all((REPO / "policies" / "default.yaml").read_text()))
    for path in sorted((REPO / "tests" / "chart" / "values").glob("*.yaml")):
        for text in (yaml.safe_load(path.read_text()) or {}).get("policies", {}).values():
            doc = yaml.safe_load(text) if isinstance(text, str) else text
            if doc.get("kind") == "GPUPolicy":
                docs.append(doc)
    return docs


def test_valid_policies_pass_both_the_loader_and_the_schema() -> None:
    docs = _example_policies()
    assert len(docs) >= 5
    for doc in docs:
        GPUPolicy.model_validate(doc)  # per document: cross-document references aside
        assert _schema_errors(doc) == []


BASE = {"apiVersion": "gpuwarden.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "p"}}


@pytest.mark.parametrize(
    "spec",
    [
        {"profiles": [{"name": "a", "gpuShare": False, "gpus": 99}]},
        {"profiles": [{"name": "a", "maxMemory": "8Gi", "threadPercentage": 0}]},
        {"profiles": [{"name": "a", "gpuShare": "sometimes"}]},
        {"backend": {"type": "slurm"}},
        {"backend": {"queue": "q"}},
        {"workloads": [{"name": "r", "match": {"kind": "pods"}, "skip": True}]},
        {"tenants": [{"name": "t", "namespaces": "team-a"}]},
        {
            "tenants": [
                {
                    "name": "t",
                    "namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "Maybe"}]},
                }
            ]
        },
        {"profiles": [{"name": "a", "gpuShare": False, "tolerations": "all"}]},
    ],
    ids=[
        "gpus-range",
        "threads-range",
        "bool-type",
        "backend-tag",
        "backend-no-tag",
        "match-tag",
        "list-type",
        "operator-enum",
        "tolerations-type",
    ],
)
def test_the_schema_refuses_what_the_loader_refuses(spec: dict[str, Any]) -> None:
    doc = {**BASE, "spec": spec}
    assert _loader_errors(doc), "the loader accepted it"
    assert _schema_errors(doc), "the CRD schema accepted it"


def test_crd_manifest_names() -> None:
    crd = crd_manifest()
    assert crd["metadata"]["name"] == CRD_NAME == "gpupolicies.gpuwarden.io"
    assert crd["spec"]["names"]["kind"] == "GPUPolicy"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]


def test_a_field_one_variant_requires_gets_a_rule_under_its_tag() -> None:
    backend = openapi_schema()["properties"]["spec"]["properties"]["backend"]
    rules = {rule["rule"]: rule["message"] for rule in backend["x-kubernetes-validations"]}
    assert rules['self.type != "dra" || has(self.deviceClassName)'] == (
        "type dra needs deviceClassName"
    )
    # No other variant requires a field beside its tag.
    assert sum("needs" in message for message in rules.values()) == 1
