"""Reading the CLI's inputs: policies, Namespace files, and Pods or AdmissionReviews."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml

from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    PolicyError,
    PolicySet,
    load_paths,
    manifests,
)
from gpuwarden.policy.decision import Operation

_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class InputError(Exception):
    """Bad input: the message names the file and what is wrong."""


@dataclass(frozen=True)
class PodInput:
    source: str
    request: AdmissionRequest
    from_review: bool

    @property
    def label(self) -> str:
        meta = self.request.pod.get("metadata")
        name = "<unnamed>"
        if isinstance(meta, Mapping):
            name = str(meta.get("name") or meta.get("generateName") or name)
        return f"{self.request.namespace}/{name}"


def eprint(*parts: object) -> None:
    print(*parts, file=sys.stderr)


def load_policies(paths: Sequence[str]) -> PolicySet | None:
    """The policy set, or None after printing every problem to stderr."""
    try:
        return load_paths(paths)
    except PolicyError as exc:
        for issue in exc.issues:
            eprint(f"error: {issue}")
        return None


# libyaml's safe loader where PyYAML was built with it (the wheels are): the same documents as
# yaml.SafeLoader, about eight times faster on a file of thousands of pods.
SAFE_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader
)


def _read_text(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    path = Path(source)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{source}: cannot read: {exc}") from None


def read_documents(source: str) -> list[Any]:
    text = _read_text(source)
    try:
        if text.lstrip().startswith(("{", "[")):
            return [json.loads(text)]
        return [doc for doc in yaml.load_all(text, Loader=SAFE_LOADER) if doc is not None]
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: invalid JSON: line {exc.lineno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise InputError(f"{source}: invalid YAML: {where}{getattr(exc, 'problem', exc)}") from None


def load_cluster(sources: Sequence[str]) -> ClusterView:
    """The cluster that files of Namespace, PriorityClass and ConfigMap manifests describe (the
    same reading as ``gpuwarden serve --namespaces FILE``); no files, an empty cluster."""
    views = []
    for source in sources:
        try:
            views.append(manifests.cluster_view(read_documents(source), source))
        except manifests.ManifestError as exc:
            raise InputError(str(exc)) from None
    return manifests.merged(views)


def _pod_request(doc: Mapping[str, Any], source: str, namespace: str | None) -> AdmissionRequest:
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping):
        raise InputError(f"{source}: the Pod has no metadata")
    if not isinstance(doc.get("spec"), Mapping):
        raise InputError(f"{source}: the Pod has no spec")
    ns = namespace or meta.get("namespace") or "default"
    return AdmissionRequest(operation="CREATE", namespace=str(ns), pod=doc)


def _review_request(doc: Mapping[str, Any], source: str, namespace: str | None) -> AdmissionRequest:
    request = doc.get("request")
    if not isinstance(request, Mapping):
        raise InputError(f"{source}: the AdmissionReview has no request")
    obj = request.get("object")
    if not isinstance(obj, Mapping):
        raise InputError(f"{source}: request.object is missing")
    operation = str(request.get("operation", "CREATE"))
    if operation not in _OPERATIONS:
        raise InputError(f"{source}: request.operation {operation!r} is not one of {_OPERATIONS}")
    meta = obj.get("metadata")
    ns = (
        namespace
        or request.get("namespace")
        or (meta.get("namespace") if isinstance(meta, Mapping) else None)
    )
    old = request.get("oldObject")
    return AdmissionRequest(
        operation=cast(Operation, operation),
        namespace=str(ns or "default"),
        pod=obj,
        old_pod=old if isinstance(old, Mapping) else None,
        sub_resource=str(request.get("subResource") or ""),
        uid=str(request.get("uid") or ""),
        dry_run=bool(request.get("dryRun", False)),
    )


def read_pods(sources: Iterable[str], namespace: str | None = None) -> list[PodInput]:
    inputs: list[PodInput] = []
    for source in sources:
        docs = read_documents(source)
        if not docs:
            raise InputError(f"{source}: holds no document")
        for index, doc in enumerate(docs, start=1):
            where = source if len(docs) == 1 else f"{source}: document {index}"
            if not isinstance(doc, Mapping):
                raise InputError(f"{where}: expected a Pod or an AdmissionReview")
            kind = doc.get("kind")
            if kind == "AdmissionReview":
                inputs.append(PodInput(where, _review_request(doc, where, namespace), True))
            elif kind == "Pod":
                inputs.append(PodInput(where, _pod_request(doc, where, namespace), False))
            else:
                raise InputError(f"{where}: expected kind Pod or AdmissionReview, got {kind!r}")
    return inputs


@dataclass(frozen=True)
class DryRun:
    """What `apply` and `explain` work on: the policies, the cluster view and the pods."""

    policies: PolicySet
    cluster: ClusterView
    pods: list[PodInput]


def add_dry_run_arguments(parser: argparse.ArgumentParser, *, metavar: str = "FILE") -> None:
    parser.add_argument(
        "files", nargs="+", metavar=metavar, help="Pod or AdmissionReview (- for stdin)"
    )
    parser.add_argument("--policies", "-p", action="append", required=True, metavar="PATH")
    parser.add_argument(
        "--namespaces",
        metavar="FILE",
        help="Namespace, PriorityClass and ConfigMap manifests, as kubectl get -o yaml writes them",
    )
    parser.add_argument("--namespace", "-n", metavar="NS", help="Namespace for every pod")


def load_dry_run(args: argparse.Namespace) -> DryRun | None:
    """The inputs of a dry run, or None after printing what is wrong (exit status 2)."""
    policies = load_policies(args.policies)
    if policies is None:
        return None
    try:
        cluster = load_cluster([args.namespaces] if args.namespaces else [])
        pods = read_pods(args.files, args.namespace)
    except InputError as exc:
        eprint(f"error: {exc}")
        return None
    return DryRun(policies, cluster, pods)
