"""Detecting cgroup-based hard GPU-memory limits (``nvidia-smi memory-limits``, driver r615+).

Older drivers have no such subcommand and nvidia-smi refuses it, so the probe is simply whether
``nvidia-smi memory-limits --help`` succeeds and talks about memory limits. The limits themselves
are set through NVML (``nvmlDeviceSetMemoryLimits_v1``, keyed on the pod's cgroup directory);
nvidia-smi has no per-process memory-limit flag and the agent never pretends it has.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class HardLimitSupport:
    available: bool
    detail: str


def detect_memory_limits(nvidia_smi: str = "nvidia-smi", timeout: float = 10.0) -> HardLimitSupport:
    argv = [nvidia_smi, "memory-limits", "--help"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return HardLimitSupport(False, f"{nvidia_smi} not found")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return HardLimitSupport(False, f"{' '.join(argv)} failed: {exc}")
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        first = text.splitlines()[0] if text else "(no output)"
        return HardLimitSupport(
            False, f"{' '.join(argv)} exited with status {done.returncode}: {first}"
        )
    if "memory-limits" not in text.lower() and "memory limit" not in text.lower():
        return HardLimitSupport(False, f"{' '.join(argv)} printed no memory-limits help")
    return HardLimitSupport(True, "nvidia-smi offers memory-limits (cgroup GPU-memory limits)")
