"""The policy files joined with the GPUPolicy objects, as the webhook serves them.

GPUPolicy objects are added to the files, which load on their own first, in the order of the
objects' names. The set is loaded as one (a profile, rule, tenant or policy name defined twice is
an error, and so is a second ``defaultProfile``), and a conflict is blamed on the later document:
the files win over any object, and an object over the objects named after it. An object whose
generation cannot join the set is Invalid, with the loader's message (naming
``gpupolicy/<name>`` and the field); the last generation of it that could stays in force in its
place, and is dropped only when it no longer fits either. Pure: the webhook
(gpuwarden.webhook.policies) and ``gpuwarden lint --objects`` both call :func:`compose`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.policy.spec.loader import PolicyError, load_objects
from gpuwarden.policy.spec.policyset import PolicySet


@dataclass(frozen=True)
class PolicyObject:
    """One GPUPolicy object as the cache keeps it."""

    name: str
    uid: str
    generation: int
    resource_version: str
    # What the policy loader reads: apiVersion, kind, metadata.name and spec.
    document: Mapping[str, Any]
    status: Mapping[str, Any]


@dataclass(frozen=True)
class ObjectVerdict:
    """What the webhook made of one object's generation (gpuwarden.webhook.policies)."""

    uid: str
    generation: int
    valid: bool
    message: str = ""  # the loader's issues, for an invalid generation
    # The generation this webhook serves in its place: the current one, the last good one (an
    # invalid generation never replaces it), or None.
    serving: int | None = None


def object_source(name: str) -> str:
    """How the loader's messages name a GPUPolicy object."""
    return f"gpupolicy/{name}"


@dataclass(frozen=True)
class Composition:
    policies: PolicySet
    verdicts: Mapping[str, ObjectVerdict]
    # Each object's last good version, for the next compose: the current one if valid, else the
    # one that was (kept even while it does not fit, for when it fits again).
    last_good: Mapping[str, PolicyObject]


def compose(
    files: PolicySet,
    objects: Mapping[str, PolicyObject],
    last_good: Mapping[str, PolicyObject] | None = None,
) -> Composition:
    """The files with every object that can join them, in name order (see the module's text).

    ``last_good`` holds, per name, the version of each object that served before; it stands in
    for an invalid generation of the same object (same uid), if it still fits.
    """
    last_good = last_good or {}
    candidates = dict(objects)
    problems: dict[str, str] = {}
    while True:
        if not candidates:
            policies = files
            break
        try:
            policies = load_objects(
                files,
                [(object_source(name), candidates[name].document) for name in sorted(candidates)],
            )
            break
        except PolicyError as exc:
            blamed = _blame(exc, candidates)
        for name, message in blamed.items():
            tried = candidates.pop(name)
            if tried is not objects[name]:
                continue  # the last good version no longer fits either
            problems[name] = message
            previous = last_good.get(name)
            if (
                previous is not None
                and previous.uid == tried.uid
                and previous.generation != tried.generation
            ):
                candidates[name] = previous
    verdicts: dict[str, ObjectVerdict] = {}
    good: dict[str, PolicyObject] = {}
    for name, current in objects.items():
        serving = candidates.get(name)
        previous = last_good.get(name)
        if name not in problems:
            good[name] = current
        elif previous is not None and previous.uid == current.uid:
            good[name] = previous
        verdicts[name] = ObjectVerdict(
            uid=current.uid,
            generation=current.generation,
            valid=name not in problems,
            message=problems.get(name, ""),
            serving=serving.generation if serving is not None else None,
        )
    return Composition(policies, verdicts, good)


def _blame(exc: PolicyError, candidates: Mapping[str, PolicyObject]) -> dict[str, str]:
    """The loader's message for each object it found a problem in."""
    by_name = {object_source(name): name for name in candidates}
    found: dict[str, list[str]] = {}
    for issue in exc.issues:
        name = by_name.get(issue.source)
        if name is not None:
            found.setdefault(name, []).append(str(issue))
    if not found:
        # Not one object's: cannot happen while the files load on their own; drop them all
        # rather than loop.
        return {name: str(exc) for name in candidates}
    return {name: "\n".join(lines) for name, lines in found.items()}
