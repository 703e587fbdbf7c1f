"""Served throughput of git revisions side by side: `gpuwarden serve` against the bare echo.

The measure of issue 28: one server process on one core answering a KServe predictor's CREATE
/mutate review over keep-alive TLS, against `bench/load.py`'s bare aiohttp echo with the same
certificates; wrk -t1 -c8 on the other core, the servers taking turns (alternating order each
round), the median of the rounds. Each tree (the working tree, and every ``--before`` revision,
extracted with `git archive` and served from its own tree with its own policies) runs twice: as
served, and with its decisions precomputed (bench/load.py's variant), which splits a request's
time into the stack and deciding.

Besides wrk's requests/s (noisy on a shared machine), each server's CPU time per request is read
from /proc: less disturbed by what else runs, since a server descheduled is not charged. With
``--instructions`` (valgrind installed), each server instead runs under callgrind for a fixed
number of reviews: instructions per review, the same from run to run, for attributing costs.

Run: `python bench/versus.py --before c519861 --before 14439a0` (about a minute per tree);
`--quick` for 2 s phases.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.load import Connection, example_reviews, free_port, started  # noqa: E402
from gpuwarden.certs.rotation import ServingNames, issue_directory  # noqa: E402

CONNECTIONS = 8
SERVER_CPU, CLIENT_CPU = 0, 1


@dataclass
class Server:
    """One server process to measure, and what was measured of it."""

    name: str
    argv: list[str]
    tree: Path
    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    instructions: float | None = None


def kserve_review() -> bytes:
    """The KServe predictor's CREATE /mutate review, as bench/load.py sends it."""
    for request in example_reviews():
        if request.startswith(b"POST /mutate") and b"kserve" in request:
            return request
    raise SystemExit("no KServe predictor in examples/")


def extract(revision: str, into: Path) -> Path:
    """The tree of a git revision, as `git archive` gives it."""
    tree = into / revision.replace("/", "_")
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True
    ).stdout
    with tempfile.TemporaryFile() as tar_file:
        tar_file.write(archive)
        tar_file.seek(0)
        with tarfile.open(fileobj=tar_file) as tar:
            tar.extractall(tree, filter="data")
    return tree


def servers(trees: dict[str, Path], cert: str, key: str) -> list[Server]:
    """The echo, then each tree served and with its decisions precomputed."""
    py = sys.executable
    out = [
        Server(
            "echo", [py, str(ROOT / "bench/load.py"), "--baseline-server", "PORT", cert, key], ROOT
        )
    ]
    for name, tree in trees.items():
        serve = [
            py, "-m", "gpuwarden", "serve", "--policies", str(tree / "policies"),
            "--namespaces", str(tree / "examples/namespaces.yaml"), "--tls-cert", cert,
            "--tls-key", key, "--host", "127.0.0.1", "--port", "PORT", "--metrics-port", "-1",
        ]  # fmt: skip
        out.append(Server(name, serve, tree))
        load = tree / "bench" / "load.py"
        if load.is_file() and "--precomputed-server" in load.read_text():
            out.append(
                Server(
                    f"{name} precomputed",
                    [py, str(load), "--precomputed-server", "PORT", cert, key],
                    tree,
                )
            )
    return out


@contextlib.contextmanager
def running(
    server: Server, ctx: ssl.SSLContext, log: Path, prefix: Sequence[str] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The server on the server core, up, and the port it listens on."""
    port = free_port()
    argv = [*prefix, *(arg.replace("PORT", str(port)) for arg in server.argv)]
    up_within = 300 if prefix else 60  # under valgrind, start-up takes minutes
    with started(argv, port, ctx, {SERVER_CPU}, log, tree=server.tree, up_within=up_within) as proc:
        yield proc, port


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port: int, path: str, script: Path, seconds: int) -> tuple[float, int]:
    """(requests/s, requests answered) of wrk -t1 -c8 on the client core."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "-s", str(script),
         f"https://127.0.0.1:{port}{path}"],
        capture_output=True, text=True, timeout=seconds + 30,
        preexec_fn=lambda: os.sched_setaffinity(0, {CLIENT_CPU}),
    )  # fmt: skip
    if "Non-2xx" in out.stdout:
        raise SystemExit(f"failed requests:\n{out.stdout}")
    rate, count = 0.0, 0
    for line in out.stdout.splitlines():
        if " requests in " in line:
            count = int(line.split()[0])
        if line.startswith("Requests/sec:"):
            rate = float(line.split()[1])
    if not count:
        raise SystemExit(f"wrk said nothing useful:\n{out.stdout}{out.stderr}")
    return rate, count


def measure_rates(
    measured: list[Server], ctx: ssl.SSLContext, request: bytes, rounds: int, seconds: int,
    work: Path,
) -> None:  # fmt: skip
    """All servers up at once (idle ones cost nothing); wrk on each in turn, every round."""
    head, _, body = request.partition(b"\r\n\r\n")
    path = head.split(b" ")[1].decode()
    script = work / "review.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
    )
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(running(s, ctx, work / f"server{i}.log"))
            for i, s in enumerate(measured)
        ]
        for _, port in procs:
            wrk(port, path, script, 1)  # warm up
        for number in range(rounds):
            order = list(range(len(measured)))
            if number % 2:
                order.reverse()
            for i in order:
                proc, port = procs[i]
                before = cpu_seconds(proc.pid)
                rate, count = wrk(port, path, script, seconds)
                measured[i].rates.append(rate)
                measured[i].cpu_us.append((cpu_seconds(proc.pid) - before) / count * 1e6)
            print(
                f"round {number + 1}: "
                + ", ".join(f"{s.name} {s.rates[-1]:.0f}/s" for s in measured),
                file=sys.stderr,
            )


async def counted(pid: int, port: int, ctx: ssl.SSLContext, request: bytes, reviews: int) -> None:
    """``reviews`` reviews over connections opened (and warmed) before counting starts, so that
    the count is of answering reviews, not of TLS handshakes."""
    connections = [await Connection.open(port, ctx) for _ in range(CONNECTIONS)]
    left = CONNECTIONS * 25

    async def drive(connection: Connection) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            if await connection.post(request) != 200:
                raise SystemExit("a review failed")

    await asyncio.gather(*(drive(c) for c in connections))  # warm up
    subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
    left = reviews
    await asyncio.gather(*(drive(c) for c in connections))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    for connection in connections:
        connection.close()


def measure_instructions(
    measured: list[Server], ctx: ssl.SSLContext, request: bytes, reviews: int, work: Path
) -> None:
    """Instructions per review under callgrind, counted only while the reviews are answered."""
    for i, server in enumerate(measured):
        out = work / f"callgrind{i}"
        prefix = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
        ]
        with running(server, ctx, work / f"valgrind{i}.log", prefix) as (proc, port):
            asyncio.run(counted(proc.pid, port, ctx, request, reviews))
        # The dump made on request (the load) is the file with a part number.
        totals = [
            int(line.split()[1])
            for dump in work.glob(f"callgrind{i}.*")
            for line in dump.read_text().splitlines()
            if line.startswith(("summary:", "totals:"))
        ]
        server.instructions = max(totals) / reviews
        print(f"{server.name}: {server.instructions / 1000:.0f}k instructions", file=sys.stderr)


def report(measured: list[Server], request: bytes) -> None:
    echo = measured[0]
    body = len(request.partition(b"\r\n\r\n")[2])
    print(
        f"\nKServe predictor CREATE /mutate ({body} bytes), one server core, wrk -t1 -c{CONNECTIONS}"
    )
    if echo.rates:
        rate0, cpu0 = statistics.median(echo.rates), statistics.median(echo.cpu_us)
        print(
            f"{'server':<28} {'req/s':>7} {'vs echo':>7} {'CPU us/req':>10} {'vs echo':>7}  rounds"
        )
        for s in measured:
            rate, cpu = statistics.median(s.rates), statistics.median(s.cpu_us)
            rounds = " ".join(f"{r:.0f}" for r in s.rates)
            print(
                f"{s.name:<28} {rate:>7.0f} {rate / rate0:>7.2f} {cpu:>10.0f} {cpu0 / cpu:>7.2f}  {rounds}"
            )
    if echo.instructions:
        print(f"\n{'server':<28} {'k instr/review':>14} {'vs echo':>7}")
        for s in measured:
            assert s.instructions is not None
            print(
                f"{s.name:<28} {s.instructions / 1000:>14.0f} {echo.instructions / s.instructions:>7.2f}"
            )
    print("\nper review: stack (decisions precomputed) and deciding (served minus precomputed)")
    by_name = {s.name: s for s in measured}
    for s in measured[1:]:
        pre = by_name.get(f"{s.name} precomputed")
        if pre is None:
            continue
        parts = []
        if s.cpu_us:
            full, stack = statistics.median(s.cpu_us), statistics.median(pre.cpu_us)
            parts.append(f"CPU {stack:.0f} + {full - stack:.0f} us")
        if s.instructions and pre.instructions:
            parts.append(
                f"instructions {pre.instructions / 1000:.0f}k + "
                f"{(s.instructions - pre.instructions) / 1000:.0f}k"
            )
        print(f"  {s.name}: " + "; ".join(parts))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--before", action="append", default=[], metavar="REV", help="a git revision to compare"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4, help="of each wrk run")
    parser.add_argument("--quick", action="store_true", help="2 s wrk runs")
    parser.add_argument(
        "--instructions",
        type=int,
        nargs="?",
        const=1000,
        metavar="REVIEWS",
        help="count instructions per review under callgrind instead of running wrk",
    )
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs: the servers on one, the client on the other")
    request = kserve_review()
    with tempfile.TemporaryDirectory(prefix="gpuwarden-versus-") as tmp:
        work = Path(tmp)
        trees = {rev: extract(rev, work / "trees") for rev in args.before}
        trees["this tree"] = ROOT
        certs = issue_directory(work / "certs", ServingNames(("localhost",), ("127.0.0.1",)))
        ctx = ssl.create_default_context(cafile=str(certs.ca_cert))
        measured = servers(trees, str(certs.tls_cert), str(certs.tls_key))
        os.sched_setaffinity(0, {CLIENT_CPU})
        if args.instructions:
            measure_instructions(measured, ctx, request, args.instructions, work)
        else:
            seconds = 2 if args.quick else args.seconds
            measure_rates(measured, ctx, request, args.rounds, seconds, work)
        report(measured, request)
    return 0


if __name__ == "__main__":
    sys.exit(main())
