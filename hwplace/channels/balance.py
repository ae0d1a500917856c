"""Spreading weighted items (rollouts of different lengths, say) evenly over the ranks that consume them.

Two ways with a channel, both in ``docs/channels.md``: each consumer rank pulls ``get_batch(w)`` itself
(every rank then gets at least ``w`` and less than ``w`` plus one item's weight), or one rank takes a whole
batch and hands it out with :func:`balanced_split`.
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Callable, Sequence
from typing import TypeVar

from hwplace.foundation.errors import ConfigError
from hwplace.foundation.wording import safe_repr

T = TypeVar("T")


def balanced_split(
    items: Sequence[T], num_ranks: int, weight: Sequence[float] | Callable[[T], float] | None = None
) -> list[list[T]]:
    """Split ``items`` into ``num_ranks`` lists whose summed weights are as even as possible.

    ``weight`` gives each item's weight: a sequence parallel to ``items``, a function of an item (``len``
    for a trajectory's length), or ``None`` for 1 each. The heaviest item goes first to the lightest rank,
    and so on (the classic longest-processing-time rule: the heaviest rank carries at most 4/3 of the
    optimum); each list keeps the items' order.
    """
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1:
        raise ConfigError("num_ranks", "must be a whole number >= 1", value=num_ranks)
    weights = _weights(items, weight)
    loads = [(0.0, rank) for rank in range(num_ranks)]
    owners: list[list[int]] = [[] for _ in range(num_ranks)]
    for index in sorted(range(len(items)), key=lambda i: -weights[i]):
        load, rank = heapq.heappop(loads)
        owners[rank].append(index)
        heapq.heappush(loads, (load + weights[index], rank))
    return [[items[i] for i in sorted(indices)] for indices in owners]


def imbalance(loads: Sequence[float]) -> float:
    """The heaviest load over the mean load: 1.0 is perfect balance (and the value for no load at all)."""
    if not loads:
        raise ConfigError("loads", "needs at least one load")
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0


def is_weight(value: object) -> bool:
    """Whether ``value`` can be a weight (or a timeout): a finite real number >= 0, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
        and float(value) >= 0


def _weights(items: Sequence[T], weight: Sequence[float] | Callable[[T], float] | None) -> list[float]:
    if weight is None:
        return [1.0] * len(items)
    values = [weight(item) for item in items] if callable(weight) else list(weight)
    if len(values) != len(items):
        raise ConfigError("weight", f"has {len(values)} weights for {len(items)} items")
    for index, value in enumerate(values):
        if not is_weight(value):
            raise ConfigError(f"weight[{index}]", f"{safe_repr(value)} is not a finite number >= 0")
    return [float(v) for v in values]
