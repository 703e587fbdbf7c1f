"""The `gpuwarden` command: one module per subcommand under gpuwarden.commands."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence
from typing import Protocol, cast

from gpuwarden.commands.shared import LOG_LEVELS, UsageError

__all__ = [
    "COMMAND_MODULES",
    "LOG_LEVELS",
    "Command",
    "UsageError",
    "build_parser",
    "command",
    "main",
    "version",
]

EXIT_OK = 0
EXIT_DENIED = 1
EXIT_USAGE = 2


class Command(Protocol):
    """A subcommand's module (a DESCRIPTION, laid out by hand, is its --help text if it has one)."""

    HELP: str

    def register(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# Subcommand name -> its module under gpuwarden.commands, in the order --help lists them. A
# module is imported only when its command runs (or --help lists them all), so a long-running
# `gpuwarden serve` or `node-agent` carries none of the other commands' code.
COMMAND_MODULES: dict[str, str] = {
    "lint": "lint",
    "apply": "apply",
    "test": "test",
    "explain": "explain",
    "check-pipeline": "check_pipeline",
    "render": "render",
    "audit": "audit",
    "serve": "serve",
    "certs": "certs",
    "node-agent": "node_agent",
    "tenant-controller": "tenant_controller",
    "pool-controller": "pool_controller",
    "simulate": "simulate",
    "review": "review",
    "usage": "usage",
}


def command(name: str) -> Command:
    """The module of subcommand ``name``."""
    return cast(Command, importlib.import_module(f"gpuwarden.commands.{COMMAND_MODULES[name]}"))


def version() -> str:
    """The installed distribution's version (``unknown`` when run from a bare checkout)."""
    try:
        return importlib.metadata.version("gpuwarden")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or with ``only`` of that one alone (what main() builds
    to run it)."""
    parser = argparse.ArgumentParser(
        prog="gpuwarden",
        description="Multi-tenant GPU governance for Kubeflow: policies, admission webhooks, "
        "node agent and a dry-run CLI.",
    )
    parser.add_argument(
        "--version", action="version", version=f"gpuwarden {version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES if only is None else (only,):
        module = command(name)
        description = getattr(module, "DESCRIPTION", None)
        command_parser = sub.add_parser(
            name,
            help=module.HELP,
            description=description or module.HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter
            if description
            else argparse.HelpFormatter,
        )
        module.register(command_parser)
        command_parser.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The subcommand is the first word that is not an option (the top level has only --help
    # and --version); anything else, or none, gets the whole parser and its message.
    named = next((word for word in argv if not word.startswith("-")), None)
    parser = build_parser(named if named in COMMAND_MODULES else None)
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
