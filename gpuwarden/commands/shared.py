"""What the commands share with the `gpuwarden` entry point (gpuwarden.cli)."""

from __future__ import annotations

#: The --log-level choices of every command that has one.
LOG_LEVELS = ("debug", "info", "warning", "error")


class UsageError(Exception):
    """A command was given what it cannot use: ``error: <message>`` and exit status 2."""
