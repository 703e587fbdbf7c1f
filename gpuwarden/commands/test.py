"""`gpuwarden test`: declarative policy test suites, in the spirit of `kyverno test`.

A suite file (kind: Test) names its policies, namespaces and pods (paths relative to the suite),
then lists results: each gives a resource and what must come out of it.

    apiVersion: gpuwarden.io/v1alpha1
    kind: Test
    metadata: {name: default-policies}
    policies: [../default.yaml]
    namespaces: ../../examples/namespaces.yaml
    results:
      - name: notebooks share a GPU
        resource: ../../examples/notebook.yaml
        result: allowed            # or denied
        message: "substring of the denial"
        profile: light-training
        fields:                    # path -> expected value; [name] selects a list item by name
          spec.schedulerName: volcano
          spec.containers[alice-jupyter].resources.limits[volcano.sh/vgpu-number]: "1"
        warnings: ["substring"]
        pod: expected-pod.yaml     # the whole expected pod
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.commands._inputs import (
    InputError,
    load_cluster,
    read_documents,
    read_pods,
)
from gpuwarden.policy import PolicyError, admit, load_paths

HELP = "Run declarative policy test suites and print a pass/fail table"
_STEP = re.compile(r"\.?([^.\[\]]+)|\[([^\]]*)\]")


@dataclass(frozen=True)
class Row:
    suite: str
    name: str
    passed: bool
    detail: str


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Suite files or directories")


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


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _check(result: Mapping[str, Any], base: Path, suite: str, ctx: dict[str, Any]) -> Row:
    name = str(result.get("name") or result.get("resource") or "?")
    resource = result.get("resource")
    if not isinstance(resource, str):
        return Row(suite, name, False, "result has no resource")
    inputs = read_pods([str(base / resource)], result.get("namespace"))
    failures: list[str] = []
    for item in inputs:
        outcome = admit(item.request, ctx["policies"], ctx["cluster"])
        verdict = "allowed" if outcome.allowed else "denied"
        expected = str(result.get("result", "allowed"))
        if expected not in ("allowed", "denied"):
            failures.append(f"result must be allowed or denied, not {expected!r}")
        elif verdict != expected:
            why = f": {outcome.validation.message}" if not outcome.allowed else ""
            failures.append(f"expected {expected}, got {verdict}{why}")
        message = result.get("message")
        if message and str(message) not in outcome.validation.message:
            failures.append(f"denial message lacks {message!r}: {outcome.validation.message!r}")
        profile = result.get("profile")
        if profile is not None and outcome.mutation.profile != profile:
            failures.append(f"expected profile {profile}, got {outcome.mutation.profile}")
        fields = result.get("fields") or {}
        if not isinstance(fields, Mapping):
            failures.append("fields must be a map of field path to expected value")
            fields = {}
        for path, wanted in fields.items():
            found, actual = lookup(outcome.pod, str(path))
            if wanted is None and not found:
                continue
            if not found:
                failures.append(f"{path} is missing")
            elif actual != wanted and str(actual) != str(wanted):
                failures.append(f"{path} is {actual!r}, expected {wanted!r}")
        for text in _as_list(result.get("warnings")):
            if not any(text in line for line in outcome.warnings):
                failures.append(f"no warning contains {text!r}")
        expected_pod = result.get("pod")
        if expected_pod is not None and not isinstance(expected_pod, str):
            failures.append("pod must name a file holding the expected pod")
        elif isinstance(expected_pod, str):
            docs = read_documents(str(base / expected_pod))
            if not docs or docs[0] != outcome.pod:
                failures.append(f"the mutated pod differs from {expected_pod}")
    return Row(suite, name, not failures, "; ".join(failures) or "ok")


def _run_suite(file: Path) -> list[Row]:
    suite = file.name
    docs = read_documents(str(file))
    rows: list[Row] = []
    for doc in docs:
        if not isinstance(doc, Mapping) or doc.get("kind") != "Test":
            continue
        meta = doc.get("metadata")
        suite = str((meta.get("name") if isinstance(meta, Mapping) else None) or file.name)
        base = file.parent
        try:
            policies = load_paths([base / p for p in _as_list(doc.get("policies"))])
        except PolicyError as exc:
            return [Row(suite, "load policies", False, str(exc))]
        try:
            cluster = load_cluster([str(base / f) for f in _as_list(doc.get("namespaces"))])
        except InputError as exc:
            return [Row(suite, "load namespaces", False, str(exc))]
        ctx = {"policies": policies, "cluster": cluster}
        results = doc.get("results") or []
        if not isinstance(results, list):
            rows.append(Row(suite, "read suite", False, "results must be a list"))
            continue
        for result in results:
            if not isinstance(result, Mapping):
                rows.append(Row(suite, "?", False, "each result must be a mapping"))
                continue
            try:
                rows.append(_check(result, base, suite, ctx))
            except InputError as exc:
                rows.append(Row(suite, str(result.get("name", "?")), False, str(exc)))
    return rows


def run(args: argparse.Namespace) -> int:
    rows: list[Row] = []
    files = _suite_files(args.paths)
    if not files:
        print(f"error: no test suites found in {', '.join(args.paths)}")
        return 2
    for file in files:
        try:
            rows += _run_suite(file)
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
