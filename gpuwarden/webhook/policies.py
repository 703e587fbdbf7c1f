"""The policy set being served: the policy files, hot reloaded, and the GPUPolicy objects.

The policy path may be a ConfigMap volume: the kubelet writes a new timestamped directory and
swaps the ``..data`` symlink to it. Every file under the path is hashed on each check (through
symlinks), so that swap, an in-place edit and a new or removed file are all seen alike. Files that
fail to load never replace the last good ones.

GPUPolicy objects (from an :class:`ObjectSource`: the API server's, through
gpuwarden.kube.gpupolicies) are added to the files, which load on their own first, in the order
of the objects' names (gpuwarden.policy.spec.composition). The set is loaded as one (a profile,
rule, tenant or policy name defined twice is an error, and so is a second ``defaultProfile``),
and a conflict is blamed on the later document: the files win over any object, and an object over the objects named
after it. An object whose generation cannot join the set is Invalid, with the loader's message
(naming ``gpupolicy/<name>`` and the field); the last generation of it that could stays in force
in its place, and is dropped only when it no longer fits either. A deleted object is dropped.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from gpuwarden.policy import PolicyError, PolicySet, load_paths
from gpuwarden.policy.spec.composition import (
    ObjectVerdict,
    PolicyObject,
    compose,
    object_source,
)
from gpuwarden.policy.spec.loader import policy_files


@dataclass(frozen=True)
class PolicyState:
    """What is served now and what happened at the last reload."""

    policies: PolicySet | None = None
    loaded_at: float | None = None
    error: str | None = None  # the newest files' problem, while the last good set serves
    reloads_ok: int = 0
    reloads_failed: int = 0
    # Each GPUPolicy object's current generation: valid, or why not and what serves instead.
    objects: Mapping[str, ObjectVerdict] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str | None:
        return self.policies.fingerprint if self.policies is not None else None


@dataclass(frozen=True)
class ReloadResult:
    changed: bool  # the files, or what the GPUPolicy objects come to, changed since the last check
    ok: bool  # they loaded, and no object turned invalid (or nothing changed)
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


def _describe(name: str, verdict: ObjectVerdict) -> str:
    instead = (
        f"generation {verdict.serving} still serves"
        if verdict.serving is not None
        else "not served"
    )
    return f"{object_source(name)} generation {verdict.generation} is invalid ({instead}): " + (
        verdict.message
    )


class ObjectSource(Protocol):
    """GPUPolicy objects to serve with the files (gpuwarden.kube.gpupolicies.GPUPolicyWatch)."""

    @property
    def synced(self) -> bool:
        """Whether objects() holds every object there is."""
        ...

    def objects(self) -> Mapping[str, PolicyObject]: ...

    def report(self, verdicts: Mapping[str, ObjectVerdict]) -> None:
        """Each object's verdict, to be written to its status (without blocking)."""
        ...

    def missing(self) -> list[str]:
        """What keeps the objects from being known (empty when synced)."""
        ...

    def notes(self) -> list[str]: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class PolicyReloader:
    """Holds the current :class:`PolicyState`; :meth:`check` reloads when the files or the
    GPUPolicy objects change."""

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        objects: ObjectSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        loader: Callable[[Sequence[Path]], PolicySet] = load_paths,
    ) -> None:
        self.paths = tuple(paths)
        self.objects = objects
        self._clock = clock
        self._loader = loader
        self._signature: str | None = None
        self._files: PolicySet | None = None  # the last good files
        self._seen: tuple[bool, dict[str, tuple[str, int, Mapping[str, Any]]]] | None = None
        self._last_good: Mapping[str, PolicyObject] = {}
        self._composed_synced = objects is None
        self.state = PolicyState()

    def check(self) -> ReloadResult:
        signature = files_signature(self.paths)
        files_changed = signature != self._signature
        files_error: str | None = None
        if files_changed:
            self._signature = signature
            try:
                self._files = self._loader(self.paths)
            except PolicyError as exc:
                files_error = str(exc)
            except Exception as exc:  # a loader bug must not take the served set down
                files_error = f"{type(exc).__name__}: {exc}"
        objects: Mapping[str, PolicyObject] = {}
        synced = True
        objects_changed = False
        if self.objects is not None:
            synced = self.objects.synced  # before the snapshot: then the snapshot is complete
            objects = self.objects.objects()
            seen = (synced, {n: (o.uid, o.generation, o.document) for n, o in objects.items()})
            objects_changed = seen != self._seen
            self._seen = seen
        if not files_changed and not objects_changed:
            return ReloadResult(changed=False, ok=self.state.error is None)
        if self._files is None:  # no files have loaded yet
            failed = files_error or self.state.error or "not loaded"
            self.state = replace(
                self.state, error=failed, reloads_failed=self.state.reloads_failed + 1
            )
            return ReloadResult(changed=True, ok=False, error=failed)
        composed = compose(self._files, objects, self._last_good)
        self._last_good = composed.last_good
        if synced and self.objects is not None:
            # Judged from every object there is: their status may say so.
            self._composed_synced = True
            self.objects.report(composed.verdicts)
        same_set = composed.policies.fingerprint == self.state.fingerprint
        if not files_changed and same_set and composed.verdicts == self.state.objects:
            # The objects became known (or changed back): nothing served changes.
            return ReloadResult(changed=False, ok=self.state.error is None)
        previous = self.state.objects
        problems = [
            _describe(name, verdict)
            for name, verdict in sorted(composed.verdicts.items())
            if not verdict.valid and previous.get(name) != verdict
        ]
        error = files_error if files_changed else self.state.error
        if error is not None:
            problems.insert(0, error)
        ok = not problems
        self.state = replace(
            self.state,
            policies=self.state.policies if same_set else composed.policies,
            loaded_at=self.state.loaded_at if same_set else self._clock(),
            error=error,
            objects=composed.verdicts,
            reloads_ok=self.state.reloads_ok + (1 if ok else 0),
            reloads_failed=self.state.reloads_failed + (0 if ok else 1),
        )
        return ReloadResult(changed=True, ok=ok, error="\n".join(problems) or None)

    # Readiness -------------------------------------------------------------------------------

    def missing(self) -> list[str]:
        """What keeps the served set from being the one configured (empty when it is)."""
        if self.objects is None:
            return []
        missing = self.objects.missing()
        if not missing and not self._composed_synced:
            missing = ["GPUPolicy objects synced but not loaded yet"]
        return missing

    def notes(self) -> list[str]:
        """GPUPolicy objects that do not serve as they are, and the source's own notes."""
        if self.objects is None:
            return []
        lines = [
            _describe(name, verdict)
            for name, verdict in sorted(self.state.objects.items())
            if not verdict.valid
        ]
        return lines + self.objects.notes()

    def start(self) -> None:
        if self.objects is not None:
            self.objects.start()

    def stop(self) -> None:
        if self.objects is not None:
            self.objects.stop()
