"""The offline CLIs on the same pods: ``gpuwarden apply`` against ``kyverno apply``, wall-clock."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from bench.apiserver_kyverno import KYVERNO_POLICIES, KyvernoTools, kyverno_values_file
from bench.apiserver_pods import DEFAULT_POLICIES, NAMESPACES_FILE, Obj, numbered_pods
from bench.apiserver_stats import CliTiming


def time_command(argv: Sequence[str], timeout: float = 900.0) -> float:
    began = time.perf_counter()
    result = subprocess.run(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=timeout,
        check=False,
    )
    seconds = time.perf_counter() - began
    # gpuwarden apply exits 1 when a pod is denied; anything else is a failure of the run.
    if result.returncode not in (0, 1):
        tail = result.stderr.decode(errors="replace")[-2000:]
        raise SystemExit(f"{' '.join(argv[:3])} ... exited {result.returncode}:\n{tail}")
    return seconds


def cli_timings(
    pods: Sequence[Obj], count: int, workdir: Path, kyverno: KyvernoTools | None
) -> list[CliTiming]:
    many = workdir / f"pods-{count}.yaml"
    many.write_text(yaml.safe_dump_all(numbered_pods(pods, count), sort_keys=False))
    one = workdir / "pods-1.yaml"
    one.write_text(yaml.safe_dump_all(numbered_pods(pods, 1), sort_keys=False))
    gpuwarden = shutil.which("gpuwarden", path=str(Path(sys.executable).parent)) or "gpuwarden"
    commands: list[tuple[str, Callable[[Path], list[str]]]] = [
        (
            "gpuwarden apply",
            lambda f: [
                gpuwarden, "apply", "--policies", str(DEFAULT_POLICIES),
                "--namespaces", str(NAMESPACES_FILE), "-o", "patch", str(f),
            ],
        )
    ]  # fmt: skip
    if kyverno is not None:
        values = kyverno_values_file(workdir / "kyverno-values.yaml")
        cli = str(kyverno.cli)
        commands.append(
            (
                "kyverno apply",
                lambda f: [
                    cli, "apply", str(KYVERNO_POLICIES / "mutate.yaml"),
                    str(KYVERNO_POLICIES / "validate.yaml"), "--values-file", str(values),
                    "--resource", str(f), "--remove-color",
                ],
            )
        )  # fmt: skip
    timings = []
    for name, argv in commands:
        time_command(argv(one))  # warm the page cache
        startup = min(time_command(argv(one)) for _ in range(2))
        timings.append(CliTiming(name, count, time_command(argv(many)), startup))
    return timings
