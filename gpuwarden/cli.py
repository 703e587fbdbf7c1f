"""The `gpuwarden` command: one module per subcommand under gpuwarden.commands."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence
from typing import Protocol

# Subcommand name -> module in gpuwarden.commands; each module has register() and run().
COMMANDS: dict[str, str] = {
    "lint": "lint",
    "apply": "apply",
    "test": "test",
    "explain": "explain",
    "render": "render",
    "serve": "serve",
    "certs": "certs",
    "node-agent": "node_agent",
    "simulate": "simulate",
    "review": "review",
}

#: The --log-level choices of every command that has one.
LOG_LEVELS = ("debug", "info", "warning", "error")

EXIT_OK = 0
EXIT_DENIED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A command was given what it cannot use: ``error: <message>`` and exit status 2."""


class Command(Protocol):
    HELP: str

    def register(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _load(module: str) -> Command | None:
    try:
        loaded: Command = importlib.import_module(f"gpuwarden.commands.{module}")
    except ModuleNotFoundError as exc:
        if exc.name == f"gpuwarden.commands.{module}":
            return None
        raise
    return loaded


def version() -> str:
    """The installed distribution's version (``unknown`` when run from a bare checkout)."""
    try:
        return importlib.metadata.version("gpuwarden")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwarden",
        description="Multi-tenant GPU governance for Kubeflow: policies, admission webhooks, "
        "node agent and a dry-run CLI.",
    )
    parser.add_argument(
        "--version", action="version", version=f"gpuwarden {version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        command = _load(module)
        if command is None:
            continue
        # A command's DESCRIPTION (laid out by hand, e.g. a file format) is its --help text.
        description = getattr(command, "DESCRIPTION", None)
        command_parser = sub.add_parser(
            name,
            help=command.HELP,
            description=description or command.HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter
            if description
            else argparse.HelpFormatter,
        )
        command.register(command_parser)
        command_parser.set_defaults(handler=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
