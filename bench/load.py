"""Load benchmark: `gpuwarden serve` against a bare aiohttp HTTPS handler, in the same run.

Drives both the way the API server does: HTTPS with keep-alive, concurrent AdmissionReviews of
the Kubeflow pods in examples/ (each pod's /mutate review, then /validate of the mutated pod).
The baseline parses the review and answers "allowed": the stack's floor on this machine.

* servers pinned to CPU 0 (one worker on one core), the client to CPU 1 where there are two;
* fixed offered loads (open loop: requests are sent on schedule and latency counts from the
  scheduled time, so a slow server cannot hide its queue), then the maximum sustained
  throughput (closed loop, many connections), for both servers, then `--workers 2`;
* wrk (Debian package) measures the maximum throughput too, when installed;
* gpuwarden with every decision precomputed (looked up by request uid) splits gpuwarden's time
  per request into its stack (decoding, encoding, metrics, the log line) and its deciding.

Run: `python bench/load.py` (about 1-2 minutes); `--quick` for a shorter run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwarden.certs.rotation import ServingNames, issue_directory  # noqa: E402
from gpuwarden.kube.cluster import load_manifests  # noqa: E402
from gpuwarden.policy import AdmissionRequest, ClusterView, load_paths  # noqa: E402
from gpuwarden.policy.admission.mutate import mutate  # noqa: E402
from gpuwarden.policy.admission.pipeline import apply_patch  # noqa: E402

TARGET_RATIO = 0.7
TARGET_P99_MS = 5.0
TARGET_RATE = 500
TARGET_RSS_MIB = 80


# --- the baseline server ---------------------------------------------------------------------


def baseline_server(port: int, cert: str, key: str, max_body: int = 1024**2) -> None:
    """A bare aiohttp HTTPS handler: parse the review, answer allowed (reviews up to
    ``max_body`` bytes, aiohttp's default 1 MiB unless told).

    It parses and encodes with orjson, as gpuwarden does, so the ratio measures gpuwarden's
    own work and not a choice of JSON library.
    """
    import orjson
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        answer = {
            "apiVersion": data["apiVersion"],
            "kind": "AdmissionReview",
            "response": {"uid": data["request"]["uid"], "allowed": True},
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    app = web.Application(client_max_size=max_body)
    app.add_routes(
        [web.post("/mutate", handle), web.post("/validate", handle), web.get("/healthz", healthz)]
    )
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=ctx, access_log=None, print=None)


def precomputed_server(port: int, cert: str, key: str) -> None:
    """`gpuwarden serve` as the benchmark runs it, except that each distinct review's decision is
    computed once (by the same policy core) and then looked up: gpuwarden's own stack (decoding,
    the pod-shape check, encoding, metrics, the log line) without the per-request policy work.
    """
    from gpuwarden.policy import Decision
    from gpuwarden.webhook import logs
    from gpuwarden.webhook.decide import Endpoint, decide
    from gpuwarden.webhook.review import Review
    from gpuwarden.webhook.server import ServeConfig, WebhookServer

    class Precomputed(WebhookServer):
        async def start(self) -> None:
            await super().start()
            context = self.context
            assert context is not None
            decisions: dict[tuple[Endpoint, str], Decision] = {}

            def evaluate(endpoint: Endpoint, review: Review) -> Decision:
                key = (endpoint, review.uid)
                if key not in decisions:
                    state = context.reloader.state
                    decisions[key] = decide(
                        endpoint, review, state.policies, context.cluster.view()
                    )
                return decisions[key]

            context.evaluate = evaluate

    logs.configure("info")
    config = ServeConfig(
        policies=(ROOT / "policies",),
        host="127.0.0.1",
        port=port,
        metrics_port=None,
        tls_cert=Path(cert),
        tls_key=Path(key),
        namespaces_file=ROOT / "examples" / "namespaces.yaml",
    )
    asyncio.run(Precomputed(config).run())


# --- the client ------------------------------------------------------------------------------


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, ctx: ssl.SSLContext) -> Connection:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
        )
        return cls(reader, writer)

    async def post(self, request: bytes) -> int:
        self.writer.write(request)
        status_line = await self.reader.readuntil(b"\r\n")
        headers = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in headers.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)
        return int(status_line.split()[1])

    def close(self) -> None:
        self.writer.close()


def http_request(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: gpuwarden\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@dataclass
class Result:
    label: str
    offered: float | None  # req/s; None for closed loop
    sent: int
    failed: int
    seconds: float
    latencies: list[float]
    client_cpu: float  # fraction of one core the client used

    @property
    def rate(self) -> float:
        return (self.sent - self.failed) / self.seconds

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def open_loop(
    port: int,
    ctx: ssl.SSLContext,
    requests: Sequence[bytes],
    rate: float,
    seconds: float,
    label: str,
) -> Result:
    """Send at a fixed rate; latency counts from each request's scheduled time.

    A fixed pool of keep-alive connections, as the API server keeps: a request whose turn has
    come waits for a free connection, and that wait counts in its latency.
    """
    pool = [await Connection.open(port, ctx) for _ in range(32)]
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for conn in pool:
        idle.put_nowait(conn)
    latencies: list[float] = []
    failed = 0
    total = int(rate * seconds)
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    cpu0 = _cpu()

    async def one(i: int, at: float) -> None:
        nonlocal failed
        conn = await idle.get()
        try:
            status = await conn.post(requests[i % len(requests)])
        except (OSError, asyncio.IncompleteReadError):
            failed += 1
            idle.put_nowait(await Connection.open(port, ctx))
            return
        latencies.append(loop.time() - at)
        if status != 200:
            failed += 1
        idle.put_nowait(conn)

    tasks = []
    for i in range(total):
        at = start + i / rate
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i, at)))
    await asyncio.gather(*tasks)
    elapsed = loop.time() - start
    cpu = (_cpu() - cpu0) / elapsed
    while not idle.empty():
        idle.get_nowait().close()
    return Result(label, rate, total, failed, elapsed, latencies, cpu)


async def closed_loop(
    port: int,
    ctx: ssl.SSLContext,
    requests: Sequence[bytes],
    connections: int,
    seconds: float,
    label: str,
) -> Result:
    """As fast as the server answers, over many keep-alive connections."""
    conns = [await Connection.open(port, ctx) for _ in range(connections)]
    latencies: list[float] = []
    failed = 0
    sent = 0
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    cpu0 = _cpu()
    begin = loop.time()

    async def drive(conn: Connection, offset: int) -> None:
        nonlocal sent, failed
        i = offset
        while loop.time() < stop_at:
            t = loop.time()
            status = await conn.post(requests[i % len(requests)])
            latencies.append(loop.time() - t)
            sent += 1
            if status != 200:
                failed += 1
            i += 1

    await asyncio.gather(*(drive(c, n * 7) for n, c in enumerate(conns)))
    elapsed = loop.time() - begin
    cpu = (_cpu() - cpu0) / elapsed
    for conn in conns:
        conn.close()
    return Result(label, None, sent, failed, elapsed, latencies, cpu)


async def counted_loop(
    port: int, ctx: ssl.SSLContext, requests: Sequence[bytes], connections: int, count: int
) -> int:
    """Exactly ``count`` reviews over keep-alive connections; returns how many failed."""
    conns = [await Connection.open(port, ctx) for _ in range(connections)]
    left = count
    failed = 0

    async def drive(conn: Connection, offset: int) -> None:
        nonlocal left, failed
        i = offset
        while left > 0:
            left -= 1
            if await conn.post(requests[i % len(requests)]) != 200:
                failed += 1
            i += 1

    await asyncio.gather(*(drive(c, n * 7) for n, c in enumerate(conns)))
    for conn in conns:
        conn.close()
    return failed


def rss_mib(pid: int) -> float:
    """Resident set size of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def memory_curve(
    pid: int, port: int, ctx: ssl.SSLContext, requests: Sequence[bytes], total: int, step: int
) -> list[tuple[int, float]]:
    """(reviews answered, RSS MiB) at the start and after every ``step`` reviews."""
    curve = [(0, rss_mib(pid))]
    for done in range(step, total + 1, step):
        failed = asyncio.run(counted_loop(port, ctx, requests, 16, step))
        if failed:
            raise SystemExit(f"{failed} reviews failed during the memory run")
        curve.append((done, rss_mib(pid)))
    return curve


# --- setup -----------------------------------------------------------------------------------


def example_reviews() -> list[bytes]:
    """/mutate of each example pod, then /validate of the pod the mutation produced."""
    policies = load_paths([ROOT / "policies"])
    cluster: ClusterView = load_manifests(ROOT / "examples" / "namespaces.yaml")
    out: list[bytes] = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "Pod":
                continue
            namespace = doc.get("metadata", {}).get("namespace", "default")
            decision = mutate(AdmissionRequest("CREATE", namespace, doc), policies, cluster)
            mutated = apply_patch(doc, decision)
            for path_, pod in (("/mutate", doc), ("/validate", mutated)):
                review = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {
                        "uid": f"bench-{len(out)}",
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": namespace,
                        "operation": "CREATE",
                        "userInfo": {"username": "system:serviceaccount:kubeflow:pipeline-runner"},
                        "object": pod,
                        "dryRun": False,
                    },
                }
                out.append(http_request(path_, json.dumps(review).encode()))
    if not out:
        raise SystemExit("no example pods found in examples/")
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pin(cpus: set[int] | None) -> Any:
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    return pin


@contextlib.contextmanager
def started(
    argv: Sequence[str],
    port: int,
    ctx: ssl.SSLContext,
    cpus: set[int] | None,
    log: Path,
    *,
    tree: Path = ROOT,
    up_within: float = 60,
) -> Iterator[subprocess.Popen[bytes]]:
    """A server process, once its /healthz answers; SIGTERM on leaving. ``tree``: the source
    tree it runs from (its working directory and, when not this one, its PYTHONPATH)."""
    env = None if tree == ROOT else dict(os.environ, PYTHONPATH=str(tree))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_pin(cpus), cwd=tree, env=env
        )
        try:
            deadline = time.monotonic() + up_within
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"server exited: {log.read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(
                        f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=1
                    ):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"server not up: {log.read_text()[-2000:]}") from None
                    time.sleep(0.1)
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def wrk_max(port: int, request: bytes, seconds: int, connections: int) -> float | None:
    """Requests/s that wrk (C, epoll) gets from one /mutate review, when wrk is installed."""
    if shutil.which("wrk") is None:
        return None
    head, _, body = request.partition(b"\r\n\r\n")
    path = head.split(b" ")[1].decode()
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {json.dumps(body.decode())}\n"
        )
    try:
        out = subprocess.run(
            [
                "wrk",
                "-t1",
                f"-c{connections}",
                f"-d{seconds}s",
                "-s",
                script.name,
                f"https://127.0.0.1:{port}{path}",
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 30,
            preexec_fn=_pin({1} if os.cpu_count() and os.cpu_count() > 1 else None),  # type: ignore[operator]
        )
    finally:
        os.unlink(script.name)
    for line in out.stdout.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    return None


# --- main ------------------------------------------------------------------------------------


def row(r: Result) -> str:
    offered = f"{r.offered:>7.0f}" if r.offered else "    max"
    return (
        f"{r.label:<22} {offered} {r.rate:>9.0f} {r.pct(0.50):>8.2f} {r.pct(0.99):>8.2f} "
        f"{r.failed:>6} {r.client_cpu * 100:>8.0f}%"
    )


async def measure(
    port: int,
    ctx: ssl.SSLContext,
    requests: Sequence[bytes],
    label: str,
    rates: Sequence[int],
    seconds: float,
    max_seconds: float,
) -> list[Result]:
    # Warm up: connections, caches, the JIT-less interpreter's first calls.
    await closed_loop(port, ctx, requests, 8, 0.5, "warmup")
    results = [await open_loop(port, ctx, requests, rate, seconds, label) for rate in rates]
    results.append(await closed_loop(port, ctx, requests, 32, max_seconds, label))
    return results


@dataclass(frozen=True)
class Phases:
    """How long each phase runs, and the offered loads."""

    seconds: float
    max_seconds: float
    wrk_seconds: int
    reviews_total: int
    rates: tuple[int, ...] = (250, 500, 1000, 2000)

    @classmethod
    def of(cls, quick: bool) -> Phases:
        if quick:
            return cls(seconds=1.5, max_seconds=2.0, wrk_seconds=2, reviews_total=20_000)
        return cls(seconds=3.0, max_seconds=4.0, wrk_seconds=4, reviews_total=100_000)


@dataclass(frozen=True)
class Measured:
    """Every figure of a run: the table, wrk's maxima and the memory curve."""

    table: list[Result]
    wrk: dict[str, float | None]
    memory: list[tuple[int, float]]


def gpuwarden_argv(port: int, workers: int, cert: str, key: str) -> list[str]:
    return [
        sys.executable, "-m", "gpuwarden", "serve", "--policies", str(ROOT / "policies"),
        "--namespaces", str(ROOT / "examples" / "namespaces.yaml"),
        "--tls-cert", cert, "--tls-key", key, "--host", "127.0.0.1", "--port", str(port),
        "--metrics-port", "-1", "--workers", str(workers),
    ]  # fmt: skip


def closed_loop_max(
    port: int, ctx: ssl.SSLContext, requests: Sequence[bytes], label: str, seconds: float
) -> Result:
    """The maximum sustained throughput (32 connections) after a short warm-up."""
    asyncio.run(closed_loop(port, ctx, requests, 8, 0.5, "warmup"))
    return asyncio.run(closed_loop(port, ctx, requests, 32, seconds, label))


def measure_servers(
    requests: Sequence[bytes], phases: Phases, server_cpus: set[int] | None, work: Path
) -> Measured:
    """The baseline, gpuwarden, its memory, gpuwarden with decisions precomputed, two workers."""
    certs = issue_directory(work / "certs", ServingNames(("localhost",), ("127.0.0.1",)))
    ctx = ssl.create_default_context(cafile=str(certs.ca_cert))
    cert, key = str(certs.tls_cert), str(certs.tls_key)
    py = sys.executable
    table: list[Result] = []
    wrk: dict[str, float | None] = {}
    loads = (phases.rates, phases.seconds, phases.max_seconds)
    port = free_port()
    baseline = [py, __file__, "--baseline-server", str(port), cert, key]
    with started(baseline, port, ctx, server_cpus, work / "baseline.log"):
        table += asyncio.run(measure(port, ctx, requests, "baseline (1 core)", *loads))
        wrk["baseline"] = wrk_max(port, requests[0], phases.wrk_seconds, 32)
    port = free_port()
    argv = gpuwarden_argv(port, 1, cert, key)
    with started(argv, port, ctx, server_cpus, work / "gpuwarden.log"):
        table += asyncio.run(measure(port, ctx, requests, "gpuwarden (1 core)", *loads))
        wrk["gpuwarden"] = wrk_max(port, requests[0], phases.wrk_seconds, 32)
    # Memory per replica on a fresh server: RSS as reviews accumulate (flat is the target).
    port = free_port()
    argv = gpuwarden_argv(port, 1, cert, key)
    with started(argv, port, ctx, server_cpus, work / "memory.log") as proc:
        total = phases.reviews_total
        memory = memory_curve(proc.pid, port, ctx, requests, total, total // 10)
    port = free_port()
    precomputed = [py, __file__, "--precomputed-server", str(port), cert, key]
    with started(precomputed, port, ctx, server_cpus, work / "precomputed.log"):
        label = "decisions precomputed"
        table.append(closed_loop_max(port, ctx, requests, label, phases.max_seconds))
    port = free_port()
    with started(gpuwarden_argv(port, 2, cert, key), port, ctx, None, work / "gpuwarden2.log"):
        label = "gpuwarden --workers 2"
        table.append(closed_loop_max(port, ctx, requests, label, phases.max_seconds))
        wrk["workers2"] = wrk_max(port, requests[0], phases.wrk_seconds, 32)
    return Measured(table, wrk, memory)


def print_table(requests: Sequence[bytes], table: Sequence[Result]) -> None:
    print(
        f"\n{len(requests)} distinct AdmissionReviews (/mutate and /validate of {len(requests) // 2} example pods), "
        f"{os.cpu_count()} CPUs; servers on CPU 0, client on CPU 1\n"
    )
    print(
        f"{'server':<22} {'offered':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'failed':>6} {'client CPU':>9}"
    )
    for result in table:
        print(row(result))


def print_throughput(table: Sequence[Result]) -> None:
    """Throughput against the baseline, p99 at the target rate, time per request, two workers."""
    base = next(r for r in table if r.offered is None and r.label.startswith("baseline"))
    ours = next(r for r in table if r.offered is None and r.label.startswith("gpuwarden (1"))
    two = table[-1]
    precomputed = next(r for r in table if r.label == "decisions precomputed")
    at_target = next(
        r for r in table if r.label.startswith("gpuwarden (1") and r.offered == TARGET_RATE
    )
    ratio = ours.rate / base.rate
    print()
    print(
        f"max sustained throughput: gpuwarden {ours.rate:.0f} req/s, baseline {base.rate:.0f} req/s, "
        f"ratio {ratio:.2f} (target >= {TARGET_RATIO})"
    )
    print(
        f"p99 at {TARGET_RATE} req/s: {at_target.pct(0.99):.2f} ms (target <= {TARGET_P99_MS} ms)"
    )
    # One core saturated: its time per request is the inverse of the rate.
    floor, stack, full = (1e6 / r.rate for r in (base, precomputed, ours))
    print(
        f"server core time per request: baseline {floor:.0f} us; gpuwarden with its decisions "
        f"precomputed {stack:.0f} us (ratio {precomputed.rate / base.rate:.2f}); gpuwarden "
        f"{full:.0f} us, so deciding (pod-shape check and policy core) takes {full - stack:.0f} us"
    )
    print(
        f"--workers 2: {two.rate:.0f} req/s, {two.rate / ours.rate:.2f}x one worker "
        f"(on {os.cpu_count()} CPUs the client shares those cores: scaling cannot show here)"
    )


def print_memory_and_wrk(
    memory: Sequence[tuple[int, float]], wrk: Mapping[str, float | None]
) -> None:
    first, last = memory[1][1], memory[-1][1]
    print(
        f"RSS of one worker: {memory[0][1]:.1f} MiB at start, {first:.1f} MiB after "
        f"{memory[1][0]:,} reviews, {last:.1f} MiB after {memory[-1][0]:,} "
        f"(growth {last - first:+.1f} MiB; target <= {TARGET_RSS_MIB} MiB and flat)"
    )
    print("  " + ", ".join(f"{done // 1000}k: {mib:.1f}" for done, mib in memory))
    if wrk["baseline"] and wrk["gpuwarden"]:
        print(
            f"wrk -t1 -c32 (one /mutate review): gpuwarden {wrk['gpuwarden']:.0f} req/s, baseline "
            f"{wrk['baseline']:.0f} req/s, ratio {wrk['gpuwarden'] / wrk['baseline']:.2f}; "
            f"--workers 2 {wrk['workers2'] or 0:.0f} req/s"
        )


def print_busy_client(table: Sequence[Result]) -> None:
    busy = [r for r in table if r.client_cpu > 0.9]
    if busy:
        print(
            "note: the client used >90% of its core in: "
            + ", ".join(sorted({f"{r.label} @ {r.offered or 'max'}" for r in busy}))
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases")
    for hidden in ("--baseline-server", "--precomputed-server"):
        parser.add_argument(
            hidden, nargs=3, metavar=("PORT", "CERT", "KEY"), help=argparse.SUPPRESS
        )
    args = parser.parse_args()
    if args.baseline_server:
        port, cert, key = args.baseline_server
        baseline_server(int(port), cert, key)
        return 0
    if args.precomputed_server:
        port, cert, key = args.precomputed_server
        precomputed_server(int(port), cert, key)
        return 0
    two_cores = (os.cpu_count() or 1) > 1
    server_cpus, client_cpus = ({0}, {1}) if two_cores else (None, None)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    requests = example_reviews()
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        measured = measure_servers(requests, Phases.of(args.quick), server_cpus, Path(tmp))
    print_table(requests, measured.table)
    print_throughput(measured.table)
    print_memory_and_wrk(measured.memory, measured.wrk)
    print_busy_client(measured.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
