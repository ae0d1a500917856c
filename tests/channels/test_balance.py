"""Balanced splitting of weighted items over consumer ranks, measured against round-robin."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

import hwplace
from hwplace import balanced_split, imbalance


def loads(parts: Sequence[Sequence[float]]) -> list[float]:
    return [sum(part) for part in parts]


def round_robin(items: list[float], ranks: int) -> list[list[float]]:
    return [items[r::ranks] for r in range(ranks)]


@pytest.mark.parametrize("seed", range(5))
def test_balanced_split_beats_round_robin_on_skewed_weights(seed: int) -> None:
    # Rollout lengths are heavy-tailed; a few long trajectories dominate.
    rng = random.Random(seed)
    lengths = [float(int(rng.lognormvariate(5, 1.2)) + 1) for _ in range(256)]
    balanced = imbalance(loads(balanced_split(lengths, 8, weight=lengths)))
    naive = imbalance(loads(round_robin(lengths, 8)))
    assert balanced < 1.01
    assert naive > 1.1


def test_lpt_bound_against_the_optimum_on_a_known_case() -> None:
    # 3,3,2,2,2 over 2 ranks: the optimum is 6/6; LPT gives 7/5.
    parts = balanced_split([3, 3, 2, 2, 2], 2, weight=[3, 3, 2, 2, 2])
    assert sorted(loads(parts)) == [5, 7]
    assert imbalance(loads(parts)) == pytest.approx(7 / 6)


def test_every_item_lands_exactly_once_and_each_part_keeps_the_order() -> None:
    items = [f"t{i}" for i in range(50)]
    parts = balanced_split(items, 4, weight=lambda item: int(item[1:]) % 7)
    assert sorted(i for part in parts for i in part) == sorted(items)
    for part in parts:
        assert part == sorted(part, key=lambda item: int(item[1:]))


def test_weight_may_be_a_function_of_the_item() -> None:
    parts = balanced_split([[0] * 9, [0], [0], [0] * 3, [0] * 4], 2, weight=len)
    assert sorted(loads([[len(t) for t in part] for part in parts])) == [9, 9]


def test_without_weights_items_count_one_each() -> None:
    parts = balanced_split(list(range(10)), 3)
    assert sorted(len(part) for part in parts) == [3, 3, 4]


def test_more_ranks_than_items_leaves_some_empty() -> None:
    assert balanced_split(["a"], 3) in (
        [["a"], [], []], [[], ["a"], []], [[], [], ["a"]])
    assert balanced_split([], 2) == [[], []]


@pytest.mark.parametrize("ranks", [0, -1, 1.5, True, "2"])
def test_num_ranks_must_be_positive(ranks: Any) -> None:
    with pytest.raises(hwplace.ConfigError, match=rf"num_ranks: must be a whole number >= 1 \(got {ranks!r}\)"):
        balanced_split([1], ranks)


def test_one_rank_takes_everything_in_order() -> None:
    assert balanced_split([3, 1, 2], 1, weight=[3, 1, 2]) == [[3, 1, 2]]


def test_weights_must_match_the_items() -> None:
    with pytest.raises(hwplace.ConfigError, match=r"weight: has 1 weights for 2 items"):
        balanced_split(["a", "b"], 2, weight=[1])


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "3", None, True])
def test_each_weight_must_be_a_finite_number(bad: Any) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"weight\[1\]: .* is not a finite number >= 0"):
        balanced_split(["a", "b"], 2, weight=[1, bad])


def test_imbalance_of_even_uneven_and_empty_loads() -> None:
    assert imbalance([2, 2, 2]) == 1.0
    assert imbalance([3, 1]) == 1.5
    assert imbalance([0, 0]) == 1.0
    with pytest.raises(hwplace.ConfigError, match=r"loads: needs at least one load"):
        imbalance([])

