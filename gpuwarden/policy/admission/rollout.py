"""Audit and dryrun (spec.enforcementAction): an enforced decision turned into what it reports.

Under ``audit`` a denial becomes an allowed answer that says what would have been denied: the
message in warnings (kubectl prints them), the check and message in audit annotations (the API
server's audit log keys them by the webhook's name: ``validate.gpuwarden.io/would-deny``), and
``Decision.audited`` for the metric. Under ``dryrun`` the same, and the mutation's patch is left
out and listed in warnings instead, so the pod is stored as it was sent.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import orjson

from gpuwarden.policy.admission.decision import (
    MAX_WARNING,
    Decision,
    bounded_warnings,
    warning,
)
from gpuwarden.policy.spec.model import EnforcementAction

_DENIED = "gpuwarden denied the"
#: The ``audited`` of a dryrun mutation whose patch was reported, not applied.
MUTATION = "mutation"
# The largest patch value shown in a dryrun warning line (warning() cuts the line anyway).
_VALUE_SHOWN = 60


def _lines(text: str) -> list[str]:
    """``text`` in warning lines that warning() leaves whole."""
    return textwrap.wrap(text, MAX_WARNING - 1, break_long_words=True, break_on_hyphens=False)


def denied_check(decision: Decision) -> str:
    """The check a denial names (its audit annotation), else its rule or reason."""
    return decision.audit_annotations.get("denied-by") or decision.rule or decision.reason


def audited(decision: Decision, action: EnforcementAction) -> Decision:
    """A validating decision under ``action``: under audit and dryrun, a denial is admitted with
    the message as warnings, the check and message as audit annotations; the rest is as it was."""
    if action == "enforce" or decision.allowed:
        return decision
    check = denied_check(decision)
    message = decision.message
    if message.startswith(_DENIED):
        said = f"gpuwarden ({action}) would deny the{message.removeprefix(_DENIED)}"
    else:  # a refusal that is no check's (no policy loaded, the namespace unreadable)
        said = f"gpuwarden ({action}) would refuse the pod: {message}"
    lines = _lines(said)
    annotations = {
        **{k: v for k, v in decision.audit_annotations.items() if k not in ("denied-by", "reason")},
        "would-deny": check,
        "would-deny-reason": decision.reason,
        "would-deny-message": decision.message,
    }
    return decision._replace(
        allowed=True,
        code=200,
        reason="",
        message="",
        warnings=bounded_warnings([*lines, *decision.warnings]),
        audit_annotations=annotations,
        audited=check,
    )


def _op_line(op: Mapping[str, Any]) -> str:
    value = ""
    if "value" in op:
        shown = orjson.dumps(op["value"], option=orjson.OPT_SORT_KEYS).decode()
        value = " " + (shown if len(shown) <= _VALUE_SHOWN else shown[: _VALUE_SHOWN - 3] + "...")
    return warning(f"gpuwarden: would {op.get('op')} {op.get('path')}{value}")


def reported(decision: Decision, action: EnforcementAction) -> Decision:
    """A mutating decision under ``action``: under dryrun its patch is not applied but listed in
    warnings (the first operations, then a count) and counted in audit annotations."""
    if action != "dryrun" or not decision.patch:
        return decision
    count = len(decision.patch)
    who = f"profile {decision.profile}" if decision.profile else "gpuwarden"
    head = warning(
        f"gpuwarden (dryrun): the pod is left as sent; enforced, {who} would make {count} "
        f"patch operation{'s' if count != 1 else ''}:"
    )
    return decision._replace(
        patch=(),
        warnings=bounded_warnings([head, *(_op_line(op) for op in decision.patch)]),
        audit_annotations={**decision.audit_annotations, "would-patch-operations": str(count)},
        audited=MUTATION,
    )
