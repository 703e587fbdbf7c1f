"""`gpuwarden certs`: issue, rotate and publish the webhook's certificates."""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuwarden.certs.authority import service_dns_names
from gpuwarden.certs.material import KEYS, Material, plan_material, serving_names
from gpuwarden.certs.rotation import (
    CertDirectory,
    CertificateError,
    ServingNames,
    issue_directory,
    load_bundle,
    needs_renewal,
    renew_serving,
    rotate_ca,
)
from gpuwarden.kube.certsync import SyncError, publish_ca_bundle, sync_secret
from gpuwarden.kube.client import KubeConfigError, api_client
from gpuwarden.kube.webhooks import Injected, InjectError, inject_ca_bundle

HELP = "Issue, rotate, sync (a shared Secret) and publish (caBundle) the webhook's certificates."

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _days(text: str) -> datetime.timedelta:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if days <= 0:
        raise argparse.ArgumentTypeError("must be a positive number of days")
    return datetime.timedelta(days=days)


_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(_LABEL)
_SUBDOMAIN_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def _label(text: str) -> str:
    """A DNS-1123 label: what Namespace and Service names must be."""
    if len(text) > 63 or not _LABEL_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid name (lower-case letters, digits and '-', at most 63)"
        )
    return text


def _subdomain(text: str) -> str:
    """A DNS-1123 subdomain: what Secret and webhook configuration names must be."""
    if len(text) > 253 or not _SUBDOMAIN_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid name (lower-case letters, digits, '-' and '.')"
        )
    return text


_KUBECONFIG_HELP = "kubeconfig (default: in-cluster, then ~/.kube/config)"
_DAYS_HELP = "lifetime of the serving certificate, in days (default 90)"


def _action(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, text: str
) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="certs_command", metavar="ACTION", required=True)
    _issue_action(sub)
    _inject_action(sub)
    _rotate_action(sub)
    _sync_action(sub)


def _issue_action(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`certs issue`: a new CA and serving certificate for a Service."""
    issue = _action(sub, "issue", "a new CA and serving certificate for a Service")
    issue.add_argument(
        "--service", required=True, metavar="NAME", help="the webhook's Service name"
    )
    issue.add_argument(
        "--service-namespace",
        "--namespace",
        dest="namespace",
        required=True,
        metavar="NS",
        help="the Service's namespace (--namespace is its older name, kept working)",
    )
    issue.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory for ca.crt, tls.crt, tls.key",
    )
    issue.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS name or IP; repeatable",
    )
    issue.add_argument(
        "--days", type=_days, default=datetime.timedelta(days=90), metavar="DAYS", help=_DAYS_HELP
    )
    issue.add_argument("--force", action="store_true", help="replace existing files")


def _inject_action(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`certs inject`: the caBundle patched into both webhook configurations."""
    inject = _action(
        sub, "inject", "patch caBundle into the Mutating and Validating WebhookConfigurations"
    )
    inject.add_argument(
        "--ca", type=Path, required=True, metavar="FILE", help="the CA bundle (ca.crt)"
    )
    inject.add_argument(
        "--webhook-config", required=True, metavar="NAME", help="name of both configurations"
    )
    inject.add_argument("--kubeconfig", type=Path, metavar="FILE", help=_KUBECONFIG_HELP)


def _rotate_action(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`certs rotate`: renewal before expiry, or a safe roll to a new CA."""
    rotate = _action(
        sub,
        "rotate",
        "renew the serving certificate before expiry; with --ca, roll to a new CA safely",
    )
    rotate.add_argument(
        "--dir", type=Path, required=True, metavar="DIR", help="the certificate directory"
    )
    rotate.add_argument(
        "--ca", action="store_true", help="start a new CA (the old stays in the bundle)"
    )
    rotate.add_argument("--force", action="store_true", help="renew even if not yet due")
    rotate.add_argument(
        "--days", type=_days, default=datetime.timedelta(days=90), metavar="DAYS", help=_DAYS_HELP
    )
    rotate.add_argument(
        "--webhook-config",
        metavar="NAME",
        help="publish the new bundle there before moving the serving certificate to the new CA",
    )
    rotate.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help=f"{_KUBECONFIG_HELP}; used with --webhook-config",
    )


def _sync_action(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`certs sync`: the certificate Secret and caBundle kept in step in the cluster."""
    sync = _action(
        sub,
        "sync",
        "keep a shared Secret holding the CA and serving certificate, publish the CA as "
        "caBundle, and copy the four files into a directory (the chart's init container)",
    )
    sync.add_argument(
        "--secret",
        type=_subdomain,
        required=True,
        metavar="NAME",
        help="the Secret (it must exist; may be empty)",
    )
    sync.add_argument(
        "--namespace",
        type=_label,
        required=True,
        metavar="NS",
        help="namespace of the Secret and Service",
    )
    sync.add_argument(
        "--service", type=_label, required=True, metavar="NAME", help="the webhook's Service name"
    )
    sync.add_argument(
        "--webhook-config",
        type=_subdomain,
        required=True,
        metavar="NAME",
        help="name of both webhook configurations to publish the CA in",
    )
    sync.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory for ca.crt, ca.key, tls.crt, tls.key",
    )
    sync.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS name or IP; repeatable",
    )
    sync.add_argument(
        "--days", type=_days, default=datetime.timedelta(days=90), metavar="DAYS", help=_DAYS_HELP
    )
    sync.add_argument("--kubeconfig", type=Path, metavar="FILE", help=_KUBECONFIG_HELP)


def _err(message: str) -> None:
    print(f"gpuwarden certs: {message}", file=sys.stderr)


def _issue(args: argparse.Namespace) -> int:
    directory = CertDirectory(args.out)
    if not args.force and any(p.exists() for p in (directory.ca_cert, directory.tls_cert)):
        _err(f"{args.out} already holds certificates; pass --force to replace them")
        return EXIT_FAILED
    names = ServingNames.of([*service_dns_names(args.service, args.namespace), *args.san])
    issue_directory(args.out, names, serving_lifetime=args.days)
    cert = directory.serving().certificate
    print(f"wrote {directory.ca_cert}, {directory.tls_cert}, {directory.tls_key} (and ca.key)")
    print(f"serving certificate for {', '.join(names.dns_names + names.ip_addresses)}")
    print(f"valid until {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    return EXIT_OK


def _inject(ca: Path, name: str, kubeconfig: Path | None) -> int:
    try:
        pem = ca.read_bytes()
        load_bundle(pem)
    except OSError as exc:
        _err(f"{ca}: cannot read: {exc.strerror}")
        return EXIT_USAGE
    except CertificateError as exc:
        _err(f"{ca}: {exc}")
        return EXIT_USAGE
    try:
        api = api_client(kubeconfig)
    except KubeConfigError as exc:
        _err(str(exc))
        return EXIT_USAGE
    try:
        done = inject_ca_bundle(api, name, pem)
    except InjectError as exc:
        _err(str(exc))
        return EXIT_FAILED
    finally:
        api.close()  # type: ignore[no-untyped-call]
    _report_injected(done, name)
    return EXIT_OK


def _report_injected(done: Sequence[Injected], name: str) -> None:
    for item in done:
        state = "updated" if item.changed else "already up to date"
        print(f"{item.kind} {item.name}: caBundle {state} on {item.webhooks} webhook(s)")
    kinds = {item.kind for item in done}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        if kind not in kinds:
            print(f"warning: no {kind} named {name}", file=sys.stderr)


def _rotate(args: argparse.Namespace) -> int:
    directory = CertDirectory(args.dir)
    if not directory.has_ca():
        _err(
            f"{args.dir} has no ca.crt and ca.key to rotate (issue them with `gpuwarden certs issue`)"
        )
        return EXIT_USAGE
    try:
        if args.ca:
            bundle = rotate_ca(directory)
            print(f"new CA added to {directory.ca_cert} ({len(bundle)} CA(s) in the bundle)")
            if args.webhook_config is None:
                print(
                    "next: publish the bundle (gpuwarden certs inject --ca "
                    f"{directory.ca_cert} --webhook-config NAME), then run "
                    f"`gpuwarden certs rotate --dir {args.dir} --force` to move the serving "
                    "certificate to the new CA"
                )
                return EXIT_OK
            code = _inject(directory.ca_cert, args.webhook_config, args.kubeconfig)
            if code != EXIT_OK:
                _err("the serving certificate was left on the old CA")
                return code
        current = directory.serving().certificate
        if not (args.ca or args.force or needs_renewal(current)):
            print(
                f"serving certificate valid until {current.not_valid_after_utc:%Y-%m-%d}; not due"
            )
            return EXIT_OK
        pair = renew_serving(directory, lifetime=args.days)
    except (CertificateError, ValueError) as exc:
        _err(str(exc))
        return EXIT_FAILED
    print(f"renewed {directory.tls_cert}, valid until {pair.not_after:%Y-%m-%d %H:%M} UTC")
    return EXIT_OK


def _sync(args: argparse.Namespace) -> int:
    """Secret first (issue or renew, shared by the replicas), then caBundle, then the files.

    The files come last: a pod whose caBundle could not be published must not start serving.
    """
    out: Path = args.out
    if out.exists() and not out.is_dir():
        _err(f"--out {out}: not a directory")
        return EXIT_USAGE
    names = serving_names(args.service, args.namespace, args.san)

    def plan(data: Mapping[str, bytes]) -> tuple[Mapping[str, bytes], tuple[str, ...]]:
        planned = plan_material(data, names, serving_lifetime=args.days)
        return planned.material.as_data(), planned.changes

    try:
        api = api_client(args.kubeconfig)
    except KubeConfigError as exc:
        _err(str(exc))
        return EXIT_USAGE
    what = f"secret {args.namespace}/{args.secret}"
    try:
        synced = sync_secret(api, args.namespace, args.secret, plan)
        material = Material(*(synced.data[key] for key in KEYS))
        done = publish_ca_bundle(api, args.webhook_config, material.ca_cert)
    except SyncError as exc:
        _err(str(exc))
        return EXIT_FAILED
    finally:
        api.close()  # type: ignore[no-untyped-call]
    for change in synced.changes:
        print(f"{what}: {change}")
    if synced.conflicts:
        print(f"{what}: another writer updated it first ({synced.conflicts} time(s)); re-read it")
    if not synced.changes:
        until = material.serving.not_after
        print(f"{what}: kept as it is (serving certificate valid until {until:%Y-%m-%d %H:%M} UTC)")
    _report_injected(done, args.webhook_config)
    try:
        material.write(out)
    except OSError as exc:
        _err(f"--out {out}: cannot write: {exc.strerror or exc}")
        return EXIT_FAILED
    print(f"wrote {', '.join(KEYS)} to {out}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.certs_command == "issue":
        return _issue(args)
    if args.certs_command == "inject":
        return _inject(args.ca, args.webhook_config, args.kubeconfig)
    if args.certs_command == "sync":
        return _sync(args)
    return _rotate(args)
