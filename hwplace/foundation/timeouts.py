"""The one check every ``timeout`` argument passes: a group call's ``Handle.wait``, a channel operation and its
handle's ``wait``, a turn. Imports nothing of hwplace outside the foundation."""

from __future__ import annotations

import math
import numbers
from typing import Any

from hwplace.foundation.errors import ConfigError

ALLOWED = "allowed: None or float('inf') (no limit), or a number of seconds >= 0"


def wait_timeout(value: Any, what: str = "timeout") -> float | None:
    """``value`` as seconds to wait, ``None`` for no limit (``None`` or infinity).

    A bool, a non-number, NaN or a negative number is a :class:`~hwplace.ConfigError` naming ``what``: left to
    the waiting primitive, a negative or NaN timeout waits forever, returns at once or raises a bare ValueError.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(what, "must be a number of seconds", value=value, allowed=ALLOWED)
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        raise ConfigError(what, "must not be negative or NaN", value=value, allowed=ALLOWED)
    return None if math.isinf(seconds) else seconds
