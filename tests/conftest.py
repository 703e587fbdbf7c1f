"""Fixtures every suite shares: one real etcd + kube-apiserver per test session (e2e/fixtures.py).

Defining them here, once, is what makes the session scope real: a star import into several
conftest files would give each its own control plane.
"""

import logging
from collections.abc import Iterator

import pytest
from e2e.fixtures import *  # noqa: F403

#: Loggers `gpuwarden serve` and the CLI configure in-process (gpuwarden.webhook.logs.configure).
_CONFIGURED_LOGGERS = ("gpuwarden", "aiohttp", "aiohttp.access")


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Each test leaves logging as it found it: a command run in-process binds its handler to the
    stderr pytest captured for that test, which is closed once the test ends."""
    saved = [
        (logger, logger.handlers[:], logger.level, logger.propagate)
        for logger in map(logging.getLogger, _CONFIGURED_LOGGERS)
    ]
    yield
    for logger, handlers, level, propagate in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
