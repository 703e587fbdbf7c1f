"""`gpuwarden usage`: GPU showback per tenant and profile, from the chart's recording rules.

Prometheus answers instant queries (``/api/v1/query``) over the recorded series
``gpuwarden:tenant_gpus_{allocated,busy,idle}``, ``gpuwarden:tenant_gpu_memory_used_bytes`` and
``gpuwarden:container_gpus_idle`` (charts/gpuwarden/templates/monitoring.yaml). A GPU-hour
figure is the series integrated over ``--since``: a subquery samples it every ``--step`` and the
sum of the samples times the step is the area under it. Where a series is absent (nothing
allocated) it adds nothing, which is what it held.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

HELP = (
    "GPU showback per tenant and profile from Prometheus: GPU-hours allocated, busy and idle, "
    "efficiency, GPU-memory-hours, and the pods holding the most idle GPU-hours."
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_PREFIX = "gpuwarden usage"
# Prometheus's duration syntax (model.ParseDuration): units largest first, each at most once.
_DURATION = re.compile(
    r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?"
)
_UNIT_SECONDS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
_GIB = 2**30


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus",
        required=True,
        metavar="URL",
        help="Prometheus's base URL, e.g. http://prometheus.monitoring:9090 (the one that "
        "evaluates the chart's monitoring.prometheusRule)",
    )
    parser.add_argument(
        "--since",
        default="7d",
        metavar="DURATION",
        help="the period to report, ending now, in Prometheus's syntax: 7d, 24h, 1w2d (default 7d)",
    )
    parser.add_argument(
        "--step",
        default="1m",
        metavar="DURATION",
        help="integration step: each series is sampled this often (default 1m, the chart's "
        "monitoring.prometheusRule.usage.interval)",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=10,
        metavar="N",
        help="how many pods to list by idle GPU-hours (default 10; 0: none)",
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "json", "csv"), default="table", help="format"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="per-query timeout (default 30)",
    )


class PrometheusError(Exception):
    """Prometheus could not be reached or refused a query; the message says which and why."""


@dataclass(frozen=True)
class TenantUsage:
    tenant: str
    profile: str
    gpu_hours_allocated: float
    gpu_hours_busy: float
    gpu_hours_idle: float
    # busy / allocated; None where nothing was allocated
    efficiency: float | None
    gpu_memory_gib_hours: float


@dataclass(frozen=True)
class IdlePod:
    namespace: str
    pod: str
    tenant: str
    profile: str
    gpu_hours_idle: float


@dataclass(frozen=True)
class Report:
    prometheus: str
    since: str
    step: str
    tenants: tuple[TenantUsage, ...]
    idle_pods: tuple[IdlePod, ...]


def duration_seconds(text: str) -> float | None:
    """Seconds in a Prometheus duration ("7d", "1h30m"); None where it is not one or is 0."""
    match = _DURATION.fullmatch(text)
    if match is None or not text:
        return None
    seconds = sum(int(v) * unit for v, unit in zip(match.groups(), _UNIT_SECONDS, strict=True) if v)
    return seconds or None


def queries(since: str, step: str, step_seconds: float, top: int) -> dict[str, str]:
    """The instant queries of the report, by what they answer."""
    hours = f"* {step_seconds:g} / 3600"

    def integral(series: str) -> str:
        return f"sum_over_time({series}[{since}:{step}]) {hours}"

    out = {
        "allocated": integral("gpuwarden:tenant_gpus_allocated"),
        "busy": integral("gpuwarden:tenant_gpus_busy"),
        "idle": integral("gpuwarden:tenant_gpus_idle"),
        "memory": integral("gpuwarden:tenant_gpu_memory_used_bytes"),
    }
    if top > 0:
        per_pod = f"sum_over_time(gpuwarden:container_gpus_idle[{since}:{step}])"
        out["idle_pods"] = (
            f"topk({top}, sum by (namespace, pod, tenant, profile) ({per_pod}) > 0) {hours}"
        )
    return out


def _value(sample: Mapping[str, Any]) -> float:
    value = float(sample["value"][1])
    return 0.0 if math.isnan(value) else value


def _by_owner(result: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    return {
        (s["metric"].get("tenant", ""), s["metric"].get("profile", "")): _value(s) for s in result
    }


def build_report(
    prometheus: str, since: str, step: str, answers: Mapping[str, Sequence[Mapping[str, Any]]]
) -> Report:
    """The report from the queries' vector results (``data.result`` of each)."""
    allocated = _by_owner(answers["allocated"])
    busy = _by_owner(answers["busy"])
    idle = _by_owner(answers["idle"])
    memory = _by_owner(answers["memory"])
    tenants = []
    for owner in sorted(allocated.keys() | busy.keys() | idle.keys() | memory.keys()):
        held = allocated.get(owner, 0.0)
        used = busy.get(owner, 0.0)
        tenants.append(
            TenantUsage(
                tenant=owner[0],
                profile=owner[1],
                gpu_hours_allocated=held,
                gpu_hours_busy=used,
                gpu_hours_idle=idle.get(owner, 0.0),
                efficiency=used / held if held > 0 else None,
                gpu_memory_gib_hours=memory.get(owner, 0.0) / _GIB,
            )
        )
    pods = sorted(
        (
            IdlePod(
                namespace=s["metric"].get("namespace", ""),
                pod=s["metric"].get("pod", ""),
                tenant=s["metric"].get("tenant", ""),
                profile=s["metric"].get("profile", ""),
                gpu_hours_idle=_value(s),
            )
            for s in answers.get("idle_pods", ())
        ),
        key=lambda p: (-p.gpu_hours_idle, p.namespace, p.pod),
    )
    return Report(prometheus, since, step, tuple(tenants), tuple(pods))


# -- output ---------------------------------------------------------------------------------


def _hours(value: float) -> str:
    """Two decimals; below 1, three significant digits (a short period's figures stay legible)."""
    return f"{value:.2f}" if value == 0 or abs(value) >= 1 else f"{value:.3g}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _columns(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def render_table(report: Report) -> str:
    head = f"GPU usage over the last {report.since} (Prometheus {report.prometheus}, step {report.step})"
    if not report.tenants:
        return (
            f"{head}\n\nno GPU usage recorded: are the chart's recording rules on "
            "(monitoring.prometheusRule.enabled) and the node agent scraped?\n"
        )
    rows = [
        [
            "TENANT",
            "PROFILE",
            "GPU-H ALLOCATED",
            "GPU-H BUSY",
            "GPU-H IDLE",
            "EFFICIENCY",
            "GPU-MEM GIB-H",
        ]
    ]
    rows += [
        [
            t.tenant or "(none)",
            t.profile or "(none)",
            _hours(t.gpu_hours_allocated),
            _hours(t.gpu_hours_busy),
            _hours(t.gpu_hours_idle),
            _percent(t.efficiency),
            _hours(t.gpu_memory_gib_hours),
        ]
        for t in report.tenants
    ]
    text = f"{head}\n\n{_columns(rows)}\n"
    if report.idle_pods:
        pods = [["NAMESPACE", "POD", "TENANT", "PROFILE", "GPU-H IDLE"]]
        pods += [
            [
                p.namespace,
                p.pod,
                p.tenant or "(none)",
                p.profile or "(none)",
                _hours(p.gpu_hours_idle),
            ]
            for p in report.idle_pods
        ]
        text += f"\nPods holding the most idle GPU-hours\n\n{_columns(pods)}\n"
    return text


def render_json(report: Report) -> str:
    return json.dumps(asdict(report), indent=2) + "\n"


_CSV_FIELDS = (
    "scope",
    "tenant",
    "profile",
    "namespace",
    "pod",
    "gpu_hours_allocated",
    "gpu_hours_busy",
    "gpu_hours_idle",
    "efficiency",
    "gpu_memory_gib_hours",
)


def render_csv(report: Report) -> str:
    """One table: a row per tenant and profile (scope "tenant"), then per idle pod ("pod")."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=_CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for t in report.tenants:
        writer.writerow({"scope": "tenant", **asdict(t)})
    for p in report.idle_pods:
        writer.writerow({"scope": "pod", **asdict(p)})
    return out.getvalue()


_RENDER = {"table": render_table, "json": render_json, "csv": render_csv}


# -- the shell ------------------------------------------------------------------------------


def query(base: str, expr: str, timeout: float) -> list[Mapping[str, Any]]:
    """One instant query's vector result."""
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(detail).get("error", detail)
        raise PrometheusError(
            f"Prometheus at {base} answered HTTP {exc.code} to {expr!r}: {detail.strip()[:300]}"
        ) from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PrometheusError(f"cannot reach Prometheus at {base}: {reason}") from None
    try:
        answer = json.loads(body)
        data = answer["data"]
    except (ValueError, KeyError, TypeError):
        raise PrometheusError(
            f"{base}/api/v1/query did not answer as Prometheus's HTTP API does (is it the "
            "Prometheus base URL?)"
        ) from None
    if answer.get("status") != "success" or data.get("resultType") != "vector":
        raise PrometheusError(f"Prometheus at {base} could not run {expr!r}: {answer}")
    result: list[Mapping[str, Any]] = data["result"]
    return result


def _fail(message: str, code: int) -> int:
    print(f"{_PREFIX}: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    url = urllib.parse.urlparse(args.prometheus)
    if url.scheme not in ("http", "https") or not url.netloc:
        return _fail(
            f"--prometheus {args.prometheus!r} is not an http(s) URL "
            "(e.g. http://prometheus.monitoring:9090)",
            EXIT_USAGE,
        )
    if duration_seconds(args.since) is None:
        return _fail(
            f"--since {args.since!r} is not a duration: write it as Prometheus does, e.g. 7d, "
            "24h, 1w2d, 90m",
            EXIT_USAGE,
        )
    step_seconds = duration_seconds(args.step)
    if step_seconds is None:
        return _fail(f"--step {args.step!r} is not a duration (e.g. 1m, 30s)", EXIT_USAGE)
    if args.top < 0:
        return _fail(f"--top must be 0 or more, not {args.top}", EXIT_USAGE)
    if not args.timeout > 0:
        return _fail(
            f"--timeout must be a positive number of seconds, not {args.timeout}", EXIT_USAGE
        )
    try:
        answers = {
            name: query(args.prometheus, expr, args.timeout)
            for name, expr in queries(args.since, args.step, step_seconds, args.top).items()
        }
    except PrometheusError as exc:
        return _fail(str(exc), EXIT_FAILED)
    report = build_report(args.prometheus, args.since, args.step, answers)
    sys.stdout.write(_RENDER[args.output](report))
    return EXIT_OK
