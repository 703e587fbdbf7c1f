"""The traces `gpuwarden simulate` replays when given no file: weeks of four tenants shaped like
the seed's tenant table (section 1.1 of the article), generated from a fixed seed so every run
replays the same rows.

=============  ==========================================================================
data-team      Kubeflow Pipelines at night (runs start 22:00-03:00): a data-loading step
               asking 2 GPUs (busy 0.2), then, in the same run, a training step asking 2, 4
               or 8 for 4-7 hours (checkpoint every hour); can wait
algo-team      weekdays 09:00-17:00: notebooks (1 GPU, busy 0.1) and PyTorchJobs of 1-4
               GPUs for 1-4 hours (checkpoint every 30 minutes); interactive
serving        KServe predictors of 1-2 GPUs all week (busy 0.3), plus daytime replicas
batch          a Katib experiment every few hours, trials of 1 GPU each for 1-3 hours
               (no checkpoints); preemptible
=============  ==========================================================================

``builtin:week`` (:func:`default_trace`) asks about 40% of a 64-GPU cluster's week.
``builtin:busy-week`` (:func:`busy_week`) is the same tenants on a saturated week: more
pipeline runs, notebooks and jobs, weekend work, and an HPO sweep always queued, so demand
stays at or above 1.5x the GPUs for long stretches and the week's work is about all the
cluster could do. Two more saturated weeks change the mix (each asks about the cluster's whole
week, peak above 2x): ``builtin:training-week`` (:func:`training_week`) is large training,
PyTorchJobs of 2-8 GPUs and pipeline training of 4-8, with few notebooks and trials;
``builtin:interactive-week`` (:func:`interactive_week`) is many notebooks (60 a working day) and
20 daytime predictors beside a queue of HPO trials. ``builtin:oversubscribed-week``
(:func:`oversubscribed_week`) is light work asking about 1.5x the week (notebooks, predictors and
the pipelines' data loading, at busy 0.1-0.3), with nightly 4-8 GPU pipeline training, a few
PyTorchJobs and HPO trials beside it, its busy-weighted work well under the GPUs' time.

Every week's notebook sessions end in an **idle tail** (the trace's ``idle``): an assumption, drawn
by :func:`idle_tail` from a generator of its own (the other rows are those of the weeks without
tails). Half the sessions are closed when their work is done; 30% are left open for 1-4 hours
(lunch, meetings, the end of the day); 20% are left open overnight, until their user comes back at
08:00-10:00 the next day. In the tail the notebook holds its GPU and keeps it busy 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from gpuwarden.lab.inputs.trace import DEFAULT_BUSY, TraceRow

HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY
NAMESPACES = ("data-team", "algo-team", "serving", "batch")
_SEED = 20260601


def _gib(value: float) -> Decimal:
    # Whole MiB, so the CSV form of the trace reads back to the same numbers.
    return Decimal(round(value * 1024)) * Decimal(2**20)


@dataclass(frozen=True)
class WeekShape:
    """How much each tenant asks in a generated week."""

    pipeline_runs: int  # per night
    notebooks: int  # per working day
    training_jobs: int  # per working day
    weekend_jobs: int  # per weekend day
    daytime_replicas: int  # extra predictors each day
    hpo_gap: tuple[float, float]  # hours between Katib experiments
    trials: tuple[int, int]
    trial_hours: tuple[float, float]
    job_hours: tuple[float, float]
    job_gpus: tuple[int, ...] = (1, 2, 2, 4)  # drawn for each PyTorchJob
    train_gpus: tuple[int, ...] = (2, 4, 8, 8)  # drawn for each pipeline's training step
    notebook_hours: tuple[float, float] = (2, 6)
    weekend_notebooks: int = 0  # per weekend day
    replica_gap: float = 0.25  # hours between one daytime predictor's start and the next's


WEEK_SHAPE = WeekShape(10, 12, 14, 0, 2, (2, 6), (4, 16), (1, 3), (1, 4))
BUSY_WEEK_SHAPE = WeekShape(22, 16, 32, 6, 4, (2.5, 4), (6, 12), (4, 8), (2, 8))
#: Large training: 2-8 GPU PyTorchJobs and 4-8 GPU pipeline training, few notebooks and trials.
TRAINING_WEEK_SHAPE = WeekShape(
    18, 6, 24, 10, 2, (3, 6), (6, 12), (2, 6), (3, 10), job_gpus=(2, 4, 8), train_gpus=(4, 8, 8)
)
#: Interactive: many notebooks and daytime predictors beside a queue of HPO trials.
INTERACTIVE_WEEK_SHAPE = WeekShape(12, 60, 26, 6, 20, (2, 3), (10, 16), (3, 8), (2, 6))
#: Oversubscribed: light work (notebooks at busy 0.1, predictors at 0.3) asking about 1.5x the
#: cluster's week, beside nightly pipelines whose training takes 4-8 GPUs, a few PyTorchJobs and
#: HPO trials; the busy-weighted work stays well under the GPUs' time.
OVERSUBSCRIBED_WEEK_SHAPE = WeekShape(
    12,
    160,
    10,
    0,
    110,
    (4, 8),
    (4, 8),
    (1, 3),
    (2, 6),
    train_gpus=(4, 8, 8),
    notebook_hours=(4, 10),
    weekend_notebooks=40,
    replica_gap=0.1,
)


#: Shares of notebook sessions closed at once, left open for hours, and left open overnight.
IDLE_TAIL_SHARES = (0.5, 0.3, 0.2)


def idle_tail(rng: random.Random, ends: float) -> float:
    """Seconds a notebook session whose work ends at ``ends`` (from the week's start) sits idle
    before its user closes it: see the module docstring."""
    draw = rng.random()
    closed, hours, _ = IDLE_TAIL_SHARES
    if draw < closed:
        return 0.0
    if draw < closed + hours:
        return rng.uniform(1, 4) * HOUR
    back = (ends // DAY + 1) * DAY + rng.uniform(8, 10) * HOUR
    return back - ends


def _generate(shape: WeekShape, seed: int) -> list[TraceRow]:
    rng = random.Random(seed)
    tails = random.Random(seed + 1)  # apart, so the other rows stay those drawn without tails
    rows: list[dict[str, object]] = []

    def add(
        at: float,
        namespace: str,
        kind: str,
        name: str,
        gpus: int,
        hours: float,
        memory: float,
        **extra: object,
    ) -> None:
        rows.append(
            {
                "at": at,
                "namespace": namespace,
                "kind": kind,
                "name": name,
                "gpus": gpus,
                "duration": hours * HOUR,
                "memory": _gib(memory),
                **extra,
            }
        )

    runs = 0
    for day in range(7):
        # data team: pipeline runs through the night; training waits for its data.
        for _ in range(shape.pipeline_runs):
            runs += 1
            start = day * DAY + 22 * HOUR + rng.uniform(0, 5 * HOUR)
            etl = rng.uniform(0.5, 1.0)
            run = f"nightly-{runs}"
            add(
                start,
                "data-team",
                "kfp-step",
                "data-loading",
                2,
                etl,
                rng.uniform(4, 8),
                busy=0.2,
                run=run,
            )
            gpus = rng.choice(shape.train_gpus)
            add(
                start + etl * HOUR,
                "data-team",
                "kfp-step",
                "train",
                gpus,
                rng.uniform(4, 7),
                rng.uniform(40, 70),
                checkpoint=HOUR,
                run=run,
            )
        weekday = day < 5
        # algorithm team: office hours on weekdays, a few jobs at the weekend.
        for _ in range(shape.notebooks if weekday else shape.weekend_notebooks):
            opened = day * DAY + rng.uniform(9, 17) * HOUR
            work = rng.uniform(*shape.notebook_hours)
            idle = round(idle_tail(tails, opened + work * HOUR), 1)
            add(
                opened,
                "algo-team",
                "notebook",
                "explore",
                1,
                work + idle / HOUR,
                rng.uniform(3, 10),
                busy=0.1,
                idle=idle,
            )
        for _ in range(shape.training_jobs if weekday else shape.weekend_jobs):
            add(
                day * DAY + rng.uniform(9, 17) * HOUR,
                "algo-team",
                "training-job",
                "experiment",
                rng.choice(shape.job_gpus),
                rng.uniform(*shape.job_hours),
                rng.uniform(20, 60),
                checkpoint=0.5 * HOUR,
            )
        # serving: more replicas during the day.
        for replica in range(shape.daytime_replicas):
            add(
                day * DAY + 8 * HOUR + replica * shape.replica_gap * HOUR,
                "serving",
                "kserve-predictor",
                "chat",
                1,
                12,
                rng.uniform(10, 18),
                busy=0.3,
            )
    # serving: always-on predictors.
    for name, gpus in (("chat", 1), ("search", 1), ("vision", 2)):
        add(
            0.0,
            "serving",
            "kserve-predictor",
            name,
            gpus,
            WEEK / HOUR,
            rng.uniform(10, 18),
            busy=0.3,
        )
    # batch: an HPO or NAS experiment every few hours, all its trials at once.
    at = rng.uniform(1, 6) * HOUR
    while at < WEEK - 6 * HOUR:
        experiment = rng.choice(("hpo", "nas"))
        for _ in range(rng.randint(*shape.trials)):
            add(
                at,
                "batch",
                "katib-trial",
                experiment,
                1,
                rng.uniform(*shape.trial_hours),
                rng.uniform(20, 50),
            )
        at += rng.uniform(*shape.hpo_gap) * HOUR

    rows.sort(key=lambda r: float(r["at"]))  # type: ignore[arg-type]
    return [
        TraceRow(
            row=index,
            at=round(float(r["at"]), 1),  # type: ignore[arg-type]
            namespace=str(r["namespace"]),
            kind=str(r["kind"]),
            name=str(r["name"]),
            gpus=int(r["gpus"]),  # type: ignore[call-overload]
            duration=round(float(r["duration"]), 1),  # type: ignore[arg-type]
            memory_used=r["memory"],  # type: ignore[arg-type]
            busy=float(r.get("busy", DEFAULT_BUSY[str(r["kind"])])),  # type: ignore[arg-type]
            checkpoint=r.get("checkpoint"),  # type: ignore[arg-type]
            run=r.get("run"),  # type: ignore[arg-type]
            idle=float(r.get("idle", 0.0)),  # type: ignore[arg-type]
        )
        for index, r in enumerate(rows, start=1)
    ]


def default_trace() -> list[TraceRow]:
    """``builtin:week``."""
    return _generate(WEEK_SHAPE, _SEED)


def busy_week() -> list[TraceRow]:
    """``builtin:busy-week``."""
    return _generate(BUSY_WEEK_SHAPE, _SEED)


def training_week() -> list[TraceRow]:
    """``builtin:training-week``."""
    return _generate(TRAINING_WEEK_SHAPE, _SEED)


def interactive_week() -> list[TraceRow]:
    """``builtin:interactive-week``."""
    return _generate(INTERACTIVE_WEEK_SHAPE, _SEED)


def oversubscribed_week() -> list[TraceRow]:
    """``builtin:oversubscribed-week``."""
    return _generate(OVERSUBSCRIBED_WEEK_SHAPE, _SEED)


BUILTIN_TRACES: dict[str, Callable[[], list[TraceRow]]] = {
    "week": default_trace,
    "busy-week": busy_week,
    "training-week": training_week,
    "interactive-week": interactive_week,
    "oversubscribed-week": oversubscribed_week,
}


#: What Kubeflow's profile controller puts on a profile namespace; every default tenant is one.
PROFILE_NAMESPACE_LABELS = {
    "app.kubernetes.io/part-of": "kubeflow-profile",
    "katib.kubeflow.org/metrics-collector-injection": "enabled",
    "serving.kubeflow.org/inferenceservice": "enabled",
    "pipelines.kubeflow.org/enabled": "true",
}


def default_namespaces() -> dict[str, dict[str, str]]:
    return {namespace: dict(PROFILE_NAMESPACE_LABELS) for namespace in NAMESPACES}
