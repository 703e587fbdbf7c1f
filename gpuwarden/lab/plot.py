"""The PNG of `gpuwarden simulate --plot`: GPU allocation over time per strategy, and waits per
tenant. matplotlib is optional (``pip install 'gpuwarden[lab]'``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuwarden.lab.report import StrategyReport


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


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
    figure, (timeline, waits) = plt.subplots(2, 1, figsize=(11, 8), constrained_layout=True)
    for report in reports:
        hours = [i * report.bucket / 3600 for i in range(len(report.allocation))]
        timeline.plot(
            hours,
            [100 * a for a in report.allocation],
            label=f"{report.strategy} (avg {report.average_allocation:.0%})",
        )
    timeline.set_xlabel("simulated hour")
    timeline.set_ylabel("GPUs allocated (%)")
    timeline.set_ylim(0, 105)
    timeline.set_title("GPU allocation over time")
    timeline.legend(loc="upper right")
    width = 0.8 / max(len(reports), 1)
    for index, report in enumerate(reports):
        xs = [i + index * width for i in range(len(namespaces))]
        p50 = [float(report.waits.get(ns, {}).get("p50") or 0) / 3600 for ns in namespaces]
        p95 = [float(report.waits.get(ns, {}).get("p95") or 0) / 3600 for ns in namespaces]
        waits.bar(xs, p95, width=width * 0.9, alpha=0.35, label=f"{report.strategy} p95")
        waits.bar(xs, p50, width=width * 0.9, label=f"{report.strategy} p50")
    waits.set_xticks([i + width * (len(reports) - 1) / 2 for i in range(len(namespaces))])
    waits.set_xticklabels(namespaces)
    waits.set_ylabel("wait to be placed (simulated hours)")
    waits.set_title("Waits per tenant")
    waits.legend(loc="upper right", fontsize="small", ncols=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
