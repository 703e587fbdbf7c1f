"""Prometheus metrics of one webhook server, in a registry of its own.

With ``--workers N`` every worker writes its values to files in ``PROMETHEUS_MULTIPROC_DIR``
(prometheus-client's multiprocess mode, chosen by that variable before the worker starts) and
every worker's /metrics shows the sum over all of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "gpuwarden_admission_requests_total",
            "Admission reviews answered, by endpoint, decision, tenant and profile.",
            ["endpoint", "decision", "tenant", "profile"],
            registry=r,
        )
        self.audited = Counter(
            "gpuwarden_admission_audit_total",
            "Requests answered under enforcementAction audit or dryrun that enforcing would have "
            "denied (check: the check that would deny) or mutated (check: mutation, dryrun only), "
            "by endpoint, tenant and check.",
            ["endpoint", "tenant", "check"],
            registry=r,
        )
        self.latency = Histogram(
            "gpuwarden_admission_duration_seconds",
            "Time from the request's arrival to its answer.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "gpuwarden_admission_in_flight",
            "Admission requests being read or evaluated now.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.bad_requests = Counter(
            "gpuwarden_admission_bad_requests_total",
            "Requests refused, by endpoint and status code: 4xx as malformed (408: a body not "
            "sent in time), 503 when the request bodies in flight stayed at "
            "--max-body-bytes-in-flight past the deadline.",
            ["endpoint", "code"],
            registry=r,
        )
        self.body_waits = Counter(
            "gpuwarden_admission_body_waits_total",
            "Admission requests that waited for room under --max-body-bytes-in-flight.",
            registry=r,
        )
        self.body_evictions = Counter(
            "gpuwarden_admission_body_evictions_total",
            "Admission requests whose body waited on its client while complete ones waited "
            "for room under --max-body-bytes-in-flight: answered 408 and closed to make room.",
            registry=r,
        )
        self.connections_open = Gauge(
            "gpuwarden_connections_open",
            "Connections held now (in the TLS handshake, between requests or in one), by "
            "listener (https or metrics); at most --max-connections each.",
            ["listener"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.connections_closed = Counter(
            "gpuwarden_connections_closed_total",
            "Connections gpuwarden closed to stay within its bounds, by listener and reason: "
            "limit (the one waiting longest on its client, for a new one past "
            "--max-connections), refused (a new one past the limit while every other was being "
            "answered), handshake_timeout, header_timeout.",
            ["listener", "reason"],
            registry=r,
        )
        self.internal_errors = Counter(
            "gpuwarden_admission_internal_errors_total",
            "Requests whose evaluation failed and were answered by the failure mode.",
            ["endpoint"],
            registry=r,
        )
        self.policy_reloads = Counter(
            "gpuwarden_policy_reloads_total",
            "Policy reload attempts, by result (ok or failed).",
            ["result"],
            registry=r,
        )
        self.policy_last_reload_failed = Gauge(
            "gpuwarden_policy_last_reload_failed",
            "1 while the newest policy files failed to load (the last good set still serves).",
            registry=r,
            multiprocess_mode="max",
        )
        self.policy_loaded = Gauge(
            "gpuwarden_policy_loaded",
            "1 when a valid policy set is being served, 0 when GPU pods are denied for lack of one.",
            registry=r,
            multiprocess_mode="min",
        )
        self.cert_expiry = Gauge(
            "gpuwarden_certificate_expiry_timestamp_seconds",
            "Expiry (Unix time) of the serving certificate in use.",
            registry=r,
            multiprocess_mode="min",
        )
        self.cert_reloads = Counter(
            "gpuwarden_certificate_reloads_total",
            "Serving certificate reloads, by result (ok or failed).",
            ["result"],
            registry=r,
        )
        self.namespace_lookups = Counter(
            "gpuwarden_namespace_lookups_total",
            "Namespaces missing from the watch cache and read live, by result (found or failed; "
            "failed: GPU pods there were refused).",
            ["result"],
            registry=r,
        )
        self.cache_age = Gauge(
            "gpuwarden_namespace_cache_age_seconds",
            "Seconds since the namespace data was last confirmed by the API server (or loaded).",
            registry=r,
            multiprocess_mode="max",
        )
        self.cache_synced = Gauge(
            "gpuwarden_cache_synced",
            "1 once a watch-backed cache has finished its first list.",
            ["resource"],
            registry=r,
            multiprocess_mode="min",
        )
        self.cache_relists = Gauge(
            "gpuwarden_cache_lists",
            "Full lists a watch-backed cache has made (the first, and after 410 Gone or errors).",
            ["resource"],
            registry=r,
            multiprocess_mode="max",
        )
        self.cache_watch_restarts = Gauge(
            "gpuwarden_cache_watch_restarts",
            "Watch streams that ended and were resumed from the last resourceVersion.",
            ["resource"],
            registry=r,
            multiprocess_mode="max",
        )

    def in_flight_gauge(self, count: Callable[[], int]) -> Gauge | None:
        """The in-flight gauge to move as requests come and go, or None where it can read
        ``count`` when scraped instead (one process: no file to write the value to)."""
        if values.ValueClass is not values.MutexValue:
            return self.in_flight
        self.in_flight.set_function(count)
        return None

    def exposition(self) -> bytes:
        """The text format, summed over every worker in multiprocess mode."""
        directory = os.environ.get(MULTIPROC_ENV)
        if directory and Path(directory).is_dir():
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
            return bytes(generate_latest(registry))
        return bytes(generate_latest(self.registry))
