"""What ``hwplace run`` makes of the entry point's return value: a short line on the terminal, and for
``--summary`` the value as JSON data, refused (naming its key path) where JSON cannot hold it.

Imports the foundation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from hwplace.foundation.errors import ConfigError
from hwplace.foundation.wording import safe_repr

ALLOWED = ("return plain data from the entry point: mappings, lists, strings, finite numbers, booleans and None "
           "(records, sets, tuples and numpy or torch numbers and arrays are converted)")
MAX_DEPTH = 100


def result_line(result: Any) -> str:
    """The line ``hwplace run`` prints for what the entry point returned (shortened)."""
    return f"result: {safe_repr(result)}\n"


def summary_data(value: Any, path: str = "result", depth: int = 0) -> Any:
    """``value`` as JSON data: records (dataclasses) as mappings, sets as sorted lists, tuples as lists, numpy
    and torch scalars as numbers and their arrays as lists. Anything else, NaN or infinity, a key JSON cannot
    hold, or nesting deeper than 100 is a ``ConfigError`` for ``--summary`` naming its key path
    (``result['losses'][3]``)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError("--summary", f"{path} is {value!r}, which JSON cannot hold", allowed=ALLOWED)
        return value
    if depth >= MAX_DEPTH:
        raise ConfigError("--summary", f"{path} is nested more than {MAX_DEPTH} levels deep (does it contain "
                          "itself?)", allowed=ALLOWED)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        data = {}
        for key, item in value.items():
            where = f"{path}[{safe_repr(key)}]"
            if not (key is None or isinstance(key, str | int | float | bool)):
                raise ConfigError("--summary", f"{where}: the key is {_kind(key)}; a JSON key is a string",
                                  allowed=ALLOWED)
            data[key] = summary_data(item, where, depth + 1)
        return data
    if isinstance(value, set | frozenset):
        value = sorted(value, key=repr)
    if isinstance(value, list | tuple):
        return [summary_data(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    ndim = getattr(value, "ndim", None)
    if ndim == 0 and callable(getattr(value, "item", None)):
        return summary_data(value.item(), path, depth + 1)
    if isinstance(ndim, int) and callable(getattr(value, "tolist", None)):
        return summary_data(value.tolist(), path, depth + 1)
    raise ConfigError("--summary", f"{path} is {_kind(value)} ({safe_repr(value)}), which JSON cannot hold",
                      allowed=ALLOWED)


def _kind(value: object) -> str:
    cls = type(value)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
