"""`gpuwarden certs sync`, the chart's init container, against a real kube-apiserver.

Every API test installs what the chart renders in self-managed TLS mode (the empty Secret, the
webhook's ServiceAccount, its Roles and bindings, both webhook configurations) under a fresh
release name, and runs sync with the chart's own init-container arguments as that
ServiceAccount (a client certificate for system:serviceaccount:NS:NAME): the chart's RBAC is all
it gets.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import subprocess
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from e2e.controlplane import ControlPlane, Tools
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from gpuwarden import cli
from gpuwarden.certs.authority import KeyPair, issue_serving, new_ca
from gpuwarden.certs.material import KEYS, plan_material, serving_names
from gpuwarden.certs.rotation import ServingNames, ensure_directory, load_bundle, names_of
from gpuwarden.cli import build_parser
from gpuwarden.commands.serve import config_from
from gpuwarden.kube.certsync import SecretSync, sync_secret
from gpuwarden.webhook.server import prepare_certificates

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpuwarden"
SELF_MANAGED = REPO / "tests" / "chart" / "values" / "self-managed-tls.yaml"
DAY = datetime.timedelta(days=1)
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


@dataclass(frozen=True)
class Install:
    """The chart's objects in one namespace, and a kubeconfig for its webhook ServiceAccount."""

    namespace: str
    fullname: str
    secret: str
    init_args: tuple[str, ...]
    serve_args: tuple[str, ...]
    kubeconfig: Path
    days: int

    def argv(self, out: Path, *replace: str) -> list[str]:
        """The chart's init-container arguments with --out moved to ``out``, run as the
        ServiceAccount, and the flags in ``replace`` (``--flag=value``) instead of theirs."""
        args = [a for a in self.init_args if not a.startswith("--out=")]
        args += [f"--out={out}", f"--kubeconfig={self.kubeconfig}"]
        for item in replace:
            flag = item.split("=", 1)[0] + "="
            args = [a for a in args if not a.startswith(flag)]
        return [*args, *replace]


def _render(helm: Path, release: str, namespace: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [
            str(helm),
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "-f",
            str(SELF_MANAGED),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if isinstance(doc, dict)]


def _sa_kubeconfig(plane: ControlPlane, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig authenticating as the ServiceAccount (x509: CN is the user, O the groups)."""
    return plane.write_kubeconfig_for(
        path,
        f"system:serviceaccount:{namespace}:{account}",
        organizations=["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
    )


def _never_called(config: dict[str, Any]) -> dict[str, Any]:
    """The chart's configuration, made harmless for the other tests sharing the API server."""
    for hook in config["webhooks"]:
        hook["namespaceSelector"] = {"matchLabels": {"never": "matches"}}
        hook["failurePolicy"] = "Ignore"
    return config


@pytest.fixture
def install(
    e2e_tools: Tools,
    control_plane: ControlPlane,
    api_client: k8s_client.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> Iterator[Install]:
    release = f"r{uuid.uuid4().hex[:8]}"
    docs = _render(e2e_tools.helm, release, namespace)
    fullname = f"{release}-gpuwarden"
    account = f"{fullname}-webhook"
    # Typed Any: the client takes the rendered manifests as plain dicts.
    core: Any = k8s_client.CoreV1Api(api_client)
    rbac: Any = k8s_client.RbacAuthorizationV1Api(api_client)
    admission: Any = k8s_client.AdmissionregistrationV1Api(api_client)
    cluster_scoped: list[tuple[Any, str]] = []

    def bound_to_webhook(doc: Mapping[str, Any]) -> bool:
        return any(s.get("name") == account for s in doc.get("subjects") or ())

    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "Secret":
            core.create_namespaced_secret(namespace, doc)
        elif kind == "ServiceAccount" and name == account:
            core.create_namespaced_service_account(namespace, doc)
        elif kind == "Role":
            rbac.create_namespaced_role(namespace, doc)
        elif kind == "RoleBinding" and bound_to_webhook(doc):
            rbac.create_namespaced_role_binding(namespace, doc)
        elif kind == "ClusterRoleBinding" and bound_to_webhook(doc):
            role = doc["roleRef"]["name"]
            assert ("ClusterRole", role) in names
            role_doc = next(
                d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == role
            )
            rbac.create_cluster_role(role_doc)
            rbac.create_cluster_role_binding(doc)
            cluster_scoped += [
                (rbac.delete_cluster_role_binding, name),
                (rbac.delete_cluster_role, role),
            ]
        elif kind == "MutatingWebhookConfiguration":
            admission.create_mutating_webhook_configuration(_never_called(doc))
            cluster_scoped.append((admission.delete_mutating_webhook_configuration, name))
        elif kind == "ValidatingWebhookConfiguration":
            admission.create_validating_webhook_configuration(_never_called(doc))
            cluster_scoped.append((admission.delete_validating_webhook_configuration, name))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod_spec = deployment["spec"]["template"]["spec"]
    init = next(c for c in pod_spec["initContainers"] if c["name"] == "certs")
    serve = next(c for c in pod_spec["containers"] if c["name"] == "webhook")
    days = yaml.safe_load(SELF_MANAGED.read_text())["tls"]["selfManaged"]["days"]
    try:
        yield Install(
            namespace=namespace,
            fullname=fullname,
            secret=f"{fullname}-tls",
            init_args=tuple(init["args"]),
            serve_args=tuple(serve["args"]),
            kubeconfig=_sa_kubeconfig(control_plane, namespace, account, tmp_path / "sa.yaml"),
            days=days,
        )
    finally:
        for delete, name in cluster_scoped:
            with contextlib.suppress(ApiException):
                delete(name)


def _secret(api: k8s_client.ApiClient, install: Install) -> tuple[dict[str, bytes], str]:
    body: Any = k8s_client.CoreV1Api(api).read_namespaced_secret(install.secret, install.namespace)
    data = {k: base64.b64decode(v) for k, v in (body.data or {}).items()}
    return data, str(body.metadata.resource_version)


# The chart's webhooks: mutate and validate for pods, validate for ConfigMaps, mutate and
# validate for Kubeflow jobs.
WEBHOOKS = 5


def _ca_bundles(api: k8s_client.ApiClient, name: str) -> list[bytes]:
    admission = k8s_client.AdmissionregistrationV1Api(api)
    configs: list[Any] = [
        admission.read_mutating_webhook_configuration(name),
        admission.read_validating_webhook_configuration(name),
    ]
    return [
        base64.b64decode(hook.client_config.ca_bundle)
        for config in configs
        for hook in config.webhooks
    ]


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in KEYS}


def _sync(install: Install, out: Path, *replace: str) -> int:
    return cli.main(install.argv(out, *replace))


@pytest.mark.e2e
def test_the_init_container_fills_the_empty_secret_publishes_the_ca_and_writes_the_files(
    install: Install,
    api_client: k8s_client.ApiClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _secret(api_client, install)[0] == {}, "the chart creates the Secret empty"
    out = tmp_path / "tls"
    assert _sync(install, out) == 0, capsys.readouterr().err
    stored, _ = _secret(api_client, install)
    assert sorted(stored) == sorted(KEYS)
    assert _files(out) == stored
    assert (out / "ca.key").stat().st_mode & 0o777 == 0o600
    assert (out / "tls.key").stat().st_mode & 0o777 == 0o600
    ca = load_bundle(stored["ca.crt"])
    assert len(ca) == 1
    serving = x509.load_pem_x509_certificate(stored["tls.crt"])
    serving.verify_directly_issued_by(ca[0])
    service = install.fullname
    want = {service, f"{service}.{install.namespace}", f"{service}.{install.namespace}.svc"}
    assert want <= set(names_of(serving).dns_names)
    lifetime = serving.not_valid_after_utc - serving.not_valid_before_utc
    assert abs(lifetime - install.days * DAY) < datetime.timedelta(minutes=10)
    assert _ca_bundles(api_client, install.fullname) == [stored["ca.crt"]] * WEBHOOKS
    printed = capsys.readouterr().out
    assert "issued a new CA" in printed and "caBundle updated" in printed

    # The webhook container (`serve --cert-dir`, the chart's arguments) serves these files as
    # they are, and its own renewal later keeps the CA the caBundle holds.
    args = [a for a in install.serve_args if not a.startswith("--cert-dir=")]
    config = config_from(build_parser().parse_args([*args, f"--cert-dir={out}"]))
    assert prepare_certificates(config) == []
    later = serving.not_valid_after_utc - DAY
    assert ensure_directory(out, ServingNames.of(config.serving_names), now=later)
    renewed = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    renewed.verify_directly_issued_by(ca[0])
    assert (out / "ca.crt").read_bytes() == stored["ca.crt"]


@pytest.mark.e2e
def test_a_second_sync_keeps_the_same_ca_and_certificate(
    install: Install,
    api_client: k8s_client.ApiClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _sync(install, tmp_path / "a") == 0
    first, version = _secret(api_client, install)
    capsys.readouterr()
    assert _sync(install, tmp_path / "b") == 0
    printed = capsys.readouterr().out
    again, version_again = _secret(api_client, install)
    assert (again, version_again) == (first, version), "an up-to-date Secret is not written"
    assert _files(tmp_path / "b") == first
    assert "kept as it is" in printed and "already up to date" in printed


def _barrier_planner(barrier: threading.Barrier, install: Install) -> Any:
    names = serving_names(install.fullname, install.namespace)

    def plan(data: Mapping[str, bytes]) -> tuple[Mapping[str, bytes], tuple[str, ...]]:
        planned = plan_material(data, names)
        if planned.changed:
            barrier.wait(timeout=20)  # both replicas have read the empty Secret
        return planned.material.as_data(), planned.changes

    return plan


@pytest.mark.e2e
def test_two_replicas_starting_together_end_with_one_secret(
    install: Install, api_client: k8s_client.ApiClient, tmp_path: Path
) -> None:
    """Both read the empty Secret before either writes: one update wins, the other gets 409,
    reads again and keeps what the winner wrote."""
    barrier = threading.Barrier(2)
    results: list[SecretSync] = []
    errors: list[BaseException] = []

    def replica() -> None:
        api = k8s_config.new_client_from_config(config_file=str(install.kubeconfig))  # type: ignore[no-untyped-call]
        try:
            plan = _barrier_planner(barrier, install)
            results.append(sync_secret(api, install.namespace, install.secret, plan))
        except BaseException as exc:
            errors.append(exc)
        finally:
            api.close()

    threads = [threading.Thread(target=replica) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    stored, version = _secret(api_client, install)
    winner, loser = sorted(results, key=lambda r: r.conflicts)
    assert (winner.conflicts, loser.conflicts) == (0, 1)
    assert winner.changes and not loser.changes
    assert dict(winner.data) == dict(loser.data) == stored
    assert winner.resource_version == loser.resource_version == version

    # The whole command, twice at once: whatever the interleaving, both pods get the Secret.
    outs = [tmp_path / "p1", tmp_path / "p2"]
    codes: list[int] = []
    runs = [threading.Thread(target=lambda o=o: codes.append(_sync(install, o))) for o in outs]
    for run in runs:
        run.start()
    for run in runs:
        run.join(30)
    assert codes == [0, 0]
    assert _files(outs[0]) == _files(outs[1]) == _secret(api_client, install)[0] == stored


def _put(api: k8s_client.ApiClient, install: Install, data: Mapping[str, bytes]) -> None:
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    k8s_client.CoreV1Api(api).patch_namespaced_secret(
        install.secret, install.namespace, {"data": encoded}
    )


@pytest.mark.e2e
def test_an_expiring_serving_certificate_is_renewed_with_the_same_ca(
    install: Install,
    api_client: k8s_client.ApiClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _sync(install, tmp_path / "a") == 0
    first, _ = _secret(api_client, install)
    ca = KeyPair(first["ca.crt"], first["ca.key"])
    names = serving_names(install.fullname, install.namespace)
    old = issue_serving(
        ca,
        dns_names=list(names.dns_names),
        ip_addresses=list(names.ip_addresses),
        valid_for=install.days * DAY,
        now=datetime.datetime.now(datetime.UTC) - 0.8 * install.days * DAY,
    )
    _put(api_client, install, {"tls.crt": old.cert_pem, "tls.key": old.key_pem})
    capsys.readouterr()
    assert _sync(install, tmp_path / "b") == 0
    printed = capsys.readouterr().out
    renewed, _ = _secret(api_client, install)
    assert "issued a new serving certificate: the serving certificate expires" in printed
    assert (renewed["ca.crt"], renewed["ca.key"]) == (first["ca.crt"], first["ca.key"])
    cert = x509.load_pem_x509_certificate(renewed["tls.crt"])
    cert.verify_directly_issued_by(ca.certificate)
    assert cert.not_valid_after_utc - old.not_after > 0.7 * install.days * DAY
    assert _files(tmp_path / "b") == renewed
    assert _ca_bundles(api_client, install.fullname) == [first["ca.crt"]] * WEBHOOKS
    assert "already up to date" in printed, "the same CA: caBundle is left as it is"


@pytest.mark.e2e
def test_a_ca_near_its_end_is_replaced_and_the_old_one_stays_in_the_bundle(
    install: Install, api_client: k8s_client.ApiClient, tmp_path: Path
) -> None:
    """Replicas still serving a certificate of the old CA stay trusted through the rollout."""
    now = datetime.datetime.now(datetime.UTC)
    old_ca = new_ca(common_name="old", valid_for=300 * DAY, now=now - 250 * DAY)
    names = serving_names(install.fullname, install.namespace)
    old_serving = issue_serving(
        old_ca,
        dns_names=list(names.dns_names),
        ip_addresses=list(names.ip_addresses),
        valid_for=install.days * DAY,
    )
    _put(
        api_client,
        install,
        {
            "ca.crt": old_ca.cert_pem,
            "ca.key": old_ca.key_pem,
            "tls.crt": old_serving.cert_pem,
            "tls.key": old_serving.key_pem,
        },
    )
    assert _sync(install, tmp_path / "tls") == 0
    stored, _ = _secret(api_client, install)
    bundle = load_bundle(stored["ca.crt"])
    assert len(bundle) == 2 and bundle[1] == old_ca.certificate
    x509.load_pem_x509_certificate(stored["tls.crt"]).verify_directly_issued_by(bundle[0])
    assert KeyPair(b"", stored["ca.key"]).private_key.public_key() == bundle[0].public_key()
    assert _ca_bundles(api_client, install.fullname) == [stored["ca.crt"]] * WEBHOOKS


@pytest.mark.e2e
def test_what_the_chart_does_not_grant_is_a_one_line_error_naming_the_object(
    install: Install, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = f"--secret={install.fullname}-other"
    assert _sync(install, tmp_path / "x", other) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"secret {install.namespace}/{install.fullname}-other: cannot get: 403 Forbidden" in err
    assert not (tmp_path / "x").exists()

    assert _sync(install, tmp_path / "y", f"--webhook-config={install.fullname}-other") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"MutatingWebhookConfiguration {install.fullname}-other: cannot read: 403" in err
    assert not (tmp_path / "y").exists(), "no files for a pod whose CA was not published"


@pytest.mark.e2e
def test_an_unreachable_api_server_is_a_one_line_error(
    install: Install, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = yaml.safe_load(install.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    dead = tmp_path / "dead.yaml"
    dead.write_text(yaml.safe_dump(config))
    assert _sync(install, tmp_path / "x", f"--kubeconfig={dead}") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"secret {install.namespace}/{install.secret}: cannot reach the API server" in err


@pytest.mark.parametrize(
    ("flag", "complaint"),
    [
        ("--namespace=Not_A_Name", "is not a valid name"),
        ("--secret=", "is not a valid name"),
        ("--days=0", "must be a positive number of days"),
    ],
)
def test_bad_flags_exit_2_with_the_flag_named(
    flag: str, complaint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "certs",
        "sync",
        "--secret=s",
        "--namespace=ns",
        "--service=svc",
        "--webhook-config=w",
        f"--out={tmp_path}",
    ]
    with pytest.raises(SystemExit) as exited:
        cli.main([*argv, flag])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert flag.split("=")[0] in err and complaint in err


def test_out_that_is_a_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    argv = ["certs", "sync", "--secret=s", "--namespace=ns", "--service=svc"]
    assert cli.main([*argv, "--webhook-config=w", f"--out={tmp_path / 'f'}"]) == 2
    assert "not a directory" in capsys.readouterr().err


# The plan alone (no API server): what counts as usable Secret contents.

NAMES = serving_names("svc", "ns")


def test_unusable_contents_are_replaced_and_good_ones_kept() -> None:
    good = plan_material({}, NAMES).material.as_data()
    assert not plan_material(good, NAMES).changed
    cases = {
        "garbage CA": ({**good, "ca.crt": b"not pem"}, "issued a new CA"),
        "CA key of another CA": (
            {**good, "ca.key": new_ca(common_name="x").key_pem},
            "issued a new CA: ca.key matches no certificate",
        ),
        "serving key of another cert": (
            {**good, "tls.key": plan_material({}, NAMES).material.tls_key},
            "tls.key does not match tls.crt",
        ),
        "fewer names": (
            plan_material(good, serving_names("svc", "other")).material.as_data(),
            "the serving certificate lacks svc.ns",
        ),
    }
    for what, (data, reason) in cases.items():
        plan = plan_material(data, NAMES)
        assert any(reason in change for change in plan.changes), (what, plan.changes)
        assert not plan_material(plan.material.as_data(), NAMES).changed, what
    # A serving certificate for other names, but from the same CA, keeps the CA.
    other = plan_material({**good, "tls.crt": b"", "tls.key": b""}, NAMES)
    assert other.material.ca_cert == good["ca.crt"] and other.material.ca_key == good["ca.key"]
