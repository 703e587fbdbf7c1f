"""Structured logs: one JSON object per line, on stderr."""

from __future__ import annotations

import asyncio
import datetime
import logging
import sys
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, TextIO

import orjson

ADMISSION_LOGGER = "gpuwarden.admission"
_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS
# A field's text is cut to this many characters: request fields (a uid, a pod's name) come
# from the caller and would otherwise be copied whole into each line that names them.
MAX_FIELD_CHARS = 256


def bounded(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields with every string longer than MAX_FIELD_CHARS cut, saying how long it was."""
    # A loop, not any() over a generator: this runs for every admission line.
    for value in fields.values():
        if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
            break
    else:
        return fields
    return {
        key: f"{value[:MAX_FIELD_CHARS]}...({len(value)} characters)"
        if isinstance(value, str) and len(value) > MAX_FIELD_CHARS
        else value
        for key, value in fields.items()
    }


def json_line(fields: dict[str, Any]) -> str:
    """One log line's JSON (anything orjson cannot encode is written as its ``str``)."""
    return orjson.dumps(fields, default=str, option=_JSON_OPTIONS).decode()


class JSONFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...fields}``; fields come from ``extra={"fields": {}}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(bounded(fields))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json_line(out)


def configure(level: str = "info", stream: TextIO | None = None) -> None:
    """Send every gpuwarden log record to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger("gpuwarden")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    # aiohttp's access log duplicates the admission line; its errors still come through.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    aiohttp_log = logging.getLogger("aiohttp")
    aiohttp_log.handlers[:] = [handler]
    aiohttp_log.propagate = False


# What every admission line starts with after its timestamp, as a dict and as its JSON.
_ADMISSION_HEAD = MappingProxyType(
    {"level": "info", "logger": ADMISSION_LOGGER, "msg": "admission"}
)
_ADMISSION_HEAD_KEYS = frozenset({"ts", *_ADMISSION_HEAD})
# What follows the milliseconds in a line, up to its fields.
_ADMISSION_MIDDLE = '+00:00",' + orjson.dumps(dict(_ADMISSION_HEAD)).decode()[1:-1] + ","


class AdmissionLog:
    """The one line per admission, on the hot path.

    When gpuwarden's JSON handler is configured (``configure``), lines go straight to its
    stream, in the same format, without building a LogRecord each time. Lines written while
    the event loop runs are flushed together at the end of the loop's current iteration: one
    write for every request answered in it, and none waits longer than that. Otherwise lines
    go through the ``gpuwarden.admission`` logger (so test capture and other handlers see them).
    """

    def __init__(
        self, stream: TextIO | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self._logger = logging.getLogger(ADMISSION_LOGGER)
        self._stream = stream if stream is not None else _json_stream()
        self._clock = clock
        self._pending: list[str] = []
        self._second = -1
        self._second_text = ""
        # A line's text up to its milliseconds, for the current second.
        self._line_start = ""

    def _now(self) -> tuple[str, int]:
        """The time as JSONFormatter writes it (ISO 8601, UTC) up to the second, formatted once
        a second, and the milliseconds."""
        now = self._clock()
        second = int(now)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._line_start = f'{{"ts":"{self._second_text}.'
        return self._second_text, int((now - second) * 1000)

    def write(self, fields: dict[str, Any]) -> None:
        if not self._logger.isEnabledFor(logging.INFO):
            return
        if self._stream is None:
            self._logger.info("admission", extra={"fields": bounded(fields)})
            return
        if not fields or not fields.keys().isdisjoint(_ADMISSION_HEAD_KEYS):
            second, milliseconds = self._now()
            ts = f"{second}.{milliseconds:03d}+00:00"
            line = orjson.dumps({"ts": ts, **_ADMISSION_HEAD, **bounded(fields)}, default=str)
            self._queue(line.decode())
            return
        # The line JSONFormatter would write, joined from its fixed head and the fields encoded
        # alone (their opening brace dropped): no second dict, one encoding.
        encoded = orjson.dumps(bounded(fields), default=str)
        _, milliseconds = self._now()
        self._queue(
            f"{self._line_start}{milliseconds:03d}{_ADMISSION_MIDDLE}{encoded[1:].decode()}"
        )

    def _queue(self, line: str) -> None:
        self._pending.append(line)
        if len(self._pending) > 1:
            return  # a flush is already scheduled
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:
            self.flush()

    def flush(self) -> None:
        """Write the lines not written yet."""
        if not self._pending or self._stream is None:
            return
        text = "\n".join(self._pending) + "\n"
        self._pending.clear()
        self._stream.write(text)
        self._stream.flush()


def _json_stream() -> TextIO | None:
    for handler in logging.getLogger("gpuwarden").handlers:
        if isinstance(handler, logging.StreamHandler) and isinstance(
            handler.formatter, JSONFormatter
        ):
            stream: TextIO = handler.stream
            return stream
    return None
