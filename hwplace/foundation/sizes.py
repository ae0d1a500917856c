"""Amounts of memory as a config writes them (``50GiB``, ``0.5GiB``, ``1500MB``, ``1024``) and as hwplace prints
them: :func:`parse_size` and :func:`format_size`. Imports only :mod:`hwplace.foundation.errors`.

The rules, one place for the ``resources:`` section and ``HWPLACE_FAKE_ACCELERATOR_MEMORY``:

- an integer is a number of bytes (``0`` included); ``True``/``False`` are not integers here;
- a string is a number and a unit, with at most one space between them: ``B``; ``KB``, ``MB``, ``GB``, ``TB`` in
  powers of 1000; ``KiB``, ``MiB``, ``GiB``, ``TiB`` in powers of 1024, spelled exactly so (``Gb`` would be
  gigabits, ``G`` and ``Gi`` are ambiguous: both are refused with the unit meant as a hint);
- the number may have a decimal fraction (``0.5GiB``); a fraction of a byte is rounded up, to the next whole
  byte, since a memory figure that errs should err on the side of not fitting;
- a bare YAML float (``0.5``) is refused: it has no unit, and a number of bytes is whole;
- negative amounts and amounts over :data:`MAX_BYTES` (an exbibyte, far beyond any device) are refused.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal
from typing import Any

from hwplace.foundation.errors import ConfigError

UNITS: dict[str, int] = {
    "B": 1,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
}
MAX_BYTES = 2**60
"""The largest amount accepted: 1 EiB, far beyond any device, so a typo costs nothing and prints plainly."""
ALLOWED = ("bytes as an integer, or a number and a unit: B, KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB "
           "(powers of 1024), such as 50GiB or 0.5GiB")
_SIZE = re.compile(r"^([0-9]{1,30})(?:\.([0-9]{1,30}))? ?([A-Za-z]{1,4})\Z")
_BINARY = ("B", "KiB", "MiB", "GiB", "TiB")


def parse_size(value: Any, path: str) -> int:
    """``value`` (an integer of bytes, or a string such as ``"50GiB"``) as a whole number of bytes.

    A value that breaks the rules above is a :class:`~hwplace.ConfigError` naming ``path``, the value and the
    forms allowed.
    """
    if isinstance(value, bool):
        raise ConfigError(path, "is not an amount of memory", value=value, allowed=ALLOWED)
    if isinstance(value, int):
        amount = value
    elif isinstance(value, float):
        raise ConfigError(path, "is a number without a unit; a number of bytes is whole", value=value,
                          allowed=f"give it a unit ('{value:g}GiB') or write whole bytes")
    elif isinstance(value, str):
        amount = _parse_text(value.strip(), value, path)
    else:
        raise ConfigError(path, "is not an amount of memory", value=value, allowed=ALLOWED)
    if amount < 0:
        raise ConfigError(path, "is negative", value=value, allowed=ALLOWED)
    if amount > MAX_BYTES:
        raise ConfigError(path, f"is more than {format_size(MAX_BYTES)}, beyond any device", value=value,
                          allowed=f"at most {MAX_BYTES} bytes")
    return amount


def _parse_text(text: str, value: str, path: str) -> int:
    if text.startswith("-"):
        raise ConfigError(path, "is negative", value=value, allowed=ALLOWED)
    match = _SIZE.match(text)
    if match is None:
        if text.isdigit() or (text.replace(".", "", 1).isdigit() and text.count(".") == 1):
            raise ConfigError(path, "is a number in quotes without a unit", value=value,
                              allowed=f"a unit ('{text}GiB'), or bytes as an integer without quotes")
        raise ConfigError(path, "is not an amount of memory", value=value, allowed=ALLOWED)
    whole, fraction, unit = match.groups()
    if unit not in UNITS:
        raise ConfigError(path, f"has an unknown unit {unit!r}{_unit_hint(unit)}",
                          value=value, allowed=ALLOWED)
    exact = Decimal(f"{whole}.{fraction or '0'}") * UNITS[unit]
    return int(exact.to_integral_value(rounding=ROUND_CEILING))


def _unit_hint(unit: str) -> str:
    """``"; did you mean 'GiB'?"`` for a unit in another case, ``"'GB' or 'GiB'"`` for one without its ``B``."""
    folded = unit.lower()
    close = [c for c in UNITS if c.lower() in (folded, folded + "b", folded + "ib")]
    exact = [c for c in close if c.lower() == folded]
    return f"; did you mean {' or '.join(map(repr, exact or close))}?" if close else ""


def format_size(amount: int) -> str:
    """``amount`` bytes in the largest binary unit that leaves a number of at least 1: ``"50 GiB"``,
    ``"1.5 GiB"``, ``"512 MiB"``, ``"100 B"``; at most two decimals, trailing zeros dropped."""
    sign = "-" if amount < 0 else ""
    amount = abs(amount)
    for unit in reversed(_BINARY):
        scale = UNITS[unit]
        if amount >= scale or unit == "B":
            number = f"{amount / scale:.2f}".rstrip("0").rstrip(".") if scale > 1 else str(amount)
            return f"{sign}{number} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover
