"""Kubernetes resource quantities, parsed exactly as apimachinery's resource.Quantity does."""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
# <sign><digits>[.<digits>]<suffix>, where suffix is binary SI, decimal SI or a decimal exponent.
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
# apimachinery refuses quantities whose magnitude does not fit its int64/inf.Dec range.
_MAX_MAGNITUDE = Decimal(2**63)
_MAX_TEXT = 64


class QuantityError(ValueError):
    """A string that Kubernetes would refuse as a resource quantity."""


# Whole-number suffixes the short cut in parse_quantity takes, with their multipliers.
_WHOLE_SUFFIXES: dict[str, int] = {
    **_BINARY,
    **{suffix: int(factor) for suffix, factor in _DECIMAL.items() if factor >= 1 and suffix},
}


def parse_quantity(value: object) -> Decimal:
    """Parse a quantity (``1Gi``, ``1G``, ``1e3``, ``0.5``, ``500m``, or a plain number) to a Decimal."""
    if type(value) is str and value.isascii():
        # The common forms ("4", "16Gi", "500m") without the regular expression; the grammar
        # below gives the same value for each (a property test holds them to it).
        digits = value.rstrip("KMGTPEkim")
        suffix = value[len(digits) :]
        if 0 < len(digits) <= 12 and digits.isdigit():
            if not suffix:
                return Decimal(int(digits))
            if suffix == "m":
                return Decimal(int(digits)).scaleb(-3)
            factor = _WHOLE_SUFFIXES.get(suffix)
            if factor is not None and int(digits) * factor < _MAX_MAGNITUDE:
                return Decimal(int(digits) * factor)
    return _parse_grammar(value)


def _parse_grammar(value: object) -> Decimal:
    """parse_quantity by the full grammar."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a string or number, not {value!r}")
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"quantity {value!r} is not a finite number")
        text = repr(value)
    elif isinstance(value, str):
        # apimachinery refuses surrounding whitespace (" 1Gi", "1Gi\n"), so this does too.
        text = value
    else:
        raise QuantityError(f"quantity must be a string or number, not {type(value).__name__}")
    if len(text) > _MAX_TEXT:
        raise QuantityError(f"quantity {text[:_MAX_TEXT]!r}... is too long")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError(
            f"{text!r} is not a Kubernetes quantity (examples: 8Gi, 500M, 1e3, 0.5, 250m)"
        )
    try:
        number = Decimal(match["number"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{text!r} is not a Kubernetes quantity") from exc
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        result = number * _BINARY[suffix]
    elif suffix in _DECIMAL:
        result = number * _DECIMAL[suffix]
    else:
        exponent = int(suffix[1:])
        if abs(exponent) > 30:
            raise QuantityError(f"quantity {text!r} has an exponent out of range")
        result = number.scaleb(exponent)
    if abs(result) >= _MAX_MAGNITUDE:
        raise QuantityError(f"quantity {text!r} is out of range")
    return result


def parse_non_negative(value: object) -> Decimal:
    result = parse_quantity(value)
    if result < 0:
        raise QuantityError(f"quantity {value!r} must not be negative")
    return result


def parse_count(value: object) -> int:
    """An extended-resource count such as ``nvidia.com/gpu``: a whole, non-negative number."""
    if type(value) is str and 0 < len(value) <= 12 and value.isascii() and value.isdigit():
        return int(value)  # "1", "8": what parse_non_negative gives, without the Decimal
    result = parse_non_negative(value)
    if result != result.to_integral_value():
        raise QuantityError(f"{value!r} must be a whole number (extended resources are integers)")
    return int(result)


def same_quantity(old: object, new: object) -> bool:
    """Whether two resource values are the same quantity (``1Gi`` and ``1024Mi``). None is only
    the same as None; values that do not parse are the same only as the same text."""
    if old is None or new is None:
        return old is new
    if str(old) == str(new):
        return True
    try:
        return parse_quantity(old) == parse_quantity(new)
    except QuantityError:
        return False


def format_bytes(amount: Decimal | int) -> str:
    """The shortest exact binary-suffixed form: 8589934592 -> '8Gi', 1500 -> '1500'."""
    value = int(Decimal(amount).to_integral_value(rounding=ROUND_CEILING))
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def to_mebibytes(amount: Decimal | int) -> int:
    """Round up to whole MiB, the unit of Volcano's and HAMi's GPU-memory resources."""
    return int((Decimal(amount) / _BINARY["Mi"]).to_integral_value(rounding=ROUND_CEILING))


def format_mebibytes(amount: Decimal | int) -> str:
    """Round up to whole MiB, then print in the shortest binary form: '15754Mi', '8Gi'."""
    return format_bytes(to_mebibytes(amount) * _BINARY["Mi"])
