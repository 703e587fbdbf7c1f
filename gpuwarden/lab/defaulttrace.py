"""The trace `gpuwarden simulate` replays when given none: a week of four tenants shaped like
the seed's tenant table (section 1.1 of the article), generated from a fixed seed so every run
replays the same rows.

=============  ==========================================================================
data-team      Kubeflow Pipelines at night (runs start 22:00-03:00): a data-loading step
               asking 2 GPUs, then a training step asking 2, 4 or 8 for 4-7 hours; can wait
algo-team      weekdays 09:00-17:00: notebooks (1 GPU, little memory) and PyTorchJobs of
               1-4 GPUs; interactive
serving        KServe predictors of 1-2 GPUs all week, plus two daytime replicas; low latency
batch          a Katib experiment every 2-6 hours, 4-16 trials of 1 GPU each; preemptible
=============  ==========================================================================
"""

from __future__ import annotations

import random
from decimal import Decimal

from gpuwarden.lab.trace import TraceRow

HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY
NAMESPACES = ("data-team", "algo-team", "serving", "batch")
_SEED = 20260601


def _gib(value: float) -> Decimal:
    # Whole MiB, so the CSV form of the trace reads back to the same numbers.
    return Decimal(round(value * 1024)) * Decimal(2**20)


def default_trace() -> list[TraceRow]:
    rng = random.Random(_SEED)
    rows: list[tuple[float, str, str, str, int, float, Decimal]] = []

    for day in range(7):
        # data team: pipeline runs through the night.
        for _ in range(10):
            start = day * DAY + 22 * HOUR + rng.uniform(0, 5 * HOUR)
            etl = rng.uniform(0.5, 1.0) * HOUR
            rows.append(
                (start, "data-team", "kfp-step", "data-loading", 2, etl, _gib(rng.uniform(4, 8)))
            )
            gpus = rng.choice((2, 4, 8, 8))
            train = rng.uniform(4, 7) * HOUR
            rows.append(
                (
                    start + etl,
                    "data-team",
                    "kfp-step",
                    "train",
                    gpus,
                    train,
                    _gib(rng.uniform(40, 70)),
                )
            )
        # algorithm team: office hours on weekdays.
        if day < 5:
            for _ in range(12):
                at = day * DAY + rng.uniform(9, 17) * HOUR
                rows.append(
                    (
                        at,
                        "algo-team",
                        "notebook",
                        "explore",
                        1,
                        rng.uniform(2, 6) * HOUR,
                        _gib(rng.uniform(3, 10)),
                    )
                )
            for _ in range(14):
                at = day * DAY + rng.uniform(9, 17) * HOUR
                gpus = rng.choice((1, 2, 2, 4))
                rows.append(
                    (
                        at,
                        "algo-team",
                        "training-job",
                        "experiment",
                        gpus,
                        rng.uniform(1, 4) * HOUR,
                        _gib(rng.uniform(20, 60)),
                    )
                )
        # serving: two more replicas during the day.
        for replica in range(2):
            at = day * DAY + 8 * HOUR + replica * 0.25 * HOUR
            rows.append(
                (at, "serving", "kserve-predictor", "chat", 1, 12 * HOUR, _gib(rng.uniform(10, 18)))
            )

    # serving: always-on predictors.
    for name, gpus in (("chat", 1), ("search", 1), ("vision", 2)):
        rows.append(
            (0.0, "serving", "kserve-predictor", name, gpus, WEEK, _gib(rng.uniform(10, 18)))
        )

    # batch: an HPO or NAS experiment every 2-6 hours, all its trials at once.
    at = rng.uniform(1, 6) * HOUR
    while at < WEEK - 6 * HOUR:
        trials = rng.randint(4, 16)
        experiment = rng.choice(("hpo", "nas"))
        for _ in range(trials):
            rows.append(
                (
                    at,
                    "batch",
                    "katib-trial",
                    experiment,
                    1,
                    rng.uniform(1, 3) * HOUR,
                    _gib(rng.uniform(20, 50)),
                )
            )
        at += rng.uniform(2, 6) * HOUR

    rows.sort(key=lambda r: r[0])
    return [
        TraceRow(
            row=index,
            at=round(at, 1),
            namespace=namespace,
            kind=kind,
            name=name,
            gpus=gpus,
            duration=round(duration, 1),
            memory_used=memory,
        )
        for index, (at, namespace, kind, name, gpus, duration, memory) in enumerate(rows, start=1)
    ]


#: What Kubeflow's profile controller puts on a profile namespace; every default tenant is one.
PROFILE_NAMESPACE_LABELS = {
    "app.kubernetes.io/part-of": "kubeflow-profile",
    "katib.kubeflow.org/metrics-collector-injection": "enabled",
    "serving.kubeflow.org/inferenceservice": "enabled",
    "pipelines.kubeflow.org/enabled": "true",
}


def default_namespaces() -> dict[str, dict[str, str]]:
    return {namespace: dict(PROFILE_NAMESPACE_LABELS) for namespace in NAMESPACES}
