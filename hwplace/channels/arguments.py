"""The checks a channel's arguments pass before anything is sent: names, queue names, weights, versions and
timeouts, each refused with a :class:`~hwplace.ConfigError` naming the argument. Imports the foundation and
:mod:`hwplace.channels.balance`."""

from __future__ import annotations

import numbers
import re
from typing import Any

from hwplace.channels.balance import is_weight
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.timeouts import wait_timeout
from hwplace.foundation.wording import safe_repr

MAX_MAXSIZE = (1 << 63) - 1
"""The largest bound a queue may have: the wire carries it as an unsigned 64-bit number."""
CHANNEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}\Z")
QUEUE_NAME_BYTES = 1024


def check_name(name: Any) -> None:
    """A channel name: 1 to 100 letters, digits, '_', '.' and '-'."""
    if not isinstance(name, str) or not CHANNEL_NAME.match(name):
        raise ConfigError("channel name", f"{safe_repr(name)} is not a usable channel name",
                          allowed="1 to 100 letters, digits, '_', '.' and '-', starting with a letter or digit")


def check_creation(name: Any, maxsize: Any, group_affinity: Any, group_rank_affinity: Any) -> int:
    """``Channel.create``'s arguments checked; the rank of ``group_affinity`` its host runs beside (0 by default)."""
    check_name(name)
    if isinstance(maxsize, bool) or not isinstance(maxsize, int) or not 0 <= maxsize <= MAX_MAXSIZE:
        raise ConfigError("maxsize", f"must be a whole number from 0 (unbounded) to {MAX_MAXSIZE:,}", value=maxsize)
    if group_affinity is None and group_rank_affinity is not None:
        raise ConfigError("group_rank_affinity", "needs group_affinity (the group whose rank it names)",
                          value=group_rank_affinity)
    rank = 0 if group_rank_affinity is None else group_rank_affinity
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ConfigError("group_rank_affinity", "must be a worker rank (a whole number >= 0)", value=rank)
    if group_affinity is not None and not isinstance(group_affinity, str):
        raise ConfigError("group_affinity", "must be a group name", value=group_affinity)
    return rank


def queue_bytes(name: Any) -> bytes:
    if not isinstance(name, str) or not name:
        raise ConfigError("queue_name", "must be a non-empty string", value=name)
    encoded = name.encode()
    if len(encoded) > QUEUE_NAME_BYTES:
        raise ConfigError("queue_name", f"is {len(encoded)} bytes long", allowed=f"at most {QUEUE_NAME_BYTES}")
    return encoded


def weight_of(value: Any, what: str) -> float:
    if not is_weight(value):
        raise ConfigError(what, "must be a finite number >= 0", value=value)
    return float(value)


def version_of(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < 2**63:
        raise ConfigError(what, "must be None (no version) or a whole number >= 0", value=value)
    return int(value)


def timeout_of(value: Any) -> float | None:
    """A ``timeout`` argument as seconds, ``None`` for no limit (:func:`hwplace.foundation.timeouts.wait_timeout`)."""
    return wait_timeout(value)
