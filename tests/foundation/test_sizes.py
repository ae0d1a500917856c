"""Amounts of memory as configs write them (hwplace.parse_size) and as hwplace prints them (format_size)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hwplace
from hwplace.foundation.sizes import MAX_BYTES, UNITS, format_size, parse_size


@pytest.mark.parametrize(("value", "expected"), [
    (0, 0), (1024, 1024), ("0B", 0), ("512B", 512), ("1KB", 1000), ("1KiB", 1024), ("50GiB", 50 * 2**30),
    ("0.5GiB", 2**29), ("1.5 KiB", 1536), ("2TB", 2 * 10**12), ("3MB", 3 * 10**6), ("1TiB", 2**40),
    (" 80GiB ", 80 * 2**30), ("0.1KB", 100), ("0.0001KiB", 1), (MAX_BYTES, MAX_BYTES), ("1048576TiB", MAX_BYTES),
])
def test_integers_are_bytes_and_strings_have_a_unit(value: object, expected: int) -> None:
    assert parse_size(value, "x") == expected
    assert hwplace.parse_size(value, "x") == expected  # the public face the fake backend uses


def test_a_fraction_of_a_byte_is_rounded_up() -> None:
    assert parse_size("0.3KiB", "x") == 308  # 307.2 bytes: a figure that errs errs towards not fitting
    assert parse_size("1.0000000001B", "x") == 2


@pytest.mark.parametrize(("value", "message"), [
    ("10gib", r"^x: has an unknown unit 'gib'; did you mean 'GiB'\? \(got '10gib'\); bytes as an integer"),
    ("10G", r"unknown unit 'G'; did you mean 'GB' or 'GiB'\?"),
    ("10Gi", r"unknown unit 'Gi'; did you mean 'GiB'\?"),
    ("10Gb", r"unknown unit 'Gb'; did you mean 'GB'\?"),
    ("10 apples", r"unknown unit 'apples'|is not an amount of memory"),
    ("1.5", r"^x: is a number in quotes without a unit \(got '1.5'\); a unit \('1.5GiB'\), or bytes as an integer"),
    ("1024", r"is a number in quotes without a unit"),
    (1.5, r"^x: is a number without a unit; a number of bytes is whole \(got 1.5\); give it a unit \('1.5GiB'\)"),
    (-1, r"^x: is negative \(got -1\)"),
    ("-1GiB", r"^x: is negative"),
    (MAX_BYTES + 1, r"^x: is more than 1048576 TiB, beyond any device"),
    ("1048577TiB", r"beyond any device"),
    ("9" * 40 + "GiB", r"is not an amount of memory"),
    (True, r"^x: is not an amount of memory \(got True\)"),
    (None, r"is not an amount of memory"),
    ([1], r"is not an amount of memory"),
    ("1e3GB", r"is not an amount of memory"),
    ("1..5GiB", r"is not an amount of memory"),
    ("", r"is not an amount of memory"),
    ("GiB", r"is not an amount of memory"),
    ("1  GiB", r"is not an amount of memory"),
])
def test_anything_else_is_a_config_error_naming_the_key_and_the_forms(value: object, message: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=message) as caught:
        parse_size(value, "x")
    assert caught.value.path == "x"


@given(st.integers(min_value=0, max_value=MAX_BYTES), st.sampled_from(sorted(UNITS)))
def test_whole_numbers_of_any_unit_are_exact(amount: int, unit: str) -> None:
    count = amount // UNITS[unit]
    assert parse_size(f"{count}{unit}", "x") == count * UNITS[unit]


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=999),
       st.sampled_from(sorted(UNITS)))
def test_a_decimal_is_the_smallest_whole_number_of_bytes_not_below_it(whole: int, thousandths: int,
                                                                      unit: str) -> None:
    amount = parse_size(f"{whole}.{thousandths:03d}{unit}", "x")
    exact_thousandths = (whole * 1000 + thousandths) * UNITS[unit]  # the value times 1000
    assert amount * 1000 >= exact_thousandths > (amount - 1) * 1000


@pytest.mark.parametrize(("amount", "text"), [
    (0, "0 B"), (100, "100 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (50 * 2**30, "50 GiB"), (2**29, "512 MiB"),
    (int(50.5 * 2**30), "50.5 GiB"), (-(2**30), "-1 GiB"), (2**40 * 3, "3 TiB"), (2**30 + 1, "1 GiB"),
])
def test_format_size_uses_the_largest_binary_unit(amount: int, text: str) -> None:
    assert format_size(amount) == text


@given(st.integers(min_value=0, max_value=MAX_BYTES))
def test_a_formatted_size_parses_back_to_within_half_a_percent(amount: int) -> None:
    back = parse_size(format_size(amount).replace(" ", ""), "x")
    assert abs(back - amount) <= amount * 0.005 + 1

