"""Connection benchmark: a served gpuwarden's memory and readiness under idle connections.

Opens N idle connections (0, 1,000, 5,000 by default) against `gpuwarden serve` and prints, side
by side for each server variant, the server process's resident memory with them open, how many
sockets it still holds, its RSS once they are all closed again, and the latency of GET /readyz
on a fresh, certificate-verified HTTPS connection while they are open. Two kinds of idle
connection:

* tcp: connected, no TLS handshake ever started (costs nothing to open by the thousand);
* tls: handshake done, then no request;
* body: a request for /mutate announcing the largest body allowed, of which only the first
  128 KiB is sent (what the server holds of requests it cannot finish: the worst case).

Variants: gpuwarden with its defaults; the same code with the limits lifted (a cap and timeouts
nobody reaches: what the shared read buffer and the deferred handshake alone save); and, with
`--before REF`, the tree of a git revision (e.g. HEAD before a change is committed), extracted
with `git archive` and served the same way.

Run: `python bench/connections.py` (about a minute); `--before HEAD` adds the revision's column.

`--attack` measures something else (issue 29): the latency of reviews that a few clients send
back to back (one keep-alive HTTPS connection each, POST /mutate of a Notebook pod) for a few
seconds, first alone, then while N attacker connections each declare the largest body
(6 MiB) to /validate, send one byte and wait (reconnecting whenever the server closes them): p50
and p99 in milliseconds, and the reviews refused (any answer but 200, or none within 15 s).
`python bench/connections.py --attack --before REF` (about 30 s) prints the two trees side by
side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwarden.certs.rotation import ServingNames, issue_directory  # noqa: E402
from gpuwarden.commands.serve import raise_open_file_limit  # noqa: E402

LIFTED = [
    "--max-connections=1000000",
    "--handshake-timeout=60",
    "--header-timeout=3600",
    "--keepalive-timeout=3630",
]
READYZ_SAMPLES = 20
# Idle TLS connections handshake this many at a time (a client would; it also keeps the run short).
HANDSHAKES_AT_ONCE = 32
BODY_SENT = 128 * 1024
BODY_ANNOUNCED = 6 * 1024 * 1024
BODY_HEAD = (
    b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {BODY_ANNOUNCED}\r\n\r\n".encode()
)


@dataclass
class Variant:
    name: str
    tree: Path
    extra: list[str] = field(default_factory=list)


@dataclass
class Row:
    """One variant and kind of idle connection: figures per number of connections opened."""

    variant: str
    kind: str
    rss_mib: dict[int, float] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)
    readyz_ms: dict[int, tuple[float, float]] = field(default_factory=dict)
    failed_opens: dict[int, int] = field(default_factory=dict)
    rss_after_mib: float = 0.0


# --- the server ------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    """Resident set size of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def sockets_held(pid: int) -> int:
    """Sockets the process has open (its listener and connections), from /proc (Linux)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def served(
    variant: Variant, port: int, ctx: ssl.SSLContext, cert: Path, key: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    argv = [
        sys.executable, "-m", "gpuwarden", "serve",
        "--policies", str(variant.tree / "policies"),
        "--namespaces", str(variant.tree / "examples" / "namespaces.yaml"),
        "--tls-cert", str(cert), "--tls-key", str(key),
        "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "-1",
        *variant.extra,
    ]  # fmt: skip
    two_cores = (os.cpu_count() or 1) > 1

    def pin() -> None:
        if two_cores:
            os.sched_setaffinity(0, {0})

    with log.open("wb") as out:
        # cwd: `python -m gpuwarden` imports the package of the variant's tree.
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pin, cwd=variant.tree
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"{variant.name}: server exited: {log.read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(
                        f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=1
                    ):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit(
                            f"{variant.name}: not ready: {log.read_text()[-2000:]}"
                        ) from None
                    time.sleep(0.1)
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- the client ------------------------------------------------------------------------------


async def open_idle(
    port: int, ctx: ssl.SSLContext, kind: str, count: int, into: list[asyncio.StreamWriter]
) -> int:
    """Open ``count`` more idle connections of a kind; returns how many failed to open."""
    gate = asyncio.Semaphore(HANDSHAKES_AT_ONCE if kind != "tcp" else 256)
    body = b" " * BODY_SENT
    failed = 0

    async def one() -> None:
        nonlocal failed
        async with gate:
            try:
                if kind == "tcp":
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                else:
                    _, writer = await asyncio.open_connection(
                        "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
                    )
            except (OSError, ssl.SSLError):
                failed += 1
                return
            if kind == "body":
                # Not drained: what the server does not read waits in this process.
                writer.write(BODY_HEAD + body)
            into.append(writer)

    await asyncio.gather(*(one() for _ in range(count)))
    return failed


async def readyz_ms(port: int, ctx: ssl.SSLContext) -> float:
    """GET /readyz on a fresh HTTPS connection (handshake included), in milliseconds."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
    )
    writer.write(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    status = await reader.readline()
    await reader.read()
    elapsed = (time.perf_counter() - started) * 1000
    writer.close()
    if b" 200 " not in status:
        raise SystemExit(f"/readyz answered {status!r}")
    return elapsed


async def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()
    for writer in writers:
        with contextlib.suppress(OSError, ssl.SSLError):
            await asyncio.wait_for(writer.wait_closed(), 5)
    writers.clear()


async def measure(
    variant: str, kind: str, pid: int, port: int, ctx: ssl.SSLContext, levels: Sequence[int]
) -> Row:
    row = Row(variant, kind)
    writers: list[asyncio.StreamWriter] = []
    opened = 0
    await asyncio.sleep(1)  # the readiness check's connection is gone by now
    baseline = sockets_held(pid)
    for level in levels:
        row.failed_opens[level] = await open_idle(port, ctx, kind, level - opened, writers)
        opened = level
        await asyncio.sleep(1)  # let the server take in the last of them
        row.rss_mib[level] = rss_mib(pid)
        row.held[level] = sockets_held(pid) - baseline
        samples = [await readyz_ms(port, ctx) for _ in range(READYZ_SAMPLES)]
        row.readyz_ms[level] = (statistics.median(samples), max(samples))
    await close_all(writers)
    await asyncio.sleep(2)
    row.rss_after_mib = rss_mib(pid)
    return row


# --- the run ---------------------------------------------------------------------------------


def extract(ref: str, into: Path) -> Path:
    """The tree of a git revision (read with `git archive`; the work tree is not touched)."""
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", ref], stdout=out, check=True)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def print_table(rows: Sequence[Row], levels: Sequence[int]) -> None:
    width = max(len(row.variant) for row in rows) + 2
    head = f"{'server':<{width}}{'idle':<6}" + "".join(f"{n:>20,}" for n in levels)
    print("\nServer RSS in MiB with N idle connections open [sockets it still holds]")
    print(head + f"{'all closed':>14}")
    for row in rows:
        cells = "".join(f"{f'{row.rss_mib[n]:.1f} [{row.held[n]:,}]':>20}" for n in levels)
        print(f"{row.variant:<{width}}{row.kind:<6}{cells}{row.rss_after_mib:>14.1f}")
    print(f"\nGET /readyz on a fresh HTTPS connection, ms (median / max of {READYZ_SAMPLES})")
    print(head)
    for row in rows:
        cells = "".join(
            f"{f'{row.readyz_ms[n][0]:.1f} / {row.readyz_ms[n][1]:.1f}':>20}" for n in levels
        )
        print(f"{row.variant:<{width}}{row.kind:<6}{cells}")
    failures = {
        f"{row.variant} {row.kind}": row.failed_opens
        for row in rows
        if any(row.failed_opens.values())
    }
    if failures:
        print(f"\nconnections that failed to open (the server closed them first): {failures}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--levels",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[0, 1000, 5000],
        help="numbers of idle connections, comma-separated (default 0,1000,5000)",
    )
    parser.add_argument(
        "--kinds", default="tcp,tls,body", help="of tcp, tls and body (default: all three)"
    )
    parser.add_argument("--before", metavar="REF", help="also serve this git revision's tree")
    parser.add_argument(
        "--attack",
        type=int,
        nargs="?",
        const=24,
        metavar="N",
        help="measure review latency alone and with N stalled-body connections (default 24)",
    )
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="--attack: how long to send reviews each time"
    )
    args = parser.parse_args()
    if args.attack is not None:
        return attack_main(args.attack, args.seconds, args.before)
    levels: list[int] = sorted(args.levels)
    kinds = [kind for kind in args.kinds.split(",") if kind]
    open_files = raise_open_file_limit()
    if open_files < max(levels) + 256:
        raise SystemExit(f"the open-file limit ({open_files}) is too low for {max(levels)}")
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-connections-") as tmp:
        work = Path(tmp)
        certs = issue_directory(work / "certs", ServingNames(("localhost",), ("127.0.0.1",)))
        ctx = ssl.create_default_context(cafile=str(certs.ca_cert))
        variants = [
            Variant("gpuwarden (defaults)", ROOT),
            Variant("gpuwarden, limits lifted", ROOT, LIFTED),
        ]
        if args.before:
            variants.append(Variant(f"before ({args.before})", extract(args.before, work)))
        for variant in variants:
            for kind in kinds:
                port = free_port()
                log = work / f"{len(rows)}.log"
                with served(variant, port, ctx, certs.tls_cert, certs.tls_key, log) as proc:
                    row = asyncio.run(measure(variant.name, kind, proc.pid, port, ctx, levels))
                rows.append(row)
                print(
                    f"{variant.name}, {kind}: RSS "
                    + ", ".join(f"{row.rss_mib[n]:.1f}" for n in levels)
                    + f" MiB; all closed {row.rss_after_mib:.1f} MiB",
                    flush=True,
                )
    print_table(rows, levels)
    return 0


# --- --attack: declared-but-unsent bodies ---------------------------------------------------

ATTACK_HEAD = (
    b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {BODY_ANNOUNCED}\r\n\r\n{{".encode()
)
REVIEW_CLIENTS = 4
REVIEW_TIMEOUT = 15.0


@dataclass
class AttackRow:
    variant: str
    attackers: int
    latencies_ms: list[float] = field(default_factory=list)
    refused: int = 0

    def percentile(self, share: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def attacker(port: int, ctx: ssl.SSLContext, stop: asyncio.Event) -> None:
    """One connection declaring the largest body and sending one byte of it; again whenever
    the server closes it."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
            )
        except (OSError, ssl.SSLError):
            await asyncio.sleep(0.05)
            continue
        writer.write(ATTACK_HEAD)
        reading = asyncio.ensure_future(reader.read())
        stopping = asyncio.ensure_future(stop.wait())
        with contextlib.suppress(OSError, ssl.SSLError):
            await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for task in (reading, stopping):
            task.cancel()
        writer.close()


async def review_client(
    port: int, ctx: ssl.SSLContext, request: bytes, until: float, row: AttackRow
) -> None:
    """Reviews back to back on one keep-alive connection (a new one after a refusal)."""
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while time.monotonic() < until:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(REVIEW_TIMEOUT):
                if conn is None:
                    conn = await asyncio.open_connection(
                        "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
                    )
                reader, writer = conn
                writer.write(request)
                status = int((await reader.readline()).split()[1])
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
        except (OSError, ssl.SSLError, IndexError, ValueError, TimeoutError):
            status = 0
        row.latencies_ms.append((time.perf_counter() - started) * 1000)
        if status != 200:
            row.refused += 1
            if conn is not None:
                conn[1].close()
            conn = None
    if conn is not None:
        conn[1].close()


async def attack_run(
    variant: str, port: int, ctx: ssl.SSLContext, attackers: int, seconds: float
) -> AttackRow:
    body = (ROOT / "examples" / "admissionreview-notebook.json").read_bytes()
    request = (
        b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    row = AttackRow(variant, attackers)
    stop = asyncio.Event()
    attacks = [asyncio.ensure_future(attacker(port, ctx, stop)) for _ in range(attackers)]
    await asyncio.sleep(1 if attackers else 0)  # the attackers' requests are in
    until = time.monotonic() + seconds
    await asyncio.gather(
        *(review_client(port, ctx, request, until, row) for _ in range(REVIEW_CLIENTS))
    )
    stop.set()
    await asyncio.gather(*attacks, return_exceptions=True)
    return row


def attack_main(attackers: int, seconds: float, before: str | None) -> int:
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    rows: list[AttackRow] = []
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-attack-") as tmp:
        work = Path(tmp)
        certs = issue_directory(work / "certs", ServingNames(("localhost",), ("127.0.0.1",)))
        ctx = ssl.create_default_context(cafile=str(certs.ca_cert))
        variants = [Variant("gpuwarden", ROOT)]
        if before:
            variants.append(Variant(f"before ({before})", extract(before, work)))
        for variant in variants:
            for count in (0, attackers):
                port = free_port()
                log = work / f"attack-{len(rows)}.log"
                with served(variant, port, ctx, certs.tls_cert, certs.tls_key, log):
                    row = asyncio.run(attack_run(variant.name, port, ctx, count, seconds))
                rows.append(row)
                print(
                    f"{variant.name}, {count} attackers: {len(row.latencies_ms)} reviews",
                    flush=True,
                )
    width = max(len(row.variant) for row in rows) + 2
    print(
        f"\nReviews from {REVIEW_CLIENTS} clients for {seconds:g} s, alone and while N "
        f"connections declare {BODY_ANNOUNCED:,}-byte bodies and send one byte"
    )
    print(
        f"{'server':<{width}}{'N':>4}{'reviews':>9}{'p50 ms':>10}{'p99 ms':>10}"
        f"{'refused':>9}{'p50 vs alone':>14}"
    )
    alone: dict[str, float] = {}
    for row in rows:
        p50 = row.percentile(0.5)
        alone.setdefault(row.variant, p50)
        print(
            f"{row.variant:<{width}}{row.attackers:>4}{len(row.latencies_ms):>9}{p50:>10.1f}"
            f"{row.percentile(0.99):>10.1f}{row.refused:>9}{p50 / alone[row.variant]:>13.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
