"""The load: closed-loop clients creating pods with dryRun=All through the kubernetes client,
spread over processes, and the CPU each group of processes spends in the measured window."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.apiserver_pods import Obj
from bench.apiserver_stats import RunStats, pooled


@dataclass(frozen=True)
class Window:
    """Wall-clock (time.time) bounds of one run, shared by every client process."""

    start: float  # the warm-up begins
    measure_from: float
    until: float


def _client_thread(
    kubeconfig: str,
    pods: Sequence[Obj],
    offset: int,
    window: Window,
    latencies: list[float],
    errors: list[int],
) -> None:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException

    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    api = k8s_client.ApiClient(configuration)
    core: Any = k8s_client.CoreV1Api(api)
    i = offset
    try:
        while time.time() < window.start:
            time.sleep(0.001)
        while True:
            pod = pods[i % len(pods)]
            i += 1
            began = time.time()
            if began >= window.until:
                break
            ok = True
            t0 = time.perf_counter()
            try:
                response = core.create_namespaced_pod(
                    pod["metadata"]["namespace"], pod, dry_run="All", _preload_content=False
                )
                _ = response.data
                response.release_conn()
                ok = response.status == 201
            except ApiException:
                ok = False
            elapsed_ms = (time.perf_counter() - t0) * 1000.0
            if began >= window.measure_from and time.time() <= window.until:
                if ok:
                    latencies.append(elapsed_ms)
                else:
                    errors.append(1)
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _client_process(
    kubeconfig: str, pods: list[Obj], threads: int, first: int, window: Window
) -> tuple[list[float], int]:
    """``threads`` closed-loop clients in one process; their latencies (ms) and error count."""
    latencies: list[float] = []
    errors: list[int] = []
    workers = [
        threading.Thread(
            target=_client_thread,
            args=(kubeconfig, pods, first + t, window, latencies, errors),
            daemon=True,
        )
        for t in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=window.until - time.time() + 60.0)
    return latencies, len(errors)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a live process (0 for one that has gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name may hold spaces and parentheses; the fields follow the last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def pids_with(needle: str) -> list[int]:
    """Processes whose command line contains ``needle``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            out.append(int(entry.name))
    return out


def cpu_snapshot(groups: Mapping[str, Callable[[], Sequence[int]]]) -> dict[str, float]:
    return {name: sum(process_cpu_seconds(pid) for pid in pids()) for name, pids in groups.items()}


def split_clients(clients: int, processes: int) -> list[int]:
    """Threads per process, as even as possible, no process without a thread."""
    processes = max(1, min(processes, clients))
    base, extra = divmod(clients, processes)
    return [base + (1 if p < extra else 0) for p in range(processes)]


def measure(
    peer: str,
    clients: int,
    *,
    kubeconfig: Path,
    pods: list[Obj],
    duration: float,
    warmup: float,
    processes: int,
    pool: Any,
    groups: Mapping[str, Callable[[], Sequence[int]]] | None = None,
) -> RunStats:
    """One closed-loop run of ``clients`` concurrent creators; only the measured window counts."""
    # Time for every pool process to receive its task and connect before the warm-up begins.
    start = time.time() + 0.5
    window = Window(start=start, measure_from=start + warmup, until=start + warmup + duration)
    shares = split_clients(clients, processes)
    firsts = [sum(shares[:p]) for p in range(len(shares))]
    snapshots: list[dict[str, float]] = []

    def watch() -> None:
        # CPU of each group at the start and the end of the measured window.
        for at in (window.measure_from, window.until):
            time.sleep(max(0.0, at - time.time()))
            snapshots.append(cpu_snapshot(groups or {}))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    results = pool.starmap(
        _client_process,
        [
            (str(kubeconfig), pods, n, first, window)
            for n, first in zip(shares, firsts, strict=True)
        ],
    )
    watcher.join(timeout=5.0)
    latencies = tuple(ms for part, _ in results for ms in part)
    errors = sum(e for _, e in results)
    cpu: dict[str, float] = {}
    if len(snapshots) == 2:
        cpu = {g: (snapshots[1][g] - snapshots[0][g]) * 1000.0 for g in snapshots[0]}
    return RunStats(peer, clients, duration, latencies, errors, cpu)


@dataclass(frozen=True)
class Runner:
    """measure() with what every run of one benchmark shares: the API server, the client pool,
    the warm-up, the client processes and the groups of processes whose CPU is counted."""

    kubeconfig: Path
    pool: Any
    warmup: float
    processes: int
    groups: Mapping[str, Callable[[], Sequence[int]]] | None = None

    def __call__(self, peer: str, clients: int, duration: float, pods: list[Obj]) -> RunStats:
        return measure(
            peer,
            clients,
            groups=self.groups,
            kubeconfig=self.kubeconfig,
            pods=pods,
            duration=duration,
            warmup=self.warmup,
            processes=self.processes,
            pool=self.pool,
        )


def interleaved(
    runner: Runner,
    clients: int,
    duration: float,
    rounds: int,
    *,
    control: tuple[str, list[Obj]],
    hooked: tuple[str, list[Obj]],
) -> tuple[RunStats, RunStats]:
    """A webhook's ``duration`` in ``rounds`` runs, each after a control run of the same pods in
    a namespace no webhook serves, so both see the same machine; each side pooled."""
    part = duration / rounds
    controls, hooked_runs = [], []
    for _ in range(rounds):
        controls.append(runner(control[0], clients, part, control[1]))
        hooked_runs.append(runner(hooked[0], clients, part, hooked[1]))
    return pooled(controls), pooled(hooked_runs)
