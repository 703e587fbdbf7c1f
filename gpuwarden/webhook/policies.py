"""The policy set being served, and its hot reload from files on disk.

The policy path may be a ConfigMap volume: the kubelet writes a new timestamped directory and
swaps the ``..data`` symlink to it. Every file under the path is hashed on each check (through
symlinks), so that swap, an in-place edit and a new or removed file are all seen alike. A set
that fails to load never replaces the last good one.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpuwarden.policy import PolicyError, PolicySet, load_paths
from gpuwarden.policy.loader import policy_files


@dataclass(frozen=True)
class PolicyState:
    """What is served now and what happened at the last reload."""

    policies: PolicySet | None = None
    loaded_at: float | None = None
    error: str | None = None  # the newest files' problem, while the last good set serves
    reloads_ok: int = 0
    reloads_failed: int = 0

    @property
    def fingerprint(self) -> str | None:
        return self.policies.fingerprint if self.policies is not None else None


@dataclass(frozen=True)
class ReloadResult:
    changed: bool  # the files changed since the last check
    ok: bool  # they loaded (or nothing changed)
    error: str | None = None


def files_signature(paths: Sequence[Path]) -> str:
    """A hash of every policy file's name and content; missing paths hash as missing."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(f"{path}\0{path.exists()}\0".encode())
    try:
        files = policy_files(p for p in paths if p.exists())
    except OSError as exc:
        digest.update(f"unreadable: {exc}".encode())
        return digest.hexdigest()
    for file in files:
        digest.update(f"{file}\0".encode())
        try:
            digest.update(file.read_bytes())
        except OSError as exc:
            digest.update(f"unreadable: {exc}".encode())
    return digest.hexdigest()


class PolicyReloader:
    """Holds the current :class:`PolicyState`; :meth:`check` reloads when the files change."""

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        clock: Callable[[], float] = time.monotonic,
        loader: Callable[[Sequence[Path]], PolicySet] = load_paths,
    ) -> None:
        self.paths = tuple(paths)
        self._clock = clock
        self._loader = loader
        self._signature: str | None = None
        self.state = PolicyState()

    def check(self) -> ReloadResult:
        signature = files_signature(self.paths)
        if signature == self._signature:
            return ReloadResult(changed=False, ok=self.state.error is None)
        self._signature = signature
        try:
            loaded = self._loader(self.paths)
        except PolicyError as exc:
            message = str(exc)
            self.state = replace(
                self.state, error=message, reloads_failed=self.state.reloads_failed + 1
            )
            return ReloadResult(changed=True, ok=False, error=message)
        except Exception as exc:  # a loader bug must not take the served set down
            message = f"{type(exc).__name__}: {exc}"
            self.state = replace(
                self.state, error=message, reloads_failed=self.state.reloads_failed + 1
            )
            return ReloadResult(changed=True, ok=False, error=message)
        self.state = replace(
            self.state,
            policies=loaded,
            loaded_at=self._clock(),
            error=None,
            reloads_ok=self.state.reloads_ok + 1,
        )
        return ReloadResult(changed=True, ok=True)
