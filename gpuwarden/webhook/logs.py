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
