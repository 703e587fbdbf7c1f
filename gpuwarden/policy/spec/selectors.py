"""Kubernetes label selectors and shell-style name globs over plain label maps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from gpuwarden.policy.spec.model import LabelSelector


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for requirement in selector.match_expressions:
        present = requirement.key in labels
        actual = labels.get(requirement.key)
        if requirement.operator == "In" and (not present or actual not in requirement.values):
            return False
        if requirement.operator == "NotIn" and present and actual in requirement.values:
            return False
        if requirement.operator == "Exists" and not present:
            return False
        if requirement.operator == "DoesNotExist" and present:
            return False
    return True


def describe_selector(selector: LabelSelector) -> str:
    parts = [f"{key}={value}" for key, value in selector.match_labels.items()]
    for req in selector.match_expressions:
        if req.operator in ("Exists", "DoesNotExist"):
            parts.append(("" if req.operator == "Exists" else "!") + req.key)
        else:
            parts.append(f"{req.key} {req.operator.lower()} ({','.join(req.values)})")
    return ",".join(parts) or "<everything>"


def name_matches(patterns: Iterable[str], name: str | None) -> bool:
    """True when ``patterns`` is empty or one of its globs matches ``name``."""
    pattern_list = list(patterns)
    if not pattern_list:
        return True
    return name is not None and any(fnmatchcase(name, pattern) for pattern in pattern_list)
