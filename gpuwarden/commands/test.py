"""`gpuwarden test`: declarative policy test suites, in the spirit of `kyverno test`."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuwarden.commands._inputs import (
    InputError,
    load_cluster,
    namespace_name,
    read_documents,
    read_pods,
)
from gpuwarden.policy import PolicyError, load_paths
from gpuwarden.policy.spec.loader import (
    compose_documents,
    did_you_mean,
    field_names,
    format_loc,
    line_of,
)

HELP = "Run declarative policy test suites and print a pass/fail table"

# Printed by `gpuwarden test --help`; the README's "Test suites" section points here.
DESCRIPTION = """\
Run declarative policy test suites and print a pass/fail table (exit 1 if any case fails).

A suite file (kind: Test) names its policies, namespaces and pods (paths relative to the suite),
then lists results: each gives a resource and what must come out of it.

    apiVersion: gpuwarden.io/v1alpha1
    kind: Test
    metadata: {name: default-policies}
    policies: [../default.yaml]      # or give -p PATH to test other policies
    namespaces: [../../examples/namespaces.yaml]
    results:
      - name: notebooks share a GPU
        resource: ../../examples/notebook.yaml   # a Pod or an AdmissionReview
        namespace: tenant-a        # optional: overrides the pod's own
        result: allowed            # or denied
        message: "substring of the denial"
        profile: light-training    # null: the pod gets no profile
        fields:                    # path -> expected value; null: absent
          spec.schedulerName: volcano
          spec.containers[alice-jupyter].resources.limits[volcano.sh/vgpu-number]: "1"
        warnings: ["substring"]    # each must be in some warning
        pod: expected-pod.yaml     # the whole expected pod

In a field path, [name] selects a list item by its name, [0] by its index, and [a.b/c] a key
with dots or slashes. Each result needs resource and at least one of result, message, profile,
fields, warnings or pod (result defaults to allowed once another is given); a result that
states nothing fails. An unknown key fails the suite, naming the file, the line and the key.
"""

_STEP = re.compile(r"\.?([^.\[\]]+)|\[([^\]]*)\]")
_EXPECTATIONS = ("result", "message", "profile", "fields", "warnings", "pod")


@dataclass(frozen=True)
class Row:
    suite: str
    name: str
    passed: bool
    detail: str


# --- the suite format ------------------------------------------------------------------------


class _SuiteModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)


def _as_list(value: Any) -> Any:
    """A single string where a list is expected: a list of one."""
    return [value] if isinstance(value, str) else value


class SuiteMetadata(_SuiteModel):
    name: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class Case(_SuiteModel):
    """One entry of a suite's results: a resource and what must come out of it."""

    name: str | None = None
    resource: str
    namespace: str | None = None
    result: Literal["allowed", "denied"] | None = None
    message: str | None = None
    profile: str | None = None
    fields: dict[str, Any] | None = None
    warnings: list[str] | None = None
    pod: str | None = None

    @field_validator("fields", mode="before")
    @classmethod
    def _fields_map(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, Mapping):
            raise ValueError("fields must be a map of field path to expected value")
        return value

    @field_validator("pod", mode="before")
    @classmethod
    def _pod_file(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, str):
            raise ValueError("pod must name a file holding the expected pod")
        return value

    @field_validator("warnings", mode="before")
    @classmethod
    def _warning_list(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        try:
            return namespace_name(value, "namespace", files="namespaces: [FILE] in the suite")
        except InputError as exc:
            raise ValueError(str(exc)) from None

    @property
    def label(self) -> str:
        return self.name or self.resource

    @property
    def expectations(self) -> list[str]:
        """The expectations the case states (``profile: null`` is one)."""
        return [key for key in _EXPECTATIONS if key in self.model_fields_set]


class Suite(_SuiteModel):
    """A kind: Test document."""

    api_version: Literal["gpuwarden.io/v1alpha1"] = Field(
        default="gpuwarden.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["Test"]
    metadata: SuiteMetadata = Field(default_factory=SuiteMetadata)
    policies: list[str] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)
    results: list[Case]

    @field_validator("policies", "namespaces", mode="before")
    @classmethod
    def _paths(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("results", mode="before")
    @classmethod
    def _results_list(cls, value: Any) -> Any:
        if not isinstance(value, list):
            raise ValueError("results must be a list")
        return value


def suite_problems(exc: ValidationError, node: yaml.Node | None) -> list[str]:
    """Each problem of a suite document: ``line N: path: message``, with the key meant where an
    unknown key is close to one."""
    problems = []
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        # "a valid dictionary or instance of Case": the class is no word of the format.
        message = re.sub(r" or instance of \w+", "", error["msg"].removeprefix("Value error, "))
        if error["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
            message = "unknown key" + did_you_mean(loc[-1], field_names(Suite, loc[:-1]))
        where = f"line {line_of(node, loc)}: " if node is not None else ""
        path = format_loc(loc)
        problems.append(f"{where}{path + ': ' if path else ''}{message}")
    return problems


# --- the command -------------------------------------------------------------------------------


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", metavar="SUITE", help="suite file or directory of suites (*.yaml)"
    )
    parser.add_argument(
        "--policies",
        "-p",
        action="append",
        default=[],
        metavar="PATH",
        help="test this policy file or directory instead of the policies each suite names; "
        "repeatable",
    )


def lookup(obj: Any, path: str) -> tuple[bool, Any]:
    """Follow ``a.b[0].c[key.with.dots]``; on lists, ``[name]`` picks the item with that name."""
    node = obj
    for name, bracket in _STEP.findall(path):
        key = name or bracket
        if isinstance(node, list):
            if key.isdigit() and int(key) < len(node):
                node = node[int(key)]
                continue
            found = [i for i in node if isinstance(i, Mapping) and i.get("name") == key]
            if not found:
                return False, None
            node = found[0]
        elif isinstance(node, Mapping) and key in node:
            node = node[key]
        else:
            return False, None
    return True, node


def _suite_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*.y*ml") if p.is_file())
        else:
            files.append(path)
    return files


@dataclass(frozen=True)
class _Context:
    suite: str
    base: Path
    policies: Any
    cluster: Any


def _check(case: Case, ctx: _Context) -> Row:
    inputs = read_pods([str(ctx.base / case.resource)], case.namespace)
    if not case.expectations:
        return Row(
            ctx.suite,
            case.label,
            False,
            "states no expectation: give result, message, profile, fields, warnings or pod",
        )
    failures: list[str] = []
    for item in inputs:
        outcome = item.admit(ctx.policies, ctx.cluster)
        verdict = "allowed" if outcome.allowed else "denied"
        expected = case.result or "allowed"
        if verdict != expected:
            why = f": {outcome.validation.message}" if not outcome.allowed else ""
            failures.append(f"expected {expected}, got {verdict}{why}")
        if case.message and case.message not in outcome.validation.message:
            failures.append(
                f"denial message lacks {case.message!r}: {outcome.validation.message!r}"
            )
        if "profile" in case.model_fields_set and outcome.mutation.profile != case.profile:
            failures.append(f"expected profile {case.profile}, got {outcome.mutation.profile}")
        for path, wanted in (case.fields or {}).items():
            found, actual = lookup(outcome.pod, path)
            if wanted is None and not found:
                continue
            if not found:
                failures.append(f"{path} is missing")
            elif actual != wanted and str(actual) != str(wanted):
                failures.append(f"{path} is {actual!r}, expected {wanted!r}")
        for text in case.warnings or []:
            if not any(text in line for line in outcome.warnings):
                failures.append(f"no warning contains {text!r}")
        if case.pod is not None:
            docs = read_documents(str(ctx.base / case.pod))
            if not docs or docs[0] != outcome.pod:
                failures.append(f"the mutated pod differs from {case.pod}")
    return Row(ctx.suite, case.label, not failures, "; ".join(failures) or "ok")


def _read_suites(file: Path) -> list[tuple[Any, yaml.Node | None]]:
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{file}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{file}: cannot read: {exc}") from None
    try:
        return compose_documents(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise InputError(f"{file}: invalid YAML: {where}{getattr(exc, 'problem', exc)}") from None


def _run_suite(file: Path, policy_paths: list[str]) -> list[Row]:
    rows: list[Row] = []
    for doc, node in _read_suites(file):
        if not isinstance(doc, Mapping) or doc.get("kind") != "Test":
            continue
        try:
            suite = Suite.model_validate(doc)
        except ValidationError as exc:
            rows += [Row(str(file), "read suite", False, p) for p in suite_problems(exc, node)]
            continue
        name = suite.metadata.name or file.name
        base = file.parent
        if policy_paths:
            paths = [Path(p) for p in policy_paths]
        elif suite.policies:
            paths = [base / p for p in suite.policies]
        else:
            rows.append(
                Row(name, "load policies", False, "the suite names no policies; give -p PATH")
            )
            continue
        try:
            policies = load_paths(paths)
        except PolicyError as exc:
            rows.append(Row(name, "load policies", False, str(exc)))
            continue
        try:
            cluster = load_cluster([str(base / f) for f in suite.namespaces])
        except InputError as exc:
            rows.append(Row(name, "load namespaces", False, str(exc)))
            continue
        ctx = _Context(name, base, policies, cluster)
        for case in suite.results:
            try:
                rows.append(_check(case, ctx))
            except InputError as exc:
                rows.append(Row(name, case.label, False, str(exc)))
    return rows


def run(args: argparse.Namespace) -> int:
    rows: list[Row] = []
    files = _suite_files(args.paths)
    if not files:
        print(f"error: no test suites found in {', '.join(args.paths)}")
        return 2
    for file in files:
        try:
            rows += _run_suite(file, args.policies)
        except InputError as exc:
            rows.append(Row(file.name, "read suite", False, str(exc)))
    if not rows:
        print("error: the suites hold no results (kind: Test with results)")
        return 2
    width = max(len(r.suite) for r in rows)
    name_width = max(len(r.name) for r in rows)
    print(f"{'#':>3}  {'SUITE':<{width}}  {'TEST':<{name_width}}  RESULT  DETAIL")
    for number, row in enumerate(rows, start=1):
        status = "pass" if row.passed else "FAIL"
        print(
            f"{number:>3}  {row.suite:<{width}}  {row.name:<{name_width}}  {status:<6}  {row.detail}"
        )
    failed = sum(not r.passed for r in rows)
    print(f"\n{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0
