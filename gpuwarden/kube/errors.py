"""One-line texts for what the API server answered, or why it could not be reached."""

from __future__ import annotations

import json
from collections.abc import Mapping

import urllib3
from kubernetes.client.exceptions import ApiException

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


def api_error_text(exc: ApiException) -> str:
    """``403 Forbidden: <the API server's own message>`` on one line."""
    text = f"{exc.status} {exc.reason}"
    try:
        status = json.loads(exc.body) if exc.body else None
    except (TypeError, ValueError):
        status = None
    message = status.get("message") if isinstance(status, Mapping) else None
    if isinstance(message, str) and message:
        text += f": {message}"
    return " ".join(text.split())


def transport_error_text(exc: urllib3.exceptions.HTTPError) -> str:
    reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
    return " ".join(f"cannot reach the API server: {reason}".split())
