"""Reading the CLI's inputs: policies, Namespace files, and Pods or AdmissionReviews."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args

import yaml

from gpuwarden.commands.shared import UsageError
from gpuwarden.policy import (
    AdmissionRequest,
    ClusterView,
    PolicyError,
    PolicySet,
    admit,
    load_paths,
)
from gpuwarden.policy.admission import manifests
from gpuwarden.policy.admission.decision import Operation
from gpuwarden.policy.admission.jobs import admit_job
from gpuwarden.policy.admission.pipeline import Admission
from gpuwarden.policy.pod import jobs
from gpuwarden.policy.spec.model import EnforcementAction

_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
# A namespace name is a DNS label (RFC 1123), as the API server checks it.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Namespaces every cluster has: a dry run may assume them without a --namespaces entry.
_BUILTIN_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


#: The dry runs read Kubeflow jobs too, as their errors say.
JOBS_TOO = "; job objects are read too: " + ", ".join(
    f"{k.kind} ({k.api_version})" for k in jobs.ALL_KINDS
)


class InputError(Exception):
    """Bad input: the message names the file and what is wrong."""


@dataclass(frozen=True)
class PodInput:
    source: str
    request: AdmissionRequest
    from_review: bool

    @property
    def is_job(self) -> bool:
        return jobs.is_job(self.request.pod)

    def admit(
        self,
        policies: PolicySet,
        cluster: ClusterView,
        *,
        default_action: EnforcementAction = "enforce",
    ) -> Admission:
        """The pod's admission, or the job's (each replica decided as its pod)."""
        if self.is_job:
            return admit_job(self.request, policies, cluster, default_action=default_action)
        return admit(self.request, policies, cluster, default_action=default_action)

    @property
    def label(self) -> str:
        meta = self.request.pod.get("metadata")
        name = "<unnamed>"
        if isinstance(meta, Mapping):
            name = str(meta.get("name") or meta.get("generateName") or name)
        return f"{self.request.namespace}/{name}"


def eprint(*parts: object) -> None:
    print(*parts, file=sys.stderr)


class _ExtendPaths(argparse.Action):
    """Adds its values to the list in ``dest``, so positional paths and -p PATH gather together."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        have = list(getattr(namespace, self.dest, None) or [])
        added = [values] if isinstance(values, str) else list(values or [])
        setattr(namespace, self.dest, have + added)


def add_policy_paths(parser: argparse.ArgumentParser) -> None:
    """Policy files or directories as positional PATHs, -p PATH or both (into ``args.paths``)."""
    parser.add_argument(
        "paths",
        nargs="*",
        action=_ExtendPaths,
        metavar="PATH",
        help="policy file or directory (the same as -p PATH)",
    )
    parser.add_argument(
        "--policies",
        "-p",
        dest="paths",
        action=_ExtendPaths,
        metavar="PATH",
        help="policy file or directory; repeatable",
    )


def load_policies(paths: Sequence[str] | None) -> PolicySet | None:
    """The policy set, or None after printing every problem to stderr.

    No paths at all is a usage error (exit status 2 through gpuwarden.cli.main).
    """
    if not paths:
        raise UsageError("no policies given: name policy files or directories (PATH or -p PATH)")
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
    kind = doc.get("kind")
    if not isinstance(meta, Mapping):
        raise InputError(f"{source}: the {kind} has no metadata")
    if not isinstance(doc.get("spec"), Mapping):
        raise InputError(f"{source}: the {kind} has no spec")
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


def list_items(docs: Sequence[Any]) -> list[Any]:
    """The documents, each List (``kind: List``, ``PodList``, ``GPUPolicyList``: what
    ``kubectl get -o yaml`` writes) replaced by its items."""
    return [where_doc[1] for where_doc in located_items("", docs)]


def located_items(source: str, docs: Sequence[Any]) -> list[tuple[str, Any]]:
    """(where, document) for each document, a List's items in its place."""
    out: list[tuple[str, Any]] = []
    for index, doc in enumerate(docs, start=1):
        where = source if len(docs) == 1 else f"{source}: document {index}"
        if isinstance(doc, Mapping) and str(doc.get("kind", "")).endswith("List"):
            items = doc.get("items")
            for item_index, item in enumerate(items if isinstance(items, list) else []):
                out.append((f"{where}: items[{item_index}]", item))
        else:
            out.append((where, doc))
    return out


def read_pods(sources: Iterable[str], namespace: str | None = None) -> list[PodInput]:
    inputs: list[PodInput] = []
    for source in sources:
        docs = read_documents(source)
        located = located_items(source, docs)
        if not located:
            raise InputError(
                f"{source}: holds no document" if not docs else f"{source}: empty List"
            )
        for where, doc in located:
            if not isinstance(doc, Mapping):
                raise InputError(f"{where}: expected a Pod or an AdmissionReview{JOBS_TOO}")
            kind = doc.get("kind")
            if kind == "AdmissionReview":
                inputs.append(PodInput(where, _review_request(doc, where, namespace), True))
            elif kind == "Pod" or jobs.is_job(doc):
                inputs.append(PodInput(where, _pod_request(doc, where, namespace), False))
            else:
                raise InputError(
                    f"{where}: expected kind Pod or AdmissionReview, got {kind!r}{JOBS_TOO}"
                )
    return inputs


@dataclass(frozen=True)
class DryRun:
    """What `apply` and `explain` work on: the policies, the cluster view and the pods."""

    policies: PolicySet
    cluster: ClusterView
    pods: list[PodInput]


def add_policies_option(parser: argparse.ArgumentParser) -> None:
    """--policies/-p PATH, required and repeatable (into ``args.policies``)."""
    parser.add_argument(
        "--policies",
        "-p",
        action="append",
        required=True,
        metavar="PATH",
        help="policy file or directory; repeatable",
    )


def add_dry_run_arguments(parser: argparse.ArgumentParser, *, metavar: str = "FILE") -> None:
    parser.add_argument(
        "files",
        nargs="+",
        metavar=metavar,
        help="Pod, Kubeflow job (PyTorchJob...) or AdmissionReview (- for stdin)",
    )
    add_policies_option(parser)
    parser.add_argument(
        "--namespaces",
        metavar="FILE",
        help="Namespace, PriorityClass and ConfigMap manifests, as kubectl get -o yaml writes "
        "them: the cluster the dry run assumes",
    )
    parser.add_argument(
        "--namespace",
        "-n",
        metavar="NS",
        help="namespace for every pod (default: each pod's own, else default)",
    )
    parser.add_argument(
        "--enforcement-action",
        choices=get_args(EnforcementAction),
        default="enforce",
        help="the webhook's --enforcement-action (the chart's webhook.enforcementAction): the "
        "enforcementAction of policies that set none (default enforce)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 2) where the dry run assumes what the cluster would not, instead of "
        "warning (a pod's namespace missing from --namespaces FILE)",
    )


def namespace_name(
    value: str | None, flag: str = "--namespace", files: str = "--namespaces FILE"
) -> str | None:
    """``value`` when it is a namespace name; InputError (with the likely mix-up: a file of
    Namespace manifests, which ``files`` takes) otherwise."""
    if value is None or _DNS_LABEL.fullmatch(value):
        return value
    hint = ""
    if "/" in value or value.endswith((".yaml", ".yml", ".json")) or Path(value).exists():
        hint = f"; to give the cluster's Namespace manifests, use {files}"
    raise InputError(
        f"{flag} {value!r} is not a namespace name (a lowercase DNS label, as kubectl -n takes)"
        f"{hint}"
    )


def unseen_namespaces(pods: Sequence[PodInput], cluster: ClusterView, source: str) -> list[str]:
    """What the dry run assumes of the pods' namespaces that the cluster in ``source`` lacks:
    on a cluster without the namespace the API server refuses the pod before any webhook."""
    problems = []
    for item in pods:
        namespace = item.request.namespace
        if namespace in cluster.namespace_labels or namespace in _BUILTIN_NAMESPACES:
            continue
        problems.append(
            f"{item.label}: namespace {namespace} is not in {source}: on that cluster the API "
            "server refuses the pod before gpuwarden sees it; the dry run assumed a namespace "
            "with no labels (add it to the file, or pick a namespace with -n)"
        )
    return problems


def load_dry_run(args: argparse.Namespace) -> DryRun | None:
    """The inputs of a dry run, or None after printing what is wrong (exit status 2).

    What the dry run assumes and the cluster would not have is a warning, or with --strict an
    error.
    """
    try:
        namespace = namespace_name(args.namespace)
    except InputError as exc:
        eprint(f"error: {exc}")
        return None
    policies = load_policies(args.policies)
    if policies is None:
        return None
    try:
        cluster = load_cluster([args.namespaces] if args.namespaces else [])
        pods = read_pods(args.files, namespace)
    except InputError as exc:
        eprint(f"error: {exc}")
        return None
    assumed = unseen_namespaces(pods, cluster, args.namespaces) if args.namespaces else []
    strict = bool(getattr(args, "strict", False))
    for line in assumed:
        eprint(f"{'error' if strict else 'warning'}: {line}")
    if assumed and strict:
        return None
    return DryRun(policies, cluster, pods)
