"""Immutable, picklable containers for records that must not change once built (devices, placements)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn, TypeVar

K = TypeVar("K")
V = TypeVar("V")

JSON_SCALARS = (str, int, float, bool, type(None))


class FrozenDict(dict[K, V]):
    """A read-only ``dict``: it compares, hashes, pickles and JSON-encodes like one, but cannot change.

    ``dict(frozen)`` gives a mutable copy.
    """

    __slots__ = ()

    def _readonly(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"{type(self).__name__} is read-only; copy it with dict(...) to change it")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _readonly

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[type[FrozenDict[K, V]], tuple[dict[K, V]]]:
        return type(self), (dict(self),)

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


def freeze(value: Any, where: str = "value") -> Any:
    """A deep immutable copy of JSON-like data: mappings become :class:`FrozenDict`, lists become tuples.

    Anything else than strings, numbers, booleans, ``None``, lists, tuples and string-keyed mappings
    raises :class:`TypeError` naming ``where``.
    """
    if isinstance(value, JSON_SCALARS):
        return value
    if isinstance(value, FrozenDict):
        return value
    if isinstance(value, Mapping):
        frozen: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: key {key!r} is not a string")
            frozen[key] = freeze(item, f"{where}[{key!r}]")
        return FrozenDict(frozen)
    if isinstance(value, list | tuple):
        return tuple(freeze(item, f"{where}[{i}]") for i, item in enumerate(value))
    raise TypeError(f"{where} is a {type(value).__name__}; allowed: strings, numbers, booleans, None, "
                    "and lists or string-keyed mappings of those")
