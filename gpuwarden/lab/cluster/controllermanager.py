"""kube-controller-manager on a lab control plane, running only the controllers a suite names.

``hack/build-tools.sh`` builds it from the Kubernetes module the API server comes from. The lab
runs it for batch/v1 Jobs (Katib's trials): the Job controller (kubernetes
pkg/controller/job/job_controller.go) creates a Job's pods once Kueue unsuspends it. It runs
with the admin kubeconfig (``--use-service-account-credentials`` is off by default), no leader
election, its secure port on loopback with a self-signed certificate in the work directory;
``/healthz`` is one of ``--authorization-always-allow-paths``' defaults, so it answers without
credentials.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gpuwarden.lab.cluster.controlplane import (
    ControlPlane,
    Process,
    Tools,
    ToolsMissingError,
    free_ports,
    self_signed_ok,
)

#: The controllers the lab runs by default (cmd/kube-controller-manager/names/controller_names.go):
#: Jobs' pods, and the garbage collector that deletes them (and Kueue's Workloads) with their Job.
JOB_CONTROLLERS = ("job-controller", "garbage-collector-controller")


@dataclass
class ControllerManager:
    """kube-controller-manager on ``plane`` (started already): start() and stop() it."""

    plane: ControlPlane
    tools: Tools
    controllers: Sequence[str] = JOB_CONTROLLERS
    startup_timeout: float = 90.0

    def __post_init__(self) -> None:
        self._process: Process | None = None

    def start(self) -> None:
        binary = self.tools.kube_controller_manager
        if binary is None:
            raise ToolsMissingError(
                "tools.env names no KUBE_CONTROLLER_MANAGER; run hack/build-tools.sh (it builds "
                "kube-controller-manager for the Job controller)"
            )
        workdir = self.plane.workdir
        (port,) = free_ports(1)
        self._process = self.plane.spawn(
            "kube-controller-manager",
            [
                str(binary),
                f"--kubeconfig={self.plane.kubeconfig_path}",
                f"--controllers={','.join(self.controllers)}",
                "--leader-elect=false",
                # The lab replays a week in minutes: at the default 20 requests/s the
                # resourceclaim controller's claims lag their pods by seconds (simulated
                # half-hours). As the lab's kube-scheduler (schedulinglab.scheduler_configuration).
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={workdir / 'kube-controller-manager-certs'}",
                "-v=1",
            ],
        )
        self.plane.poll(
            "kube-controller-manager /healthz",
            lambda: self_signed_ok(f"https://127.0.0.1:{port}/healthz"),
            [self._process],
            time.monotonic() + self.startup_timeout,
        )

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate(self.plane.stop_timeout)
            self._process = None


@contextlib.contextmanager
def running_controller_manager(
    plane: ControlPlane, tools: Tools, controllers: Sequence[str] = JOB_CONTROLLERS
) -> Iterator[ControllerManager]:
    manager = ControllerManager(plane, tools, controllers)
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()
