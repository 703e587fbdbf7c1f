"""``serve --workers N``: N server processes sharing the port, supervised by the parent."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpuwarden.webhook import logs
from gpuwarden.webhook.metrics import MULTIPROC_ENV
from gpuwarden.webhook.server import ServeConfig, ServeError, WebhookServer, prepare_certificates

log = logging.getLogger("gpuwarden.webhook")


def _worker(config: ServeConfig) -> None:
    logs.configure(config.log_level)
    try:
        asyncio.run(WebhookServer(config).run())
    except ServeError as exc:
        log.error("cannot serve", extra={"fields": {"error": str(exc)}})
        raise SystemExit(2) from exc
    except OSError as exc:
        # A port in use: one log line, not a worker's traceback (the parent stops the others).
        log.error("cannot listen", extra={"fields": {"error": str(exc)}})
        raise SystemExit(2) from exc


def serve(config: ServeConfig) -> int:
    """Run the server in this process, or as ``config.workers`` processes sharing the port."""
    if config.workers <= 1:
        try:
            asyncio.run(WebhookServer(config).run())
        except ServeError as exc:
            log.error("cannot serve", extra={"fields": {"error": str(exc)}})
            return 2
        return 0
    return _serve_workers(config)


def _serve_workers(config: ServeConfig) -> int:
    try:
        for line in prepare_certificates(config):
            log.info(line)
    except ServeError as exc:
        log.error("cannot serve", extra={"fields": {"error": str(exc)}})
        return 2
    with tempfile.TemporaryDirectory(prefix="gpuwarden-metrics-") as metrics_dir:
        # Set before the workers start: prometheus-client picks its storage at import time.
        os.environ[MULTIPROC_ENV] = metrics_dir
        spawn = multiprocessing.get_context("spawn")
        workers = [
            spawn.Process(
                target=_worker,
                args=(replace(config, reuse_port=True, leader=index == 0),),
                name=f"gpuwarden-worker-{index}",
            )
            for index in range(config.workers)
        ]
        return _supervise(workers)


def _supervise(workers: Sequence[Any]) -> int:
    stopping = False

    def forward(signum: int, _: object) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.is_alive() and worker.pid is not None:
                os.kill(worker.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for worker in workers:
            worker.start()
        log.info("workers started", extra={"fields": {"pids": [w.pid for w in workers]}})
        code = 0
        remaining = list(workers)
        while remaining:
            for worker in list(remaining):
                worker.join(timeout=0.2)
                if worker.exitcode is None:
                    continue
                remaining.remove(worker)
                if worker.exitcode != 0:
                    code = max(code, 1 if worker.exitcode < 0 else worker.exitcode)
                if not stopping:
                    log.error(
                        "a worker exited; stopping the others",
                        extra={"fields": {"pid": worker.pid, "exitcode": worker.exitcode}},
                    )
                    code = max(code, 1)
                    forward(signal.SIGTERM, None)
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
