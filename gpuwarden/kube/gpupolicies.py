"""GPUPolicy objects: a watch-backed cache of them, and the writer of each one's ``status``.

The webhook serves the objects of the ``gpupolicies.gpuwarden.io`` CRD with its policy files
(gpuwarden.webhook.policies decides what each one's current generation comes to). Here:

* :class:`GPUPolicyWatch` lists and watches the objects (an :class:`Informer`: relist after 410
  Gone, back off on errors) into a cache of :class:`PolicyObject`. A cluster without the CRD
  (404) has no objects: the policy files serve alone, and readiness says why.
* :class:`StatusWriter` writes each object's ``status`` through the status subresource: a
  ``Ready`` condition (``True``/``Valid``, or ``False``/``Invalid`` with the loader's message
  naming the field) and the generation it judged. It writes only what differs from the stored
  status (so an echo of its own write, or the other replica's identical one, costs nothing),
  with the resourceVersion it judged as a precondition (a status never lands on a generation it
  was not computed for), and retries the same status at most every ``retry_after`` seconds: two
  replicas that disagree for a while (one has new policy files a moment before the other) do not
  overwrite each other in a loop.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from gpuwarden.kube.errors import (
    HTTP_CONFLICT,
    HTTP_NOT_FOUND,
    api_error_text,
    transport_error_text,
)
from gpuwarden.kube.informer import Informer, MappingSink, Obj
from gpuwarden.policy.pod import keys
from gpuwarden.policy.spec.composition import ObjectVerdict, PolicyObject
from gpuwarden.policy.spec.schema import CRD_NAME, CRD_PLURAL, CRD_VERSION

log = logging.getLogger("gpuwarden.kube")

READY = "Ready"
REASON_VALID = "Valid"
REASON_INVALID = "Invalid"
VALID_MESSAGE = "in force: served with the policy files and the other valid GPUPolicy objects"
# A condition's message is at most 32768 characters (metav1.Condition); a loader message that
# long would be hundreds of issues: keep the first ones.
MAX_MESSAGE = 8192
HTTP_FORBIDDEN = 403
_WRITE_TIMEOUT = 10.0


def policy_object(obj: Obj) -> PolicyObject | None:
    """The cache's view of a GPUPolicy as the API server returns it; None without a name."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    name: str = meta["name"]
    spec = obj.get("spec")
    status = obj.get("status")
    generation = meta.get("generation")
    return PolicyObject(
        name=name,
        uid=str(meta.get("uid") or ""),
        generation=generation if isinstance(generation, int) else 0,
        resource_version=str(meta.get("resourceVersion") or ""),
        document={
            "apiVersion": obj.get("apiVersion", keys.API_VERSION),
            "kind": obj.get("kind", keys.POLICY_KIND),
            "metadata": {"name": name},
            "spec": spec if spec is not None else {},
        },
        status=status if isinstance(status, Mapping) else {},
    )


# --- status -----------------------------------------------------------------------------------


def ready_condition(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == READY:
            return condition
    return None


def _message(verdict: ObjectVerdict) -> str:
    if verdict.valid:
        return VALID_MESSAGE
    text = verdict.message or "invalid"
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def desired_status(verdict: ObjectVerdict, current: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The status an object should have for ``verdict``. It depends on nothing local to one
    replica (which generation a replica still serves is in its /readyz, not here), so replicas
    that judge alike write alike. ``lastTransitionTime`` moves only when Ready changes."""
    state = "True" if verdict.valid else "False"
    previous = ready_condition(current)
    since = now
    if previous is not None and previous.get("status") == state:
        since = str(previous.get("lastTransitionTime") or now)
    return {
        "observedGeneration": verdict.generation,
        "conditions": [
            {
                "type": READY,
                "status": state,
                "observedGeneration": verdict.generation,
                "lastTransitionTime": since,
                "reason": REASON_VALID if verdict.valid else REASON_INVALID,
                "message": _message(verdict),
            }
        ],
    }


def _judged(status: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a status says, without the time it says it since."""
    condition = ready_condition(status) or {}
    return (
        status.get("observedGeneration"),
        condition.get("status"),
        condition.get("observedGeneration"),
        condition.get("reason"),
        condition.get("message"),
    )


def same_status(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    return _judged(current) == _judged(desired)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusWriter:
    """Writes each object's status from the latest verdicts, on a thread of its own.

    ``patch(name, body)`` is a merge patch of the object's status subresource; ``objects()`` is
    the cache. :meth:`report` (any thread) hands new verdicts over; :meth:`wake` says the cache
    changed. Without a thread (tests), :meth:`write_due` does one round.
    """

    def __init__(
        self,
        patch: Callable[[str, Mapping[str, Any]], object],
        objects: Callable[[], Mapping[str, PolicyObject]],
        *,
        retry_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], str] = _now,
    ) -> None:
        self._patch = patch
        self._objects = objects
        self._retry_after = retry_after
        self._clock = clock
        self._now = now
        self._lock = threading.Lock()
        self._verdicts: Mapping[str, ObjectVerdict] = {}
        # name -> (what was attempted, when): the same status is not attempted again sooner
        # than retry_after, whether it failed or another writer has since changed it.
        self._attempts: dict[str, tuple[tuple[Any, ...], float]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0
        self.last_error: str | None = None

    def report(self, verdicts: Mapping[str, ObjectVerdict]) -> None:
        with self._lock:
            self._verdicts = dict(verdicts)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def write_due(self) -> None:
        """Write every status that differs from the verdict for the object's generation."""
        with self._lock:
            verdicts = self._verdicts
        objects = self._objects()
        for name in [name for name in self._attempts if name not in objects]:
            del self._attempts[name]
        for name, verdict in sorted(verdicts.items()):
            if self._stop.is_set():
                return
            stored = objects.get(name)
            if stored is None or (stored.uid, stored.generation) != (
                verdict.uid,
                verdict.generation,
            ):
                continue  # deleted or changed since: a newer verdict will come
            desired = desired_status(verdict, stored.status, self._now())
            if same_status(stored.status, desired):
                continue
            key = (stored.uid, *_judged(desired))
            attempted = self._attempts.get(name)
            if (
                attempted is not None
                and attempted[0] == key
                and self._clock() - attempted[1] < self._retry_after
            ):
                continue
            self._attempts[name] = (key, self._clock())
            self._write(stored, desired)

    def _write(self, stored: PolicyObject, desired: Mapping[str, Any]) -> None:
        body = {"metadata": {"resourceVersion": stored.resource_version}, "status": desired}
        what = f"gpupolicy/{stored.name}"
        try:
            self._patch(stored.name, body)
        except ApiException as exc:
            if exc.status in (HTTP_CONFLICT, HTTP_NOT_FOUND):
                # Changed or deleted since it was judged: the watch brings what happened, and
                # the status is judged again against that (at once, not after retry_after).
                self._attempts.pop(stored.name, None)
                log.debug("%s: status not written: %s", what, api_error_text(exc))
                return
            hint = ""
            if exc.status == HTTP_FORBIDDEN:
                hint = f" (the webhook needs patch on {CRD_PLURAL}/status)"
            self._failed(f"{what}: cannot write status: {api_error_text(exc)}{hint}")
            return
        except urllib3.exceptions.HTTPError as exc:
            self._failed(f"{what}: cannot write status: {transport_error_text(exc)}")
            return
        self.writes += 1
        self.last_error = None
        condition = desired["conditions"][0]
        log.info(
            "GPUPolicy status written",
            extra={
                "fields": {
                    "gpupolicy": stored.name,
                    "generation": desired["observedGeneration"],
                    "ready": condition["status"],
                    "reason": condition["reason"],
                }
            },
        )

    def _failed(self, message: str) -> None:
        self.last_error = message
        log.warning("%s", message)

    # The thread ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpupolicy-status", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            # Woken by new verdicts or a cache change; else look again when a deferred retry
            # may be due.
            self._wake.wait(self._retry_after)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.write_due()
            except Exception:  # a bug here must not end status writes for good
                log.exception("writing GPUPolicy status failed")


# --- the watch ----------------------------------------------------------------------------------


class GPUPolicyWatch:
    """The GPUPolicy objects the API server has, and (``write_status``) their status writer.

    What gpuwarden.webhook.policies reads as its source of objects.
    """

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        watch_timeout: int = 300,
        write_status: bool = True,
        retry_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._custom = k8s_client.CustomObjectsApi(api)
        self._watch_timeout = watch_timeout
        self._crd_missing = False
        self.writer = (
            StatusWriter(self._patch_status, self.objects, retry_after=retry_after, clock=clock)
            if write_status
            else None
        )
        self.cache: MappingSink[PolicyObject] = MappingSink(self._changed)
        self.informer: Informer[PolicyObject] = Informer(
            CRD_PLURAL,
            self._list,
            policy_object,
            self.cache,
            watch_timeout=watch_timeout,
            clock=clock,
        )

    def _list(self, **kwargs: Any) -> Any:
        """List or (watch=True) watch the objects, noting whether the CRD is installed."""
        try:
            response = self._custom.list_cluster_custom_object(
                keys.API_GROUP, CRD_VERSION, CRD_PLURAL, **kwargs
            )
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                self._crd_missing = True
            raise
        self._crd_missing = False
        return response

    def _patch_status(self, name: str, body: Mapping[str, Any]) -> object:
        return self._custom.patch_cluster_custom_object_status(
            keys.API_GROUP,
            CRD_VERSION,
            CRD_PLURAL,
            name,
            dict(body),
            field_manager="gpuwarden",
            _content_type="application/merge-patch+json",
            _request_timeout=_WRITE_TIMEOUT,
        )

    def _changed(self) -> None:
        if self.writer is not None:
            self.writer.wake()

    @property
    def crd_missing(self) -> bool:
        return self._crd_missing

    @property
    def synced(self) -> bool:
        """Every object is in the cache (or there is no CRD, so there are none)."""
        return self.informer.synced or self._crd_missing

    def objects(self) -> Mapping[str, PolicyObject]:
        return self.cache.snapshot

    def report(self, verdicts: Mapping[str, ObjectVerdict]) -> None:
        if self.writer is not None:
            self.writer.report(verdicts)

    def missing(self) -> list[str]:
        if self.synced:
            return []
        error = self.informer.stats.last_error
        hint = ""
        if error and error.startswith(f"API error {HTTP_FORBIDDEN}"):
            hint = (
                f" (the webhook needs list and watch on {CRD_NAME}, or serve --no-watch-policies)"
            )
        return ["GPUPolicy objects not synced yet" + (f": {error}{hint}" if error else "")]

    def notes(self) -> list[str]:
        out = []
        if self._crd_missing:
            out.append(
                f"the GPUPolicy CRD ({CRD_NAME}) is not installed: only the policy files serve"
            )
        age = self.informer.age()
        if self.informer.synced and age is not None and age > 3 * self._watch_timeout + 60:
            out.append(f"GPUPolicy objects last confirmed by the API server {age:.0f}s ago")
        if self.writer is not None and self.writer.last_error:
            out.append(self.writer.last_error)
        return out

    def start(self) -> None:
        self.informer.start()
        if self.writer is not None:
            self.writer.start()

    def stop(self) -> None:
        self.informer.stop()
        if self.writer is not None:
            self.writer.stop()
