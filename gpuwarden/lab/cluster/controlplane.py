"""A real Kubernetes control plane: etcd plus kube-apiserver, no mocks (the e2e suites and the
scheduling lab run on it).

The binaries come from ``hack/build-tools.sh``, which builds them from Go module sources into
``${GPUWARDEN_CACHE_DIR:-~/.cache/gpuwarden-e2e}`` and records their paths in ``tools.env``.

What this control plane is (and is not):

* etcd and kube-apiserver only, on free loopback ports, in a private temporary directory
  (:mod:`gpuwarden.lab.cluster.schedulinglab` adds kube-scheduler and KWOK through
  :meth:`ControlPlane.spawn`).
* No kube-controller-manager, scheduler or kubelet: pods stay ``Pending`` with no node, deleted
  namespaces stay ``Terminating`` (the namespace controller never finalizes them), no default
  ServiceAccount or ``kube-root-ca.crt`` ConfigMap appears in new namespaces, and no controller
  fills in ResourceQuota ``status``. The ResourceQuota admission plugin enforces only what
  ``status.hard`` names, so a new quota constrains nothing until you write ``status.hard`` and
  ``status.used`` yourself through the status subresource (after that, admission keeps
  ``status.used`` up to date for the pods it admits).
* Authentication by client certificates (an admin in ``system:masters``), authorization by RBAC.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from gpuwarden.certs.authority import KeyPair, issue_client, new_ca
from gpuwarden.certs.loopback import loopback_serving

# An editable install (the only kind the lab supports: it needs hack/build-tools.sh's binaries).
REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-tools.sh"

#: The admission plugins this project depends on. Kubernetes keeps its default-on plugins
#: enabled as well; ``--enable-admission-plugins`` only adds to them.
ADMISSION_PLUGINS = (
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "ResourceQuota",
    "LimitRanger",
    "Priority",
    "NamespaceLifecycle",
)

_POLL_INTERVAL = 0.1
_LOG_TAIL_LINES = 40
_PORT_IN_USE = "address already in use"
# tools.env lines that may be missing (a cache built before the scheduling lab existed).
_OPTIONAL_TOOLS = (
    "KUBE_SCHEDULER",
    "KWOK",
    "KUEUE",
    "TRAINING_OPERATOR",
    "KUBE_CONTROLLER_MANAGER",
)


class ToolsMissingError(RuntimeError):
    """tools.env is absent or names a binary that is not there."""


class ControlPlaneError(RuntimeError):
    """The control plane did not come up (the message carries the processes' log tails)."""

    def __init__(self, message: str, *, port_conflict: bool = False) -> None:
        super().__init__(message)
        self.port_conflict = port_conflict


def cache_dir() -> Path:
    """Where hack/build-tools.sh puts the binaries (same rule as the script)."""
    configured = os.environ.get("GPUWARDEN_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "gpuwarden-e2e"


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the binaries built by hack/build-tools.sh.

    kube-scheduler, kwok, kueue, the Training Operator and kube-controller-manager are None in a tools.env written
    before they were built; only the scheduling lab and the job suites need them (and say so).
    """

    kube_apiserver: Path
    etcd: Path
    kubectl: Path
    helm: Path
    kube_scheduler: Path | None = None
    kwok: Path | None = None
    kueue: Path | None = None
    training_operator: Path | None = None
    kube_controller_manager: Path | None = None

    @classmethod
    def load(cls, cache: Path | None = None) -> Tools:
        env_file = (cache or cache_dir()) / "tools.env"
        if not env_file.is_file():
            raise ToolsMissingError(f"{env_file} does not exist; run hack/build-tools.sh")
        values: dict[str, str] = {}
        for raw in env_file.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
        paths: dict[str, Path] = {}
        for key in ("KUBE_APISERVER", "ETCD", "KUBECTL", "HELM", *_OPTIONAL_TOOLS):
            if key not in values:
                if key in _OPTIONAL_TOOLS:
                    continue
                raise ToolsMissingError(f"{env_file} has no {key}= line; run hack/build-tools.sh")
            path = Path(values[key])
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise ToolsMissingError(f"{key}={path} is not an executable file")
            paths[key] = path
        return cls(
            kube_apiserver=paths["KUBE_APISERVER"],
            etcd=paths["ETCD"],
            kubectl=paths["KUBECTL"],
            helm=paths["HELM"],
            kube_scheduler=paths.get("KUBE_SCHEDULER"),
            kwok=paths.get("KWOK"),
            kueue=paths.get("KUEUE"),
            training_operator=paths.get("TRAINING_OPERATOR"),
            kube_controller_manager=paths.get("KUBE_CONTROLLER_MANAGER"),
        )


def build_tools(*, stdout: IO[str] | None = None) -> Tools:
    """Run hack/build-tools.sh and load the tools.env it writes.

    The script only builds what is missing from the cache (a cold build of all four tools takes
    tens of minutes) and otherwise returns at once, so running it every time keeps tools.env in
    step with the versions pinned in the script.
    """
    subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        check=True,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
    )
    return Tools.load()


def self_signed_ok(url: str) -> bool:
    """Whether a component's own health endpoint on loopback answers 200. kube-scheduler and
    kube-controller-manager serve it with a self-signed certificate that nothing here needs to
    trust."""
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=2, context=insecure) as response:
        status: int = response.status
    return status == 200


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1, picked by the kernel (bind to port 0).

    The sockets are closed before the ports are used, so another process may grab one in
    between; ControlPlane.start() retries with fresh ports when that happens.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def json_log_records(path: Path) -> list[dict[str, Any]]:
    """Every JSON object line of a process's log (other lines are skipped; no log: none)."""
    records: list[dict[str, Any]] = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return records
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


def die_with_parent() -> None:
    """In the child before exec: be killed if the test process dies without calling stop().

    SIGKILL, not SIGTERM: etcd and kube-apiserver would both get the signal at once, and a
    kube-apiserver whose etcd is gone spends many seconds in graceful shutdown.
    """
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes] = field(repr=False)

    def tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        self.log_file.flush()
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 64 * 1024))
                text = handle.read().decode(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def terminate(self, timeout: float) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=timeout)
        self.log_file.close()


class ControlPlane:
    """etcd + kube-apiserver on free loopback ports, with an admin kubeconfig.

    Use as a context manager or call start() and stop(). All state (certificates, etcd data,
    logs, kubeconfig) lives in one temporary directory that stop() removes.
    """

    def __init__(
        self,
        tools: Tools,
        *,
        startup_timeout: float = 120.0,
        stop_timeout: float = 15.0,
        extra_apiserver_args: Sequence[str] = (),
        keep_workdir: bool = False,
    ) -> None:
        self.tools = tools
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        self.keep_workdir = keep_workdir
        self.startup_seconds: float | None = None
        self._workdir: Path | None = None
        self._processes: list[Process] = []
        self._etcd_url = ""
        self._server_url = ""
        self._ca: KeyPair | None = None

    # -- public surface -------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise RuntimeError("control plane not started")
        return self._workdir

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def kubectl_path(self) -> Path:
        return self.tools.kubectl

    @property
    def helm_path(self) -> Path:
        return self.tools.helm

    @property
    def server_url(self) -> str:
        """https://127.0.0.1:<port> of the API server."""
        if not self._server_url:
            raise RuntimeError("control plane not started")
        return self._server_url

    @property
    def etcd_url(self) -> str:
        if not self._etcd_url:
            raise RuntimeError("control plane not started")
        return self._etcd_url

    @property
    def ca(self) -> KeyPair:
        """The CA that signed the API server's serving certificate."""
        if self._ca is None:
            raise RuntimeError("control plane not started")
        return self._ca

    @property
    def log_paths(self) -> dict[str, Path]:
        return {process.name: process.log_path for process in self._processes}

    def api_client(self) -> k8s_client.ApiClient:
        """A fresh kubernetes.client.ApiClient authenticated as the admin user."""
        api: k8s_client.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig_path)
        )
        return api

    @contextlib.contextmanager
    def client_as(
        self, user: str, rules: Sequence[Mapping[str, Any]]
    ) -> Iterator[k8s_client.ApiClient]:
        """An ApiClient acting as ``user`` (admin impersonation), who is bound to a ClusterRole
        named ``user`` with ``rules``; role, binding and client go afterwards."""
        admin = self.api_client()
        # Plain dicts as bodies (the client serialises them as they are).
        rbac: Any = k8s_client.RbacAuthorizationV1Api(admin)
        group = "rbac.authorization.k8s.io"
        rbac.create_cluster_role({"metadata": {"name": user}, "rules": list(rules)})
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": user},
                "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": user},
                "subjects": [{"apiGroup": group, "kind": "User", "name": user}],
            }
        )
        acting = self.api_client()
        acting.set_default_header("Impersonate-User", user)  # type: ignore[no-untyped-call]
        try:
            yield acting
        finally:
            acting.close()  # type: ignore[no-untyped-call]
            rbac.delete_cluster_role_binding(user)
            rbac.delete_cluster_role(user)
            admin.close()  # type: ignore[no-untyped-call]

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this control plane."""
        result = subprocess.run(
            [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig_path), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            check=False,
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode, result.args, result.stdout, result.stderr
            )
        return result

    def wait_established(
        self, *crd_names: str, timeout: float = 180.0, what: str | None = None
    ) -> None:
        """Wait until every CRD named serves its kind, polling them through the API: an error
        answer or a moment's absence is retried until the deadline, and a timeout names what
        was waited for with the control plane's log tails (``kubectl wait`` once exited 1 here
        in CI, its message lost).

        The deadline is sized for a machine whose cores are shared with other control planes: an
        idle one establishes a CRD in under a second, a loaded one has taken over 30 s.
        """
        api = self.api_client()
        extensions: Any = k8s_client.ApiextensionsV1Api(api)

        def established(name: str) -> bool:
            try:
                crd = extensions.read_custom_resource_definition(name)
            except ApiException:
                return False
            conditions = (crd.status.conditions if crd.status else None) or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        try:
            self.poll(
                f"{what or 'CRD ' + ', '.join(crd_names)} to be established",
                lambda: all(established(name) for name in crd_names),
                [],
                time.monotonic() + timeout,
            )
        finally:
            api.close()  # type: ignore[no-untyped-call]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, *, attempts: int = 3) -> None:
        if self._workdir is not None:
            raise RuntimeError("control plane already started")
        began = time.monotonic()
        self._workdir = Path(tempfile.mkdtemp(prefix="gpuwarden-e2e-"))
        atexit.register(self.stop)
        try:
            certs = self._write_credentials()
            for attempt in range(1, attempts + 1):
                try:
                    self._launch(certs)
                    break
                except ControlPlaneError as exc:
                    # Another process took one of the ports between free_ports() and bind().
                    self._terminate_processes()
                    if not exc.port_conflict or attempt == attempts:
                        raise
            self._write_kubeconfig(certs)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd (SIGTERM, SIGKILL after stop_timeout); remove workdir."""
        atexit.unregister(self.stop)
        self._terminate_processes()
        if self._workdir is not None and not self.keep_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None
        self._server_url = self._etcd_url = ""

    # -- internals ------------------------------------------------------------------------

    def _terminate_processes(self) -> None:
        # Newest first: the API server must go before the etcd it talks to.
        while self._processes:
            self._processes.pop().terminate(self.stop_timeout)

    def _write_credentials(self) -> dict[str, Path]:
        pki = self.workdir / "pki"
        ca, serving = loopback_serving("gpuwarden-e2e-ca")
        client_ca = new_ca(common_name="gpuwarden-e2e-client-ca", valid_for=timedelta(days=2))
        admin = issue_client(
            client_ca,
            common_name="admin",
            organizations=["system:masters"],
            valid_for=timedelta(days=1),
        )
        self._ca = ca
        paths: dict[str, Path] = {}
        paths["ca.crt"], _ = ca.write(pki, "ca.crt", "ca.key")
        paths["client-ca.crt"], _ = client_ca.write(pki, "client-ca.crt", "client-ca.key")
        paths["apiserver.crt"], paths["apiserver.key"] = serving.write(
            pki, "apiserver.crt", "apiserver.key"
        )
        paths["admin.crt"], paths["admin.key"] = admin.write(pki, "admin.crt", "admin.key")

        # The service-account token signing key is a bare key pair, not a certificate.
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        paths["sa.key"] = pki / "sa.key"
        paths["sa.pub"] = pki / "sa.pub"
        fd = os.open(paths["sa.key"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(
                sa_key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        paths["sa.pub"].write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM,
                serialization.PublicFormat.SubjectPublicKeyInfo,
            )
        )
        return paths

    def spawn(self, name: str, argv: Sequence[str]) -> Process:
        """Start ``argv`` in the work directory, logging to logs/<name>.log; stop() ends it
        (newest first, so what talks to the API server goes before the API server)."""
        log_path = self.workdir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = log_path.open("ab")
        log_file.write(f"$ {' '.join(argv)}\n".encode())
        log_file.flush()
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            preexec_fn=die_with_parent,
        )
        process = Process(name=name, popen=popen, log_path=log_path, log_file=log_file)
        self._processes.append(process)
        return process

    def _launch(self, certs: dict[str, Path]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        etcd_client_port, etcd_peer_port, apiserver_port = free_ports(3)
        self._etcd_url = f"http://127.0.0.1:{etcd_client_port}"
        peer_url = f"http://127.0.0.1:{etcd_peer_port}"
        data_dir = self.workdir / "etcd-data"
        shutil.rmtree(data_dir, ignore_errors=True)
        etcd = self.spawn(
            "etcd",
            [
                str(self.tools.etcd),
                "--name=gpuwarden-e2e",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={self._etcd_url}",
                f"--advertise-client-urls={self._etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=gpuwarden-e2e={peer_url}",
                "--initial-cluster-state=new",
                # Throwaway data: skip fsync, it dominates etcd latency on small VMs.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self.poll("etcd /health", self._etcd_healthy, [etcd], deadline)

        self._server_url = f"https://127.0.0.1:{apiserver_port}"
        apiserver = self.spawn(
            "kube-apiserver",
            [
                str(self.tools.kube_apiserver),
                f"--etcd-servers={self._etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={apiserver_port}",
                f"--cert-dir={self.workdir / 'apiserver-cert-dir'}",
                f"--tls-cert-file={certs['apiserver.crt']}",
                f"--tls-private-key-file={certs['apiserver.key']}",
                f"--client-ca-file={certs['client-ca.crt']}",
                f"--service-account-key-file={certs['sa.pub']}",
                f"--service-account-signing-key-file={certs['sa.key']}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=RBAC",
                f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
                # No kube-controller-manager runs here, so nothing creates the "default"
                # ServiceAccount in new namespaces; the ServiceAccount admission plugin would
                # reject every pod with "serviceaccount default not found".
                "--disable-admission-plugins=ServiceAccount",
                "--service-cluster-ip-range=10.0.0.0/24",
                # Endpoints may not hold loopback addresses, so the reconciler for the
                # "kubernetes" Service would only log validation errors against 127.0.0.1.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                *self.extra_apiserver_args,
            ],
        )
        self.poll(
            "kube-apiserver /readyz", self._apiserver_ready(certs), [etcd, apiserver], deadline
        )

    def _etcd_healthy(self) -> bool:
        with urllib.request.urlopen(f"{self._etcd_url}/health", timeout=2) as response:
            status: int = response.status
        return status == 200

    def _apiserver_ready(self, certs: dict[str, Path]) -> Callable[[], bool]:
        context = ssl.create_default_context(cafile=str(certs["ca.crt"]))
        context.load_cert_chain(str(certs["admin.crt"]), str(certs["admin.key"]))

        def probe() -> bool:
            url = f"{self._server_url}/readyz"
            with urllib.request.urlopen(url, timeout=5, context=context) as response:
                status: int = response.status
            return status == 200

        return probe

    def poll(
        self,
        what: str,
        probe: Callable[[], bool],
        watched: Sequence[Process],
        deadline: float,
    ) -> None:
        """Call ``probe`` until it is true; ControlPlaneError if a watched process exits or the
        deadline (a time.monotonic() value) passes, with the processes' log tails."""
        last_error = "no answer yet"
        while True:
            for process in watched:
                code = process.popen.poll()
                if code is not None:
                    tail = process.tail()
                    raise ControlPlaneError(
                        f"{process.name} exited with status {code} while waiting for {what}; "
                        f"log {process.log_path}:\n{tail}",
                        port_conflict=_PORT_IN_USE in tail,
                    )
            try:
                if probe():
                    return
            except urllib.error.HTTPError as exc:
                body = exc.read().decode(errors="replace")
                last_error = f"HTTP {exc.code}: {body[-2000:]}"
            except OSError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                tails = "\n".join(
                    f"--- {p.name} ({p.log_path}) ---\n{p.tail()}" for p in self._processes
                )
                raise ControlPlaneError(
                    f"timed out waiting for {what}; last error: {last_error}\n{tails}"
                )
            time.sleep(_POLL_INTERVAL)

    def _write_kubeconfig(self, certs: dict[str, Path]) -> None:
        self._write_user_kubeconfig(
            self.kubeconfig_path, "admin", certs["admin.crt"].read_bytes(),
            certs["admin.key"].read_bytes(),
        )  # fmt: skip

    def write_kubeconfig_for(
        self, path: Path, user: str, *, organizations: Sequence[str] = ()
    ) -> Path:
        """A kubeconfig authenticating as ``user`` with a client certificate from this plane's
        client CA (x509: the CN is the user, each O a group); RBAC decides what it may do."""
        pki = self.workdir / "pki"
        pair = issue_client(
            KeyPair.read(pki / "client-ca.crt", pki / "client-ca.key"),
            common_name=user,
            organizations=list(organizations),
            valid_for=timedelta(days=1),
        )
        self._write_user_kubeconfig(path, user, pair.cert_pem, pair.key_pem)
        return path

    def _write_user_kubeconfig(self, path: Path, user: str, cert: bytes, key: bytes) -> None:
        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpuwarden-e2e",
                    "cluster": {
                        "server": self.server_url,
                        "certificate-authority-data": b64(self.ca.cert_pem),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)},
                }
            ],
            "contexts": [
                {"name": "gpuwarden-e2e", "context": {"cluster": "gpuwarden-e2e", "user": user}}
            ],
            "current-context": "gpuwarden-e2e",
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            yaml.safe_dump(config, handle, sort_keys=False)
