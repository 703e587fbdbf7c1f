"""Structured logs: one JSON object per line, on stderr."""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, TextIO

ADMISSION_LOGGER = "gpuwarden.admission"


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
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


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


class AdmissionLog:
    """The one line per admission, on the hot path.

    When gpuwarden's JSON handler is configured (``configure``), lines go straight to its
    stream, in the same format, without building a LogRecord each time; otherwise through the
    ``gpuwarden.admission`` logger (so test capture and other handlers still see them).
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self._logger = logging.getLogger(ADMISSION_LOGGER)
        self._stream = stream if stream is not None else _json_stream()

    def write(self, fields: dict[str, Any]) -> None:
        if not self._logger.isEnabledFor(logging.INFO):
            return
        stream = self._stream
        if stream is None:
            self._logger.info("admission", extra={"fields": fields})
            return
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
        line = {"ts": now, "level": "info", "logger": ADMISSION_LOGGER, "msg": "admission"}
        line.update(fields)
        stream.write(json.dumps(line, default=str, ensure_ascii=False) + "\n")
        stream.flush()


def _json_stream() -> TextIO | None:
    for handler in logging.getLogger("gpuwarden").handlers:
        if isinstance(handler, logging.StreamHandler) and isinstance(
            handler.formatter, JSONFormatter
        ):
            stream: TextIO = handler.stream
            return stream
    return None
