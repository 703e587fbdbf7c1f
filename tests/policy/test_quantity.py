"""Kubernetes quantities, parsed as apimachinery's resource.ParseQuantity does."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.policy.pod.quantity import (
    QuantityError,
    _parse_grammar,
    format_bytes,
    format_mebibytes,
    parse_count,
    parse_non_negative,
    parse_quantity,
    same_quantity,
    to_mebibytes,
)

GI = 2**30


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", GI),
        ("8Gi", 8 * GI),
        ("1Ki", 1024),
        ("1Mi", 2**20),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("1G", 10**9),
        ("1k", 1000),
        ("1M", 10**6),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),  # a bare E is exa, not an exponent
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e+3", 1000),
        ("1e-3", Decimal("0.001")),
        ("0.5", Decimal("0.5")),
        (".5", Decimal("0.5")),
        ("1.", 1),
        ("1.5Gi", 3 * GI // 2),
        ("500m", Decimal("0.5")),
        ("250m", Decimal("0.25")),
        ("100u", Decimal("0.0001")),
        ("5n", Decimal("0.000000005")),
        ("+1", 1),
        ("-1", -1),
        ("0", 0),
        ("007", 7),
        ("9223372036854775807", 2**63 - 1),
        (3, 3),
        (0.5, Decimal("0.5")),
    ],
)
def test_valid_quantities(text: object, value: int | Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1GiB",
        "1gi",
        "1K",  # kilo is a lower-case k
        "1.2.3",
        "1 Gi",
        " 1Gi",
        "1Gi ",
        "1Gi\n",
        "Gi",
        "e3",
        "1e",
        "1e3.5",
        "1Mi3",
        "0x10",
        "1_000",
        "--1",
        "\u0661",  # an Arabic-Indic digit is a digit to Python, not to Kubernetes
        "one",
    ],
)
def test_invalid_quantities_are_refused_with_the_text(text: str) -> None:
    with pytest.raises(QuantityError) as err:
        parse_quantity(text)
    assert repr(text) in str(err.value)


@pytest.mark.parametrize("text", ["1e100", "1e31", "1e-100", "9223372036854775808", "8Ei", "1e30"])
def test_absurd_magnitudes_are_refused_not_wrapped(text: str) -> None:
    with pytest.raises(QuantityError, match="range"):
        parse_quantity(text)


def test_overlong_text_is_refused_without_echoing_all_of_it() -> None:
    text = "1" * 10_000
    with pytest.raises(QuantityError, match="too long") as err:
        parse_quantity(text)
    assert len(str(err.value)) < 200


@pytest.mark.parametrize("value", [True, False, None, [], {}, b"1Gi", float("nan"), float("inf")])
def test_non_quantities_are_refused(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)


def test_negative_quantities_are_refused_where_only_amounts_make_sense() -> None:
    assert parse_non_negative("0") == 0
    with pytest.raises(QuantityError, match="negative"):
        parse_non_negative("-1Gi")


@pytest.mark.parametrize(("text", "count"), [("1", 1), ("8", 8), ("1e1", 10), (2, 2), ("1.0", 1)])
def test_counts(text: object, count: int) -> None:
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["0.5", "500m", "1.5", "1500m", "-1", "1Gi5", True])
def test_counts_refuse_fractions_and_negatives(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_count(text)


def test_fractional_count_says_extended_resources_are_integers() -> None:
    with pytest.raises(QuantityError, match="whole number"):
        parse_count("0.5")


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (8 * GI, "8Gi"),
        (1500, "1500"),
        (2**20, "1Mi"),
        (0, "0"),
        (Decimal("1.5"), "2"),
        (3 * 2**19, "1536Ki"),
    ],
)
def test_format_bytes_is_the_shortest_exact_binary_form(amount: int | Decimal, text: str) -> None:
    assert format_bytes(amount) == text
    assert parse_quantity(text) >= amount


def test_mebibytes_round_up() -> None:
    assert to_mebibytes(16 * GI / Decimal("1.5")) == 10923
    assert to_mebibytes(1) == 1
    assert to_mebibytes(0) == 0
    assert format_mebibytes(16 * GI / Decimal("1.5")) == "10923Mi"
    assert format_mebibytes(8 * GI) == "8Gi"


@given(
    digits=st.text(alphabet="0123456789", min_size=1, max_size=14),
    suffix=st.sampled_from(
        ["", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
    ),
)
def test_the_short_cut_agrees_with_the_grammar(digits: str, suffix: str) -> None:
    """The common forms ("4", "16Gi", "500m") skip the regular expression; same answers."""
    text = digits + suffix
    try:
        expected: Decimal | str = _parse_grammar(text)
    except QuantityError as exc:
        expected = str(exc)
    try:
        got: Decimal | str = parse_quantity(text)
    except QuantityError as exc:
        got = str(exc)
    assert got == expected


@pytest.mark.parametrize("text", ["999999999999Ei", "8Ei", "9223372036854775808"])
def test_out_of_range_on_the_short_cut_too(text: str) -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("old", "new", "same"),
    [
        ("1Gi", "1024Mi", True),
        (4, "4", True),
        ("500m", "0.5", True),
        ("1Gi", "1G", False),
        (None, None, True),
        (None, "0", False),
        ("4", None, False),
        ("lots", "lots", True),
        ("lots", "4", False),
    ],
)
def test_same_quantity_compares_values_and_falls_back_to_text(
    old: object, new: object, same: bool
) -> None:
    assert same_quantity(old, new) is same
