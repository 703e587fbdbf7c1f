"""`gpuwarden review`: send AdmissionReviews (or Pods) to a running webhook, as the API server would.

The server's certificate is verified with the CA of its certificate directory (``ca.crt`` in
``--cert-dir``, the one `make run` and ``gpuwarden serve --cert-dir`` issue), so a successful
review also shows the TLS setup works.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import ssl
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.commands._inputs import (
    JOBS_TOO,
    InputError,
    eprint,
    namespace_name,
    read_documents,
)
from gpuwarden.policy.pod import jobs

HELP = "Send AdmissionReviews (or Pods) to a running gpuwarden webhook and print its answers"

EXIT_OK, EXIT_DENIED, EXIT_USAGE = 0, 1, 2
DEFAULT_URL = "https://127.0.0.1:8443"
DEFAULT_CERT_DIR = Path(".cache/certs")
API_VERSION = "admission.k8s.io/v1"


class ReviewCallError(Exception):
    """The webhook could not be asked, or answered something that is not an AdmissionReview."""


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="AdmissionReview, Pod or Kubeflow job (PyTorchJob...), JSON or YAML (- for stdin); "
        "a Pod or a job is sent as a CREATE",
    )
    parser.add_argument(
        "--url",
        default=DEFAULT_URL,
        metavar="URL",
        help=f"the webhook server (default {DEFAULT_URL}, where `make run` serves)",
    )
    parser.add_argument(
        "--endpoint",
        choices=("mutate", "validate"),
        default="mutate",
        help="the webhook to call (default mutate)",
    )
    parser.add_argument(
        "--cert-dir",
        type=Path,
        default=DEFAULT_CERT_DIR,
        metavar="DIR",
        help=f"the server's certificate directory: its ca.crt verifies the server "
        f"(default {DEFAULT_CERT_DIR}, where `make run` keeps it)",
    )
    parser.add_argument(
        "--ca", type=Path, metavar="FILE", help="CA bundle to verify the server with instead"
    )
    parser.add_argument(
        "--client-cert",
        type=Path,
        metavar="FILE",
        help="client certificate, for a server run with --client-ca",
    )
    parser.add_argument(
        "--client-key", type=Path, metavar="FILE", help="the client certificate's key"
    )
    parser.add_argument(
        "--namespace",
        "-n",
        metavar="NS",
        help="namespace of a Pod sent as a CREATE (default: the pod's own, else default)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds to wait for each answer (default 10)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("summary", "json", "patch"),
        default="summary",
        help="summary: the verdict and warnings; json: the AdmissionReview the server answered; "
        "patch: the JSON Patch it returned, its bytes as returned (base64-decoded), then a "
        "newline (default summary)",
    )


# --- the pure part: what to send, and what the answer says ---------------------------------


def review_for(doc: Any, where: str, namespace: str | None) -> dict[str, Any]:
    """The AdmissionReview to send for one document: itself, or a Pod or a Kubeflow job
    wrapped in a CREATE."""
    if not isinstance(doc, Mapping):
        raise InputError(f"{where}: expected a Pod or an AdmissionReview")
    kind = doc.get("kind")
    if kind == "AdmissionReview":
        if not isinstance(doc.get("request"), Mapping):
            raise InputError(f"{where}: the AdmissionReview has no request")
        return dict(doc)
    job = jobs.job_kind(doc)
    if kind != "Pod" and job is None:
        raise InputError(f"{where}: expected kind Pod or AdmissionReview, got {kind!r}{JOBS_TOO}")
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping):
        raise InputError(f"{where}: the {kind} has no metadata")
    ns = str(namespace or meta.get("namespace") or "default")
    pod = {**doc, "metadata": {**meta, "namespace": ns}}
    pod_kind = {"group": "", "version": "v1", "kind": "Pod"}
    pods = {"group": "", "version": "v1", "resource": "pods"}
    asked_kind, asked = pod_kind, pods
    if job is not None:
        # A job is sent as the API server sends it to the job webhooks: its own kind and plural,
        # at the version their rules name (matchPolicy Equivalent converts another served one).
        pod_kind = {"group": job.group, "version": job.version, "kind": job.kind}
        pods = {"group": job.group, "version": job.version, "resource": job.plural}
        written = doc.get("apiVersion")
        if isinstance(written, str) and written != job.api_version:
            version = written.rpartition("/")[2]
            asked_kind, asked = {**pod_kind, "version": version}, {**pods, "version": version}
            pod["apiVersion"] = job.api_version
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": pod_kind,
            "resource": pods,
            "requestKind": asked_kind,
            "requestResource": asked,
            "name": str(meta.get("name") or ""),
            "namespace": ns,
            "operation": "CREATE",
            "userInfo": {"username": "gpuwarden-review", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


@dataclass(frozen=True)
class Answer:
    """What the webhook answered to one review."""

    allowed: bool
    message: str
    code: int | None
    patch: list[Any]
    warnings: tuple[str, ...]
    #: response.patch base64-decoded: the very bytes the webhook returned.
    patch_bytes: bytes = b""


def answer_of(body: Any) -> Answer:
    """Read the AdmissionReview the server answered; ReviewCallError if it is not one."""
    response = body.get("response") if isinstance(body, Mapping) else None
    if not isinstance(response, Mapping) or not isinstance(response.get("allowed"), bool):
        raise ReviewCallError("the answer is not an AdmissionReview with response.allowed")
    status = response.get("status")
    status = status if isinstance(status, Mapping) else {}
    patch: list[Any] = []
    raw = b""
    if response.get("patch"):
        try:
            raw = base64.b64decode(str(response["patch"]), validate=True)
            decoded = json.loads(raw)
        except (binascii.Error, ValueError) as exc:
            raise ReviewCallError(f"response.patch is not base64 JSON: {exc}") from None
        patch = decoded if isinstance(decoded, list) else [decoded]
    code = status.get("code")
    return Answer(
        allowed=response["allowed"],
        message=str(status.get("message") or ""),
        code=code if isinstance(code, int) else None,
        patch=patch,
        warnings=tuple(str(w) for w in response.get("warnings") or ()),
        patch_bytes=raw,
    )


def label_of(review: Mapping[str, Any]) -> str:
    """``namespace/name`` of the reviewed object."""
    request = review.get("request")
    request = request if isinstance(request, Mapping) else {}
    obj = request.get("object")
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    name = request.get("name") or meta.get("name") or meta.get("generateName") or "<unnamed>"
    namespace = request.get("namespace") or meta.get("namespace") or "default"
    return f"{namespace}/{name}"


def summary(label: str, source: str, endpoint: str, answer: Answer) -> list[str]:
    """The lines `review` prints for one answer."""
    if answer.allowed:
        changes = f"{len(answer.patch)} patch operation(s)" if endpoint == "mutate" else "valid"
        lines = [f"{label} ({source}): allowed by /{endpoint}, {changes}"]
    else:
        code = f" ({answer.code})" if answer.code is not None else ""
        lines = [f"{label} ({source}): denied by /{endpoint}{code}: {answer.message}"]
    return lines + [f"  warning: {line}" for line in answer.warnings]


# --- the shell: files in, HTTPS out ----------------------------------------------------------


def tls_context(args: argparse.Namespace) -> ssl.SSLContext:
    ca: Path = args.ca or args.cert_dir / "ca.crt"
    if not ca.is_file():
        hint = "" if args.ca else " (run `make run` first, which issues it, or give --ca FILE)"
        raise InputError(f"{ca}: no such CA file{hint}")
    try:
        context = ssl.create_default_context(cafile=str(ca))
        if args.client_cert or args.client_key:
            if not (args.client_cert and args.client_key):
                raise InputError("give both --client-cert FILE and --client-key FILE")
            context.load_cert_chain(str(args.client_cert), str(args.client_key))
    except (ssl.SSLError, OSError) as exc:
        raise InputError(f"cannot load the TLS files: {exc}") from None
    return context


def post(url: str, review: Mapping[str, Any], context: ssl.SSLContext, timeout: float) -> Any:
    """POST one review; the decoded JSON answer, or ReviewCallError saying what went wrong."""
    request = urllib.request.Request(
        url,
        data=json.dumps(review).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
            text = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        raise ReviewCallError(f"{url} answered {exc.code}: {detail or exc.reason}") from None
    except urllib.error.URLError as exc:
        raise ReviewCallError(f"cannot reach {url}: {exc.reason}") from None
    except (TimeoutError, OSError) as exc:
        raise ReviewCallError(f"cannot reach {url}: {exc}") from None
    try:
        return json.loads(text)
    except ValueError:
        raise ReviewCallError(f"{url} answered something that is not JSON") from None


def _reviews(files: Sequence[str], namespace: str | None) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for source in files:
        docs = read_documents(source)
        if not docs:
            raise InputError(f"{source}: holds no document")
        for index, doc in enumerate(docs, start=1):
            where = source if len(docs) == 1 else f"{source}: document {index}"
            out.append((where, review_for(doc, where, namespace)))
    return out


def run(args: argparse.Namespace) -> int:
    url = f"{args.url.rstrip('/')}/{args.endpoint}"
    try:
        reviews = _reviews(args.files, namespace_name(args.namespace))
        context = tls_context(args)
    except InputError as exc:
        eprint(f"error: {exc}")
        return EXIT_USAGE
    denied = False
    for source, review in reviews:
        try:
            body = post(url, review, context, args.timeout)
            answer = answer_of(body)
        except ReviewCallError as exc:
            eprint(f"error: {source}: {exc}")
            return EXIT_USAGE
        denied = denied or not answer.allowed
        if args.output == "json":
            sys.stdout.write(json.dumps(body, indent=2) + "\n")
        elif args.output == "patch":
            # The bytes the webhook returned, not re-serialised; "[]" when it sent no patch.
            sys.stdout.flush()
            sys.stdout.buffer.write((answer.patch_bytes or b"[]") + b"\n")
            sys.stdout.flush()
        else:
            sys.stdout.write("\n".join(summary(label_of(review), source, args.endpoint, answer)))
            sys.stdout.write("\n")
    return EXIT_DENIED if denied else EXIT_OK
