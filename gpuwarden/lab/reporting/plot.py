"""The PNG of `gpuwarden simulate --plot`: GPUs allocated and busy over time per strategy, the
backlog of pending GPUs over time, wait percentiles per tenant, and for each strategy with tenant
queues each tenant's share of the GPUs over time against its entitled share. matplotlib is
optional (``pip install 'gpuwarden[lab]'``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuwarden.lab.reporting.report import StrategyReport


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def wait_minutes(report: StrategyReport, namespaces: Sequence[str], share: str) -> list[float]:
    """One wait percentile (``p50``, ``p95``, ``p99``) per namespace, in simulated minutes, the
    unit the table's wait grid uses (a namespace without waits: 0)."""
    return [float(report.waits.get(ns, {}).get(share) or 0) / 60 for ns in namespaces]


def write_png(reports: Sequence[StrategyReport], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailableError(
            "the plot needs matplotlib: pip install 'gpuwarden[lab]'"
        ) from exc
    namespaces = sorted({ns for r in reports for ns in r.waits})
    queued = [r for r in reports if r.queues]
    figure, axes = plt.subplots(
        3 + len(queued), 1, figsize=(12, 12 + 4 * len(queued)), constrained_layout=True
    )
    timeline, backlog, waits = axes[:3]
    for report in reports:
        hours = [i * report.bucket / 3600 for i in range(len(report.allocation))]
        (line,) = timeline.plot(
            hours,
            [100 * a for a in report.allocation],
            label=f"{report.strategy} allocated (avg {report.average_allocation:.0%})",
        )
        timeline.plot(
            hours,
            [100 * b for b in report.busy],
            linestyle="--",
            color=line.get_color(),
            label=f"{report.strategy} busy (avg {report.gpu_busy_average:.0%})",
        )
        backlog.plot(hours, list(report.pending), color=line.get_color(), label=report.strategy)
    timeline.set_xlabel("simulated hour")
    timeline.set_ylabel("share of the GPUs (%)")
    timeline.set_ylim(0, 105)
    timeline.set_title("GPUs allocated (solid) and busy (dashed, as DCGM would report) over time")
    timeline.legend(loc="lower right", fontsize="small", ncols=2)
    backlog.set_xlabel("simulated hour")
    backlog.set_ylabel("GPUs asked by waiting pods")
    backlog.set_title("Backlog: GPUs pending over time")
    backlog.legend(loc="upper right", fontsize="small")
    width = 0.8 / max(len(reports), 1)
    for index, report in enumerate(reports):
        xs = [i + index * width for i in range(len(namespaces))]
        for share, alpha, label in (("p99", 0.2, "p99"), ("p95", 0.45, "p95"), ("p50", 1.0, "p50")):
            waits.bar(
                xs,
                wait_minutes(report, namespaces, share),
                width=width * 0.9,
                alpha=alpha,
                color=f"C{index}",
                label=f"{report.strategy} {label}",
            )
    waits.set_xticks([i + width * (len(reports) - 1) / 2 for i in range(len(namespaces))])
    waits.set_xticklabels(namespaces)
    waits.set_ylabel("wait to be placed (simulated minutes)")
    waits.set_title("Waits per tenant: p50 (solid), p95, p99 (lighter)")
    waits.legend(loc="upper right", fontsize="small", ncols=3)
    for report, shares in zip(queued, axes[3:], strict=True):
        for index, (tenant, queue) in enumerate(report.queues.items()):
            received = [100 * share for share in queue["receivedShare"]]
            hours = [i * report.bucket / 3600 for i in range(len(received))]
            shares.plot(
                hours,
                received,
                color=f"C{index}",
                label=f"{tenant} received (avg {queue['receivedShareAverage']:.0%}, "
                f"{queue['borrowedGpuHours']:,.0f} GPU-h borrowed, "
                f"{queue['lostToReclaimGpuHours']:,.0f} lost to reclaim)",
            )
            shares.axhline(
                100 * queue["entitledShare"],
                color=f"C{index}",
                linestyle="--",
                label=f"{tenant} entitled ({queue['entitledShare']:.0%})",
            )
        shares.set_xlabel("simulated hour")
        shares.set_ylabel("share of the GPUs (%)")
        shares.set_ylim(0, 105)
        shares.set_title(
            f"{report.strategy}: each tenant's share of the GPUs held (solid) against its "
            "nominal quota (dashed)"
        )
        shares.legend(loc="upper right", fontsize="small", ncols=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
