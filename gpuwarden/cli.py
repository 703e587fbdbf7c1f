"""The `gpuwarden` command: one module per subcommand under gpuwarden.commands."""

from __future__ import annotations

import argparse
import importlib
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
}

EXIT_OK = 0
EXIT_DENIED = 1
EXIT_USAGE = 2


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwarden",
        description="Multi-tenant GPU governance for Kubeflow: policies, admission webhooks, "
        "node agent and a dry-run CLI.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        command = _load(module)
        if command is None:
            continue
        command_parser = sub.add_parser(name, help=command.HELP, description=command.HELP)
        command.register(command_parser)
        command_parser.set_defaults(handler=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
