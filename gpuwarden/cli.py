"""The `gpuwarden` command: one module per subcommand under gpuwarden.commands."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence
from typing import Protocol

from gpuwarden.commands import (
    apply,
    audit,
    certs,
    check_pipeline,
    explain,
    lint,
    node_agent,
    render,
    review,
    serve,
    simulate,
    tenant_controller,
    test,
    usage,
)
from gpuwarden.commands.shared import LOG_LEVELS, UsageError

__all__ = ["COMMANDS", "LOG_LEVELS", "Command", "UsageError", "build_parser", "main", "version"]

EXIT_OK = 0
EXIT_DENIED = 1
EXIT_USAGE = 2


class Command(Protocol):
    """A subcommand's module (a DESCRIPTION, laid out by hand, is its --help text if it has one)."""

    HELP: str

    def register(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# Subcommand name -> its module, in the order --help lists them.
COMMANDS: dict[str, Command] = {
    "lint": lint,
    "apply": apply,
    "test": test,
    "explain": explain,
    "check-pipeline": check_pipeline,
    "render": render,
    "audit": audit,
    "serve": serve,
    "certs": certs,
    "node-agent": node_agent,
    "tenant-controller": tenant_controller,
    "simulate": simulate,
    "review": review,
    "usage": usage,
}


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
    for name, command in COMMANDS.items():
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
