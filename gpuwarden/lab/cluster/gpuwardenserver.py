"""``gpuwarden serve`` as a subprocess against a lab control plane: its certificate directory,
``--kubeconfig``, JSON log and /metrics, and the polling the stack's other parts share.

The lab runs no gpuwarden service in its own process (``.importlinter``); this starts one beside
it, as a cluster would run the chart's Deployment.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.lab.cluster.controlplane import (
    REPO_ROOT,
    die_with_parent,
    free_ports,
    json_log_records,
)

Obj = dict[str, Any]
T = TypeVar("T")

POLICIES_DIR = REPO_ROOT / "policies"

_POLL = 0.05
_LOG_TAIL = 60


def model(cls: Any, data: Mapping[str, Any]) -> Any:
    """A kubernetes client model from wire-format data (its from_dict, never None here)."""
    built = cls.from_dict(dict(data))
    if built is None:
        raise WebhookStackError(f"{cls.__name__}.from_dict returned None for {data!r}")
    return built


class WebhookStackError(AssertionError):
    """Something the stack needed did not happen in time (the message says what).

    An AssertionError: in a test, a stack that does not come up is a failed expectation.
    """


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 15.0) -> T:
    """Poll ``probe`` until it returns something other than None (or False), within a deadline."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:
            result = probe()
        except (ApiException, OSError) as exc:
            result = None
            last_error = f"; last error: {type(exc).__name__}: {str(exc)[:500]}"
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise WebhookStackError(f"timed out after {timeout:g}s waiting for {what}{last_error}")
        time.sleep(_POLL)


# --- certificates ----------------------------------------------------------------------------


def presented_certificate(port: int, cafile: Path) -> bytes:
    """The DER certificate a TLS server on 127.0.0.1:port presents (verified against cafile)."""
    context = ssl.create_default_context(cafile=str(cafile))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    if der is None:
        raise WebhookStackError(f"127.0.0.1:{port} presented no certificate")
    return der


# --- the server process ------------------------------------------------------------------------


@dataclass
class GpuwardenServer:
    """``gpuwarden serve`` as a subprocess on loopback, with a self-managed certificate directory.

    The HTTPS port stays the same across stop() and start(), so the webhook configurations that
    point at it keep pointing at it.
    """

    workdir: Path
    kubeconfig: Path
    policies: Sequence[Path] = (POLICIES_DIR,)
    failure_mode: str | None = None
    extra_args: Sequence[str] = ()
    startup_timeout: float = 60.0
    port: int = 0
    metrics_port: int = 0
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.port or not self.metrics_port:
            self.port, self.metrics_port = free_ports(2)

    @property
    def cert_dir(self) -> Path:
        return self.workdir / "certs"

    @property
    def ca_bundle_path(self) -> Path:
        return self.cert_dir / "ca.crt"

    @property
    def log_path(self) -> Path:
        return self.workdir / "gpuwarden.log"

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "gpuwarden", "serve"]
        for path in self.policies:
            argv += ["--policies", str(path)]
        argv += [
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--metrics-port={self.metrics_port}",
            f"--cert-dir={self.cert_dir}",
            f"--kubeconfig={self.kubeconfig}",
            # Certificate and policy files are checked this often (the rotation test waits on it).
            "--reload-interval=0.2",
            "--shutdown-timeout=5",
        ]
        if self.failure_mode is not None:
            argv.append(f"--failure-mode={self.failure_mode}")
        return argv + list(self.extra_args)

    def start(self) -> None:
        if self.running:
            raise RuntimeError("gpuwarden serve is already running")
        self._log = self.log_path.open("ab")
        self._popen = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # Killed with the test process, should that die without stopping it.
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer yet"
        while True:
            code = self._popen.poll()
            if code is not None:
                raise WebhookStackError(
                    f"gpuwarden serve exited with status {code} before it was ready:\n{self.tail()}"
                )
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=2
                ) as response:
                    if response.status == 200:
                        break
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read().decode(errors='replace')}"
            except OSError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                self.kill()
                raise WebhookStackError(
                    f"gpuwarden serve not ready after {self.startup_timeout:g}s ({last}):\n"
                    f"{self.tail()}"
                )
            time.sleep(_POLL)
        # The admission port answers too (the readiness probe is on the plain-HTTP port).
        presented_certificate(self.port, self.ca_bundle_path)

    def stop(self, *, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Stop the process (SIGTERM: graceful; SIGKILL: as if it crashed) and wait for it."""
        if self._popen is not None:
            if self._popen.poll() is None:
                self._popen.send_signal(sig)
                try:
                    self._popen.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._popen.kill()
                    self._popen.wait(timeout=timeout)
            self._popen = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        self.stop(sig=signal.SIGKILL)

    def tail(self, lines: int = _LOG_TAIL) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    # -- what the server says about itself -------------------------------------------------

    def log_records(self) -> list[Obj]:
        """Every JSON line of the server's log so far (other lines are skipped)."""
        if self._log is not None:
            self._log.flush()
        return json_log_records(self.log_path)

    def admissions(self, *, namespace: str | None = None, pod: str | None = None) -> list[Obj]:
        """The server's "admission" log lines (one per answered review), optionally filtered."""
        return [
            record
            for record in self.log_records()
            if record.get("msg") == "admission"
            and (namespace is None or record.get("namespace") == namespace)
            and (pod is None or record.get("pod") == pod)
        ]

    def awaited_admissions(
        self, count: int, *, namespace: str | None = None, pod: str | None = None
    ) -> list[Obj]:
        """admissions(), once at least ``count`` lines are there: a review's line is flushed
        just after its answer is sent, so a client holding the API server's reply can read the
        log a moment before the line arrives."""

        def enough() -> list[Obj] | None:
            found = self.admissions(namespace=namespace, pod=pod)
            return found if len(found) >= count else None

        return wait_for(f"{count} admission log line(s) for {namespace}/{pod}", enough)

    def metrics(self) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as response:
            text: str = response.read().decode()
        return text

    def sample_sum(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples whose labels include ``labels``."""
        total = 0.0
        for family in text_string_to_metric_families(self.metrics()):
            for sample in family.samples:
                if sample.name != name:
                    continue
                if all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def requests_answered(self, **labels: str) -> float:
        """gpuwarden_admission_requests_total summed over the given labels (endpoint, ...)."""
        return self.sample_sum("gpuwarden_admission_requests_total", **labels)

    def ca_bundle_b64(self) -> str:
        return base64.b64encode(self.ca_bundle_path.read_bytes()).decode()


@contextlib.contextmanager
def running_server(server: GpuwardenServer) -> Iterator[GpuwardenServer]:
    server.start()
    try:
        yield server
    finally:
        server.stop()
