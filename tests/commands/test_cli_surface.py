"""The CLI's surface (issue 21, items 4 and 7): every command's --help, the options every
command shares, and dry runs that say what they assume of the cluster."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.cli import LOG_LEVELS, build_parser, main, version

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
EXAMPLES = ROOT / "examples"
NAMESPACES = EXAMPLES / "namespaces.yaml"
NOTEBOOK = EXAMPLES / "notebook.yaml"


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command and subcommand parser, by its argv path (``certs issue``...)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from commands(sub, (*path, name))


COMMANDS = dict(commands(build_parser()))
# Commands whose options are only subcommands (certs): their --help lists ACTION.
LEAVES = {
    path: parser
    for path, parser in COMMANDS.items()
    if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"gpuwarden {version()}\n"


def test_every_command_is_listed() -> None:
    top = {path[0] for path in COMMANDS}
    assert top >= {"lint", "apply", "test", "explain", "render", "serve", "certs", "review"}
    assert {("certs", a) for a in ("issue", "inject", "rotate", "sync")} <= set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_help_describes_every_option(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: gpuwarden {' '.join(path)} ")
    undescribed = [
        "/".join(action.option_strings) or action.dest
        for action in COMMANDS[path]._actions
        if not isinstance(action, argparse._SubParsersAction)
        and (not action.help or not action.help.strip() or action.help == argparse.SUPPRESS)
    ]
    assert undescribed == [], f"gpuwarden {' '.join(path)}: options without help"
    for action in COMMANDS[path]._actions:
        for flag in action.option_strings:
            assert flag in out


def test_log_level_has_one_set_of_choices() -> None:
    levels = {
        path: tuple(action.choices or ())
        for path, parser in LEAVES.items()
        for action in parser._actions
        if "--log-level" in action.option_strings
    }
    assert set(levels) >= {("serve",), ("node-agent",)}
    assert set(levels.values()) == {LOG_LEVELS}


@pytest.mark.parametrize(
    "command", ["lint", "apply", "explain", "test", "render", "simulate", "serve"]
)
def test_commands_that_read_policies_take_p(command: str) -> None:
    flags = {flag for action in COMMANDS[(command,)]._actions for flag in action.option_strings}
    assert {"-p", "--policies"} <= flags


# --- lint: positional paths, -p, or both ---------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [str(POLICIES)],
        ["-p", str(POLICIES)],
        ["--policies", str(POLICIES / "default.yaml")],
    ],
)
def test_lint_takes_paths_and_p(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "lint", *argv)
    assert (code, out.split(",")[0]) == (0, "ok: 1 policies")


def test_lint_reads_positional_and_p_paths_together(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text("profiles: [{name: a, maxMemory: 1Gi}]\n")
    code, out, _ = run(capsys, "lint", str(POLICIES), "-p", str(extra))
    assert (code, out.split(",")[0]) == (0, "ok: 2 policies")


def test_lint_without_policies_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "lint")
    assert (code, out) == (2, "")
    assert err == "error: no policies given: name policy files or directories (PATH or -p PATH)\n"


# --- dry runs say what they assume (item 4) ------------------------------------------------


def test_namespace_given_a_file_is_refused_with_the_flag_meant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(
        capsys, "apply", "-p", str(POLICIES), "--namespace", str(NAMESPACES), str(NOTEBOOK)
    )
    assert (code, out) == (2, "")
    assert err == (
        f"error: --namespace {str(NAMESPACES)!r} is not a namespace name (a lowercase DNS "
        "label, as kubectl -n takes); to give the cluster's Namespace manifests, use "
        "--namespaces FILE\n"
    )


def test_namespace_missing_from_the_namespaces_file_is_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["-p", str(POLICIES), "--namespaces", str(NAMESPACES), "-n", "nowhere"]
    code, out, err = run(capsys, "apply", *argv, "-o", "patch", str(NOTEBOOK))
    assert code == 0 and out.startswith("[")
    assert err.splitlines()[0] == (
        f"warning: nowhere/alice-jupyter-0: namespace nowhere is not in {NAMESPACES}: on that "
        "cluster the API server refuses the pod before gpuwarden sees it; the dry run assumed a "
        "namespace with no labels (add it to the file, or pick a namespace with -n)"
    )


def test_strict_dry_run_fails_on_a_namespace_the_cluster_lacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["-p", str(POLICIES), "--namespaces", str(NAMESPACES), "-n", "nowhere", "--strict"]
    code, out, err = run(capsys, "explain", *argv, str(NOTEBOOK))
    assert (code, out) == (2, "")
    assert err.startswith("error: nowhere/alice-jupyter-0: namespace nowhere is not in ")


def test_namespaces_in_the_file_and_default_need_no_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["-p", str(POLICIES), "--namespaces", str(NAMESPACES), "--strict", "-o", "patch"]
    for namespace in ("tenant-a", "default"):
        code, _, err = run(capsys, "apply", *base, "-n", namespace, str(NOTEBOOK))
        assert code == 0
        assert "is not in" not in err
