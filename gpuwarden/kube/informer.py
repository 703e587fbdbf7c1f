"""List + watch one kind of object into a local store, the way client-go's reflector does.

* List (paged) to get every object and the collection's resourceVersion; replace the store.
* Watch from that resourceVersion (with bookmarks); apply ADDED / MODIFIED / DELETED and keep
  the last resourceVersion seen.
* When a watch stream ends (the server's or our ``timeout_seconds``), watch again from the last
  resourceVersion: nothing is missed and nothing is listed again.
* When the server answers 410 Gone (the resourceVersion is too old), list again from scratch.
* Any other failure (network, 5xx): back off and list again.

The store is fed to a :class:`Sink`, which keeps whatever projection its readers need and
publishes it as an immutable snapshot, so readers on other threads never take a lock.
"""

from __future__ import annotations

import codecs
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)
Obj = Mapping[str, Any]

HTTP_GONE = 410
# Objects per page of a list. A page is read as it arrives and parsed one object at a time (only
# the object being parsed is held), where it was held whole and parsed at once, 500 objects of up
# to the 1.5 MiB etcd allows (issue 29 item 5: 150 ConfigMaps of 1 MB peaked at 562 MiB, and a
# restart was OOM-killed under the chart's 512Mi limit). Smaller pages also bound what the API
# server assembles for one answer.
_PAGE_SIZE = 50
# (connect, read) seconds for each page of a list: without it, a list sent on a dead
# connection blocks the informer for good (the watch has its own timeout).
_LIST_TIMEOUT = (10, 60)

log = logging.getLogger("gpuwarden.kube")


class Sink(Protocol[T_contra]):
    """Receives the store's changes (on the informer's thread)."""

    def replace(self, items: Mapping[str, T_contra]) -> None: ...

    def upsert(self, key: str, item: T_contra) -> None: ...

    def delete(self, key: str) -> None: ...


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = str(meta.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


def _raw_events(list_func: Callable[..., Any]) -> Callable[..., Any]:
    """``list_func`` without the docstring the client reads the model type from.

    Given a typed list method, ``watch.Watch`` re-serializes every event's object and builds a
    model of it (a V1Pod, a V1ConfigMap with all its data) that the informer never reads; given
    this wrapper it yields the parsed JSON only (``raw_object``), errors and 410 Gone included.
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        return list_func(*args, **kwargs)

    return call


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
# Bytes read from a list response at a time: an object is parsed once the text holds it whole,
# so a chunk near the largest object's size (etcd takes 1.5 MiB) parses each about once.
_CHUNK = 1 << 20


class _Text:
    """A JSON text read from ``chunks`` as parsing needs it; what was parsed is dropped, so only
    about a chunk and the object being parsed are held."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._text = ""
        self._at = 0
        self._done = False

    def _more(self) -> bool:
        if self._done:
            return False
        chunk = next(self._chunks, None)
        if self._at:
            self._text, self._at = self._text[self._at :], 0
        if chunk is None:
            self._text += self._decoder.decode(b"", final=True)
            self._done = True
        else:
            self._text += self._decoder.decode(chunk)
        return True

    def peek(self) -> str:
        """The next character after whitespace ("" at the end)."""
        while True:
            self._at = _SPACE.match(self._text, self._at).end()  # type: ignore[union-attr]
            if self._at < len(self._text) or not self._more():
                return self._text[self._at : self._at + 1]

    def take(self, char: str) -> None:
        if self.peek() != char:
            raise ValueError(f"expected {char!r} in a list response")
        self._at += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._text, self._at)
            except ValueError:
                if self._more():
                    continue  # cut off by the end of the chunk
                raise
            # A number at the very end may go on in the next chunk.
            if end < len(self._text) or not self._more():
                self._at = end
                return value


def list_fields(chunks: Iterable[bytes], on_item: Callable[[Any], None]) -> dict[str, Any]:
    """The fields of a list response (a JSON object, read from ``chunks``) but ``items``, whose
    elements go to ``on_item`` as each is parsed: one object of the page is held parsed at a
    time, and neither the page's bytes nor its text are held whole. Raises ValueError on text
    that is not such an object."""
    text = _Text(chunks)
    fields: dict[str, Any] = {}
    text.take("{")
    if text.peek() == "}":
        return fields
    while True:
        key = text.value()
        text.take(":")
        if key == "items" and text.peek() == "[":
            text.take("[")
            while text.peek() != "]":
                on_item(text.value())
                if text.peek() == ",":
                    text.take(",")
                elif text.peek() != "]":
                    raise ValueError("expected ',' or ']' in a list response")
            text.take("]")
        else:
            fields[str(key)] = text.value()
        if text.peek() == "}":
            return fields
        text.take(",")


def _resource_version(obj: Obj) -> str | None:
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        rv = meta.get("resourceVersion")
        return str(rv) if rv else None
    return None


@dataclass
class InformerStats:
    """Counters a reader (metrics, readiness) may look at; written by the informer thread only."""

    lists: int = 0
    relists_after_gone: int = 0
    watch_restarts: int = 0
    errors: int = 0
    events: int = 0
    last_contact: float | None = None
    last_error: str | None = None
    resource_version: str | None = None


class Informer(Generic[T]):
    """One resource's list+watch loop on a daemon thread.

    ``list_func`` is a kubernetes client list method (``CoreV1Api.list_namespace``,
    ``CoreV1Api.list_pod_for_all_namespaces``, ...). ``transform`` maps a raw object to what the
    sink keeps; returning None drops it (as if deleted).
    """

    def __init__(
        self,
        name: str,
        list_func: Callable[..., Any],
        transform: Callable[[Obj], T | None],
        sink: Sink[T],
        *,
        watch_timeout: int = 300,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._list_func = list_func
        self._watch_func = _raw_events(list_func)
        self._transform = transform
        self._sink = sink
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._clock = clock
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self.stats = InformerStats()

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def age(self) -> float | None:
        """Seconds since the API server last confirmed this cache (list, event or bookmark)."""
        last = self.stats.last_contact
        return None if last is None else max(self._clock() - last, 0.0)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        current = self._watch
        if current is not None:
            current.stop()  # type: ignore[no-untyped-call]
        if self._thread is not None:
            self._thread.join(timeout)

    # The loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        delay = self._backoff
        while not self._stop.is_set():
            try:
                version = self._list()
                delay = self._backoff
                self._watch_from(version)
            except ApiException as exc:
                if self._stop.is_set():
                    return
                if exc.status == HTTP_GONE:
                    self.stats.relists_after_gone += 1
                    log.info("%s: resourceVersion expired (410 Gone); listing again", self.name)
                    continue
                self._failed(f"API error {exc.status}: {exc.reason}")
            except Exception as exc:  # network errors of every kind end up here
                if self._stop.is_set():
                    return
                self._failed(f"{type(exc).__name__}: {exc}")
            else:
                continue
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, self._max_backoff)

    def _failed(self, message: str) -> None:
        self.stats.errors += 1
        self.stats.last_error = message
        log.warning("%s: list/watch failed, retrying: %s", self.name, message)

    def _list(self) -> str:
        items: dict[str, T] = {}

        def keep(obj: Any) -> None:
            if isinstance(obj, Mapping):
                value = self._transform(obj)
                if value is not None:
                    items[object_key(obj)] = value

        token: str | None = None
        version = ""
        while True:
            kwargs: dict[str, Any] = {
                "limit": _PAGE_SIZE,
                "_preload_content": False,
                "_request_timeout": _LIST_TIMEOUT,
            }
            if token:
                kwargs["_continue"] = token
            response = self._list_func(**kwargs)
            try:
                meta = list_fields(response.stream(_CHUNK), keep).get("metadata") or {}
            finally:
                response.release_conn()
            version = str(meta.get("resourceVersion") or version)
            token = meta.get("continue") or None
            if not token:
                break
        self._sink.replace(items)
        self.stats.lists += 1
        self.stats.resource_version = version
        self.stats.last_contact = self._clock()
        self._synced.set()
        return version

    def _watch_from(self, version: str) -> None:
        while not self._stop.is_set():
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            self._watch = stream
            # With timeout_seconds the client never retries on its own: a 410 reaches us.
            for event in stream.stream(  # type: ignore[no-untyped-call]
                self._watch_func,
                resource_version=version,
                timeout_seconds=self._watch_timeout,
                allow_watch_bookmarks=True,
                # A half-open connection must not hang the loop past the server's timeout.
                _request_timeout=self._watch_timeout + 30,
            ):
                if self._stop.is_set():
                    return  # stopped while waiting for this event: the store stays as it was
                version = self._apply(event) or version
                self.stats.resource_version = version
            self._watch = None
            self.stats.watch_restarts += 1
            self.stats.last_contact = self._clock()

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        obj = event.get("raw_object")
        if not isinstance(obj, Mapping):
            return None
        version = _resource_version(obj)
        self.stats.last_contact = self._clock()
        if kind == "BOOKMARK":
            return version
        self.stats.events += 1
        key = object_key(obj)
        if kind == "DELETED":
            self._sink.delete(key)
        elif kind in ("ADDED", "MODIFIED"):
            value = self._transform(obj)
            if value is None:
                self._sink.delete(key)
            else:
                self._sink.upsert(key, value)
        return version


class MappingSink(Generic[T]):
    """Keeps ``key -> item`` and publishes a fresh read-only copy after every change.

    The informer's thread writes it, and so may :meth:`add_missing` from another thread (a live
    read of an object the watch has not delivered yet); a lock keeps each change whole.
    """

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._items: dict[str, T] = {}
        self.snapshot: Mapping[str, T] = {}
        self._on_change = on_change
        self._lock = threading.Lock()

    def _publish(self) -> None:
        self.snapshot = dict(self._items)
        if self._on_change is not None:
            self._on_change()

    def replace(self, items: Mapping[str, T]) -> None:
        with self._lock:
            self._items = dict(items)
            self._publish()

    def upsert(self, key: str, item: T) -> None:
        with self._lock:
            if self._items.get(key) == item:
                return
            self._items[key] = item
            self._publish()

    def delete(self, key: str) -> None:
        with self._lock:
            if self._items.pop(key, None) is not None:
                self._publish()

    def add_missing(self, key: str, item: T) -> bool:
        """Add ``item`` unless ``key`` is there already; True if it was added.

        For what was read outside the watch: whatever the watch delivered meanwhile is at least
        as new, so it wins.
        """
        with self._lock:
            if key in self._items:
                return False
            self._items[key] = item
            self._publish()
            return True
