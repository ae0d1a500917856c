"""hwplace.strategies and hwplace.placement: the three strategies, the rules on each process, the Placement record.

Offline, on fake clusters and clusters of hand-built nodes (SPEC sections 3-5).
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import hwplace
from hwplace.foundation.frozen import FrozenDict
from hwplace.planning.placements import _new_placement
from hwplace.planning.resources import resource_space
from hwplace.plugin.manager import PluginManager
from hwplace.testing import backend_plugin, fake_cluster, registered_plugin

PackedArgs = tuple[int, int, int, int]


def cluster_of(counts: list[int], **section: Any) -> hwplace.Cluster:
    return fake_cluster({"num_nodes": len(counts), **section}, accelerators_per_node=counts)


def where(placements: Sequence[hwplace.Placement]) -> list[tuple[int, tuple[int, ...]]]:
    return [(p.node_rank, p.local_hardware_ranks) for p in placements]


def devices(count: int, unhealthy: Mapping[int, str] | None = None) -> tuple[hwplace.Device, ...]:
    bad = unhealthy or {}
    return tuple(hwplace.Device(i, "gpu", healthy=i not in bad, reason=bad.get(i, "")) for i in range(count))


# -- PackedPlacementStrategy -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((0, 3, 1, 1), [(0,), (1,), (2,), (3,)]),
        ((0, 3, 2, 1), [(0, 1), (2, 3)]),
        ((0, 3, 2, 2), [(0, 2), (1, 3)]),
        ((0, 7, 2, 2), [(0, 2), (1, 3), (4, 6), (5, 7)]),
        ((0, 5, 1, 3), [(0,), (1,), (2,), (3,), (4,), (5,)]),
        ((2, 7, 3, 1), [(2, 3, 4), (5, 6, 7)]),
        ((1, 6, 2, 3), [(1, 4), (2, 5), (3, 6)]),
        ((7, 7, 1, 1), [(7,)]),
    ],
)
def test_packed_blocks(args: PackedArgs, expected: list[tuple[int, ...]]) -> None:
    start, end, num, stride = args
    placements = hwplace.PackedPlacementStrategy(start, end, num, stride).get_placement(cluster_of([8]))
    assert [p.local_hardware_ranks for p in placements] == expected
    assert [p.rank for p in placements] == list(range(len(expected)))


@st.composite
def packed_layouts(draw: st.DrawFn) -> tuple[int, PackedArgs]:
    """One node of ``size`` accelerators and Packed arguments that fit on it."""
    num = draw(st.integers(min_value=1, max_value=4))
    stride = draw(st.integers(min_value=1, max_value=4))
    blocks = draw(st.integers(min_value=1, max_value=3))
    start = draw(st.integers(min_value=0, max_value=5))
    end = start + blocks * num * stride - 1
    size = end + 1 + draw(st.integers(min_value=0, max_value=3))
    return size, (start, end, num, stride)


@settings(max_examples=80, deadline=None)
@given(packed_layouts())
def test_packed_follows_its_definition(layout: tuple[int, PackedArgs]) -> None:
    size, (start, end, num, stride) = layout
    placements = hwplace.PackedPlacementStrategy(start, end, num, stride).get_placement(cluster_of([size]))
    block = num * stride
    expected = [tuple(range(b + k, b + block, stride)) for b in range(start, end + 1, block) for k in range(stride)]
    assert [p.local_hardware_ranks for p in placements] == expected
    assert sorted(i for p in placements for i in p.local_hardware_ranks) == list(range(start, end + 1))
    assert all(len(p.local_hardware_ranks) == num for p in placements)
    assert [p.local_rank for p in placements] == list(range(len(placements)))
    assert {p.local_world_size for p in placements} == {len(placements)}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 2, 2, 1), r"^3 accelerators \(0-2\) do not split into blocks of num_accelerators_per_process \* stride "
                       r"= 2 \* 1 = 2$"),
        ((1, 6, 2, 2), r"^6 accelerators \(1-6\) do not split into blocks of .* = 2 \* 2 = 4$"),
        ((0, 4, 1, 2), r"^5 accelerators \(0-4\) do not split .* = 1 \* 2 = 2$"),
        ((4, 1, 1, 1), r"^end_accelerator_id 1 is below start_accelerator_id 4$"),
        ((0, 3, 0, 1), r"^num_accelerators_per_process must be at least 1, got 0$"),
        ((0, 3, 1, 0), r"^stride must be at least 1, got 0$"),
        ((0, 3, 1, -3), r"^stride must be at least 1, got -3$"),
        ((-1, 3, 1, 1), r"^start_accelerator_id must be at least 0, got -1$"),
        ((0, -1, 1, 1), r"^end_accelerator_id must be at least 0, got -1$"),
    ],
)
def test_packed_constructor_errors(args: PackedArgs, message: str) -> None:
    with pytest.raises(hwplace.PlacementError, match=message):
        hwplace.PackedPlacementStrategy(*args)


@pytest.mark.parametrize("value", [True, 1.0, "1", None, [1]])
@pytest.mark.parametrize("position", range(4))
def test_packed_counts_must_be_integers(position: int, value: Any) -> None:
    args: list[Any] = [0, 3, 1, 1]
    args[position] = value
    name = ("start_accelerator_id", "end_accelerator_id", "num_accelerators_per_process", "stride")[position]
    with pytest.raises(hwplace.PlacementError, match=rf"^{name} must be an integer, got {re.escape(repr(value))}$"):
        hwplace.PackedPlacementStrategy(*args)


def test_packed_start_equal_to_end_is_one_process() -> None:
    [p] = hwplace.PackedPlacementStrategy(3, 3).get_placement(cluster_of([4]))
    assert p.local_hardware_ranks == (3,)


def test_packed_with_an_absurd_end_fails_without_allocating() -> None:
    strategy = hwplace.PackedPlacementStrategy(0, 10**8 - 1)
    with pytest.raises(hwplace.PlacementError, match=r"^end_accelerator_id 99999999 does not exist: .*8 "
                                                     r"fake-accelerator resources.*, ranks 0-7$"):
        strategy.get_placement(cluster_of([8]))


def test_packed_end_just_beyond_the_group() -> None:
    with pytest.raises(hwplace.PlacementError, match=r"^end_accelerator_id 8 does not exist"):
        hwplace.PackedPlacementStrategy(0, 8, stride=3).get_placement(cluster_of([4, 4]))
    assert len(hwplace.PackedPlacementStrategy(0, 7).get_placement(cluster_of([8]))) == 8


def test_packed_on_a_group_without_resources_says_so() -> None:
    section = {"node_groups": [{"label": "empty", "node_ranks": 0, "hardware": {"type": "fake-accelerator"}}]}
    with pytest.raises(hwplace.PlacementError, match=r"^end_accelerator_id 0 does not exist: .*\b0 fake-accelerator "
                                                     r"resources\b[^,]*$"):
        hwplace.PackedPlacementStrategy(0, 0, node_group="empty").get_placement(cluster_of([0], **section))


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=8, max_value=10**30), st.integers(min_value=1, max_value=10**6))
def test_packed_with_any_absurd_size_is_a_placement_error(end: int, num: int) -> None:
    start = end - num + 1
    assume(start >= 0)
    strategy = hwplace.PackedPlacementStrategy(start, end, num_accelerators_per_process=num)
    with pytest.raises(hwplace.PlacementError, match=rf"^end_accelerator_id {end} does not exist"):
        strategy.get_placement(cluster_of([4, 4]))


@pytest.mark.parametrize(
    ("args", "counts", "block"),
    [
        ((0, 5, 2, 1), [3, 3], "2-3"),  # two ids per process: process 1 would hold one of each node
        ((2, 5, 2, 2), [4, 4], "2-5"),  # stride 2: ids [2, 4] and [3, 5]
        ((0, 1, 1, 2), [1, 1], "0-1"),  # one id per process, but the block holds both nodes
        ((0, 7, 4, 1), [2, 6], "0-3"),
    ],
)
def test_packed_blocks_may_not_cross_a_node_boundary(args: PackedArgs, counts: list[int], block: str) -> None:
    with pytest.raises(hwplace.PlacementError, match=rf"^the block {block} crosses a node boundary \(nodes \[0, 1\]\); "
                                                     "choose start, end and sizes that keep each block on one node$"):
        hwplace.PackedPlacementStrategy(*args).get_placement(cluster_of(counts))


def test_packed_crossing_error_names_the_rank_of_the_first_process_of_the_block() -> None:
    strategy = hwplace.PackedPlacementStrategy(0, 7, num_accelerators_per_process=2)
    with pytest.raises(hwplace.PlacementError, match=r"the block 4-5 crosses") as info:
        strategy.get_placement(cluster_of([5, 3]))
    assert info.value.rank == 2


def test_packed_blocks_aligned_with_nodes_are_fine() -> None:
    placements = hwplace.PackedPlacementStrategy(0, 7, 2, 2).get_placement(cluster_of([4, 4]))
    assert where(placements) == [(0, (0, 2)), (0, (1, 3)), (1, (0, 2)), (1, (1, 3))]
    assert [p.local_rank for p in placements] == [0, 1, 0, 1]


def test_packed_repr() -> None:
    strategy = hwplace.PackedPlacementStrategy(0, 7, 2, 2, node_group="a, b")
    assert repr(strategy) == ("PackedPlacementStrategy(0, 7, num_accelerators_per_process=2, stride=2, "
                              "node_group=['a', 'b'])")
    assert strategy.start == 0
    assert strategy.end == 7
    assert strategy.num_per_process == 2
    assert strategy.stride == 2


# -- FlexiblePlacementStrategy -----------------------------------------------------------------------


def test_flexible_takes_each_list_in_ascending_order() -> None:
    strategy = hwplace.FlexiblePlacementStrategy([[3, 1], (0,), [7, 5, 6]])
    assert strategy.accelerator_id_lists == ((1, 3), (0,), (5, 6, 7))
    placements = strategy.get_placement(cluster_of([8]))
    assert where(placements) == [(0, (1, 3)), (0, (0,)), (0, (5, 6, 7))]
    assert [p.local_accelerator_id for p in placements] == [1, 0, 5]


@pytest.mark.parametrize(
    ("lists", "message", "rank"),
    [
        ([], r"^accelerator_id_lists is empty: give one list per process$", None),
        ((), r"^accelerator_id_lists is empty", None),
        ("01", r"^accelerator_id_lists must be a list of lists of ids, got '01'$", None),
        (5, r"^accelerator_id_lists must be a list of lists of ids, got 5$", None),
        ({0: [1]}, r"^accelerator_id_lists must be a list of lists of ids, got \{0: \[1\]\}$", None),
        ([[0], []], r"^process 1: a non-empty list of accelerator ids is needed, got \[\]$", 1),
        ([[0], "1"], r"^process 1: a non-empty list of accelerator ids is needed, got '1'$", 1),
        ([3], r"^process 0: a non-empty list of accelerator ids is needed, got 3$", 0),
        ([[0], [1], [-1]], r"^process 2: -1 is not an accelerator id \(a non-negative integer\)$", 2),
        ([[True]], r"^process 0: True is not an accelerator id", 0),
        ([[1.0]], r"^process 0: 1\.0 is not an accelerator id", 0),
        ([[None]], r"^process 0: None is not an accelerator id", 0),
        ([[0], [1, 2, 1]], r"^process 1: accelerator ids \[1, 2, 1\] repeat an id$", 1),
    ],
)
def test_flexible_rejects_malformed_lists(lists: Any, message: str, rank: int | None) -> None:
    with pytest.raises(hwplace.PlacementError, match=message) as info:
        hwplace.FlexiblePlacementStrategy(lists)
    assert info.value.rank == rank


def test_flexible_with_an_absurd_id_fails_naming_it() -> None:
    strategy = hwplace.FlexiblePlacementStrategy([[0], [10**8], [2]])
    with pytest.raises(hwplace.PlacementError, match=r"^process 1 asks for resource 100000000, but .*\b4 "
                                                     r"fake-accelerator resources \(ranks 0-3\)$") as info:
        strategy.get_placement(cluster_of([4]))
    assert info.value.rank == 1
    strategy = hwplace.FlexiblePlacementStrategy([[0], [3, 10**8]])
    with pytest.raises(hwplace.PlacementError, match=r"^process 1 asks for resource 100000000, but ") as info:
        strategy.get_placement(cluster_of([4]))
    assert info.value.rank == 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3), max_size=3), st.integers(min_value=4, max_value=10**30))
def test_flexible_with_any_absurd_id_is_a_placement_error(ids: list[int], absurd: int) -> None:
    lists = [[i] for i in ids] + [[absurd, 0]]
    with pytest.raises(hwplace.PlacementError, match=rf"^process {len(ids)} asks for resource {absurd}, but ") as info:
        hwplace.FlexiblePlacementStrategy(lists).get_placement(cluster_of([4]))
    assert info.value.rank == len(ids)


def test_flexible_id_just_beyond_the_group() -> None:
    with pytest.raises(hwplace.PlacementError, match=r"^process 0 asks for resource 4, "):
        hwplace.FlexiblePlacementStrategy([[4]]).get_placement(cluster_of([4]))
    with pytest.raises(hwplace.PlacementError, match=r"^process 0 asks for resource 4, "):
        hwplace.FlexiblePlacementStrategy([[3, 4]]).get_placement(cluster_of([4]))
    assert where(hwplace.FlexiblePlacementStrategy([[3]]).get_placement(cluster_of([4]))) == [(0, (3,))]


def test_flexible_on_a_group_without_resources() -> None:
    section = {"node_groups": [{"label": "empty", "node_ranks": 0, "hardware": {"type": "fake-accelerator"}}]}
    with pytest.raises(hwplace.PlacementError, match=r"^process 0 asks for resource 0, but .*\b0 fake-accelerator "
                                                     r"resources$"):
        hwplace.FlexiblePlacementStrategy([[0]], node_group="empty").get_placement(cluster_of([0], **section))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=4, unique=True),
                min_size=1, max_size=6),
       st.booleans())
def test_flexible_never_mutates_its_input(lists: list[list[int]], as_tuples: bool) -> None:
    given_lists: Any = tuple(tuple(ids) for ids in lists) if as_tuples else lists
    inner = list(given_lists)
    snapshot = copy.deepcopy(given_lists)
    strategy = hwplace.FlexiblePlacementStrategy(given_lists)
    placements = strategy.get_placement(cluster_of([8]))
    strategy.get_placement(cluster_of([8]), isolate_accelerator=False)
    assert given_lists == snapshot
    assert all(a is b for a, b in zip(given_lists, inner, strict=True))
    assert [p.local_hardware_ranks for p in placements] == [tuple(sorted(ids)) for ids in lists]


def test_flexible_repr() -> None:
    strategy = hwplace.FlexiblePlacementStrategy([[0], [1]], node_group="cluster")
    assert repr(strategy) == "FlexiblePlacementStrategy(2 processes, node_group=['cluster'])"


# -- NodePlacementStrategy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "message", "rank"),
    [
        ([], r"^node_ranks must be a non-empty list of node indices, got \[\]$", None),
        ("0", r"^node_ranks must be a non-empty list of node indices, got '0'$", None),
        (0, r"^node_ranks must be a non-empty list of node indices, got 0$", None),
        ([0, -1], r"^process 1: -1 is not a node index \(a non-negative integer\)$", 1),
        ([True], r"^process 0: True is not a node index", 0),
        ([0, 0, "1"], r"^process 2: '1' is not a node index", 2),
        ([0.0], r"^process 0: 0\.0 is not a node index", 0),
    ],
)
def test_node_strategy_rejects_malformed_ranks(ranks: Any, message: str, rank: int | None) -> None:
    with pytest.raises(hwplace.PlacementError, match=message) as info:
        hwplace.NodePlacementStrategy(ranks)
    assert info.value.rank == rank


def test_node_strategy_with_an_absurd_index_fails_naming_it() -> None:
    with pytest.raises(hwplace.PlacementError, match=r"^process 2 asks for resource 100000000, but .*'node'.* 2 nodes "
                                                     r"\(ranks 0-1\)$") as info:
        hwplace.NodePlacementStrategy([0, 1, 10**8]).get_placement(cluster_of([1, 1]))
    assert info.value.rank == 2


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=2, max_value=10**30))
def test_node_strategy_with_any_absurd_index_is_a_placement_error(index: int) -> None:
    with pytest.raises(hwplace.PlacementError, match=rf"^process 1 asks for resource {index}, but "):
        hwplace.NodePlacementStrategy([1, index]).get_placement(cluster_of([1, 1]))


def test_node_strategy_on_accelerator_groups_counts_their_nodes() -> None:
    cluster = cluster_of([2, 2, 2], node_groups=[{"label": "gpu", "node_ranks": "1-2"}])
    placements = hwplace.NodePlacementStrategy([1, 0, 1], node_group="gpu").get_placement(cluster)
    assert [(p.node_rank, p.hardware_type, p.node_group) for p in placements] == [
        (2, "node", "gpu"), (1, "node", "gpu"), (2, "node", "gpu")]
    assert [(p.local_rank, p.local_world_size) for p in placements] == [(0, 2), (0, 1), (1, 2)]
    assert all(p.visible_accelerators == (0, 1) and p.local_accelerator_id == -1 for p in placements)
    with pytest.raises(hwplace.PlacementError, match=r"^process 0 asks for resource 2, but .*'gpu'.*\b2 nodes "
                                                     r"\(ranks 0-1\)$"):
        hwplace.NodePlacementStrategy([2], node_group="gpu").get_placement(cluster)


def test_node_strategy_repr() -> None:
    assert repr(hwplace.NodePlacementStrategy((1, 0))) == "NodePlacementStrategy([1, 0], node_group=['node'])"
    assert hwplace.NodePlacementStrategy([1, 0]).node_ranks == (1, 0)


# -- node_group and isolate_accelerator ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        (5, r"^node_group must be a group label, 'a,b', a NodeGroup or a list of those, got 5$"),
        (2.5, r"^node_group must be .* got 2\.5$"),
        ({"gpu"}, r"^node_group must be .* got \{'gpu'\}$"),
        ({"gpu": 1}, r"^node_group must be .* got \{'gpu': 1\}$"),
        ([3], r"^node_group holds 3; a group is a label \(a string\) or a NodeGroup$"),
        (["cluster", None], r"^node_group holds None; a group is a label"),
        ((["cluster"],), r"^node_group holds \['cluster'\]; a group is a label"),
        (b"gpu", r"^node_group holds 103; a group is a label"),
        ([], r"^node_group names no group$"),
        ((), r"^node_group names no group$"),
    ],
)
def test_node_group_must_name_groups(selection: Any, message: str) -> None:
    for make in (lambda: hwplace.PackedPlacementStrategy(0, 0, node_group=selection),
                 lambda: hwplace.FlexiblePlacementStrategy([[0]], node_group=selection),
                 lambda: hwplace.NodePlacementStrategy([0], node_group=selection)):
        with pytest.raises(hwplace.PlacementError, match=message):
            make()


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.integers(), st.floats(), st.binary(min_size=1), st.lists(st.integers(), min_size=1),
                 st.lists(st.none(), min_size=1), st.sets(st.text(), min_size=1)))
def test_any_non_label_node_group_is_a_placement_error(selection: Any) -> None:
    with pytest.raises(hwplace.PlacementError, match=r"^node_group "):
        hwplace.PackedPlacementStrategy(0, 0, node_group=selection)


def test_node_group_labels_are_split_and_stripped() -> None:
    cluster = cluster_of([1, 1], node_groups=[{"label": "a", "node_ranks": 1}, {"label": "b", "node_ranks": 0}])
    strategy = hwplace.PackedPlacementStrategy(0, 1, node_group=" a ,b ")
    assert strategy.node_group == ("a", "b")
    assert strategy.group_labels == ["a", "b"]
    assert [(p.node_rank, p.node_group) for p in strategy.get_placement(cluster)] == [(1, "a"), (0, "b")]


def test_node_group_takes_node_group_objects() -> None:
    cluster = cluster_of([1, 1], node_groups=[{"label": "a", "node_ranks": 1}])
    group = cluster.config.group("a")
    strategy = hwplace.PackedPlacementStrategy(0, 0, node_group=[group])
    assert strategy.node_group == (group,)
    assert strategy.group_labels == ["a"]
    assert where(strategy.get_placement(cluster)) == [(1, (0,))]
    only = hwplace.PackedPlacementStrategy(0, 0, node_group=group)
    assert only.node_group == (group,)
    assert where(only.get_placement(cluster)) == [(1, (0,))]
    mixed = hwplace.FlexiblePlacementStrategy([[0]], node_group=(group, "cluster"))
    with pytest.raises(hwplace.PlacementError, match="share fake-accelerator 0 of node 1"):
        mixed.get_placement(cluster)


def test_a_node_group_object_naming_nodes_beyond_the_cluster_is_a_placement_error() -> None:
    cluster = cluster_of([2, 2])
    group = hwplace.NodeGroup("extra", (0, 5, 6))  # given directly, the config never checked it: IndexError
    for strategy in (hwplace.PackedPlacementStrategy(0, 0, node_group=group),
                     hwplace.FlexiblePlacementStrategy([[0]], node_group=[group]),
                     hwplace.NodePlacementStrategy([0], node_group=group)):
        with pytest.raises(hwplace.PlacementError, match=r"^node group 'extra' names nodes 5-6, but the cluster "
                                                         r"has 2 nodes \(ranks 0-1\)$"):
            strategy.get_placement(cluster)


def test_default_groups() -> None:
    assert hwplace.PackedPlacementStrategy(0, 0).node_group == ("cluster",)
    assert hwplace.FlexiblePlacementStrategy([[0]], node_group=None).node_group == ("cluster",)
    assert hwplace.NodePlacementStrategy([0]).node_group == ("node",)


def test_an_unknown_group_is_a_config_error() -> None:
    with pytest.raises(hwplace.ConfigError, match=r"there is no node group 'gpus'.*did you mean 'gpu'"):
        hwplace.PackedPlacementStrategy(0, 0, node_group="gpus").get_placement(
            cluster_of([1], node_groups=[{"label": "gpu", "node_ranks": 0}]))


@pytest.mark.parametrize("flag", [1, 0, None, "yes", "False"])
def test_isolate_accelerator_must_be_a_bool(flag: Any) -> None:
    for strategy in (hwplace.PackedPlacementStrategy(0, 0), hwplace.FlexiblePlacementStrategy([[0]]),
                     hwplace.NodePlacementStrategy([0])):
        with pytest.raises(hwplace.PlacementError, match=rf"^isolate_accelerator must be True or False, got "
                                                         rf"{flag!r}$"):
            strategy.get_placement(cluster_of([1]), isolate_accelerator=flag)


def test_the_base_strategy_has_no_resource_lists() -> None:
    strategy = hwplace.PlacementStrategy()
    assert strategy.node_group == ("cluster",)
    cluster = cluster_of([1])
    with pytest.raises(NotImplementedError, match=r"^$"):
        strategy.get_placement(cluster)
    space = strategy.resource_space(cluster)
    assert len(space) == 1


def test_strategy_resource_space_is_the_groups() -> None:
    cluster = cluster_of([2, 2], node_groups=[{"label": "a", "node_ranks": 1}])
    space = hwplace.NodePlacementStrategy([0], node_group="a").resource_space(cluster)
    assert [(r.node_rank, r.hardware_type) for r in space.resources] == [(1, "node")]
    assert space.is_node_kind
    space = hwplace.FlexiblePlacementStrategy([[0]], node_group="a").resource_space(cluster)
    assert [(r.node_rank, r.hardware_type, r.local_index) for r in space.resources] == [
        (1, "fake-accelerator", 0), (1, "fake-accelerator", 1)]
    assert not space.is_node_kind


# -- ComponentPlacement edges ------------------------------------------------------------------------


@pytest.mark.parametrize("name", [5, None, ["actor"], b"actor", ("actor",)])
def test_component_names_must_be_strings(name: Any) -> None:
    section = {"num_nodes": 1, "component_placement": {"actor": "0"}}
    placement = hwplace.ComponentPlacement({"cluster": section}, cluster_of([1]))
    for ask in (placement.get_strategy, placement.get_world_size, placement.get_placements, placement.spec):
        with pytest.raises(hwplace.ConfigError, match=r"^cluster\.component_placement: has no component .*; "
                                                      r"components: actor"):
            ask(name)


@settings(max_examples=30, deadline=None)
@given(st.one_of(st.integers(), st.floats(allow_nan=False), st.none(), st.binary(), st.lists(st.text(), max_size=2),
                 st.tuples(st.text())))
def test_any_non_string_component_name_is_a_config_error(name: Any) -> None:
    section = {"num_nodes": 1, "component_placement": {"actor": "0"}}
    placement = hwplace.ComponentPlacement({"cluster": section}, cluster_of([1]))
    with pytest.raises(hwplace.ConfigError, match=r"^cluster\.component_placement: has no component "):
        placement.get_strategy(name)


def test_component_strategy_is_built_once_and_reproduces_the_placements() -> None:
    section = {"num_nodes": 2, "component_placement": {"actor": "0-3:0-1", "agent": {"node_group": "node",
                                                                                     "placement": "0-1:0-3"}}}
    cluster = cluster_of([2, 2])
    placement = hwplace.ComponentPlacement({"cluster": section}, cluster)
    actor = placement.get_strategy("actor")
    assert actor is placement.get_strategy("actor")
    assert isinstance(actor, hwplace.FlexiblePlacementStrategy)
    assert actor.accelerator_id_lists == ((0, 1), (2, 3))
    assert actor.get_placement(cluster) == placement.get_placements("actor")
    agent = placement.get_strategy("agent")
    assert isinstance(agent, hwplace.NodePlacementStrategy)
    assert agent.node_ranks == (0, 0, 1, 1)
    assert agent.get_placement(cluster) == placement.get_placements("agent")


def test_a_planned_strategy_is_an_immutable_value() -> None:
    section = {"num_nodes": 1, "component_placement": {"actor": "0-1", "agent": {"node_group": "node",
                                                                                 "placement": "0:0-1"}}}
    cluster = cluster_of([2])
    placement = hwplace.ComponentPlacement({"cluster": section}, cluster)
    for name in placement.components:
        strategy = placement.get_strategy(name)
        plan = strategy.planned
        assert plan is not None
        assert plan.cluster is cluster
        assert plan.placements == tuple(placement.get_placements(name))
        for attribute in ("planned", "_plan", "node_group", "accelerator_id_lists", "node_ranks", "anything"):
            with pytest.raises(dataclasses.FrozenInstanceError, match=r"a planned strategy is immutable"):
                setattr(strategy, attribute, None)
        for attribute in ("_plan", "node_group"):
            with pytest.raises(dataclasses.FrozenInstanceError, match=r"a planned strategy is immutable"):
                delattr(strategy, attribute)
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'placements'"):
            plan.placements = ()  # type: ignore[misc]
        handed = strategy.get_placement(cluster)
        handed.clear()  # the caller's own list
        assert strategy.get_placement(cluster) == placement.get_placements(name)
        assert strategy.planned is plan
        assert copy.copy(strategy).planned is plan  # a copy is planned, hence frozen, too
        with pytest.raises(dataclasses.FrozenInstanceError, match=r"a planned strategy is immutable"):
            copy.copy(strategy).node_group = ("cluster",)


def test_planning_a_strategy_copies_it_and_leaves_it_as_it_was() -> None:
    cluster = cluster_of([2])
    strategy = hwplace.FlexiblePlacementStrategy([[1], [0]])
    placements = strategy.get_placement(cluster)
    planned = strategy.planned_on(cluster, placements)
    assert (strategy.planned, type(planned), planned.accelerator_id_lists) == (None, type(strategy), ((1,), (0,)))
    strategy.accelerator_id_lists = ((0,),)  # a strategy nobody planned stays an ordinary object
    assert planned.accelerator_id_lists == ((1,), (0,))
    assert planned.planned is not None
    assert planned.planned.placements == tuple(placements)
    assert planned.get_placement(cluster)[0] is placements[0]  # on its cluster: the plan, not rebuilt
    assert planned.get_placement(cluster_of([2])) == placements  # elsewhere: placed anew


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0,,1", "empty entry; entries are 'resource_ranks[:process_ranks]' separated by single commas"),
        ("0:1:2", "more than one ':'; an entry is 'resource_ranks[:process_ranks]'"),
        ("x", "resource ranks are 'x'; allowed: 'a', 'a-b' or 'all' with non-negative integers"),
        (":0", "resource ranks are nothing; allowed: 'a', 'a-b' or 'all' with non-negative integers"),
        ("0:x", "process ranks are 'x'; allowed: 'a' or 'a-b' with non-negative integers"),
        ("0: ", "process ranks are nothing; allowed: 'a' or 'a-b' with non-negative integers"),
        ("0:ALL", "process ranks cannot be 'all'; give a range such as 0-7"),
        ("3-1", "resource ranks: range 3-1 is descending; write 1-3"),
        ("0:3-1", "process ranks: range 3-1 is descending; write 1-3"),
        ("1234567890123456789", "resource ranks: 12345678... has 19 digits; a rank has at most 18"),
        ("0:0-1234567890123456789", "process ranks: 12345678... has 19 digits; a rank has at most 18"),
        ("0-1,1-2", "resources 1-2 overlap or precede the previous entry's 0-1; entries must be in ascending "
                    "resource order and may not overlap"),
        ("0:1", "process ranks start at 1 but must continue at 0: a component's processes are 0..N-1, each exactly "
                "once, in ascending entry order"),
        ("0-2:0-1", "3 resources and 2 processes: one count must divide the other (several resources per process, "
                    "or several processes per resource)"),
        ("0:0-1000000", "process rank 1000000 is too large; a component has at most 1000000 processes"),
    ],
)
def test_placement_string_errors_word_for_word(text: str, reason: str) -> None:
    section = {"num_nodes": 1, "component_placement": {"actor": text}}
    with pytest.raises(hwplace.PlacementError, match=r"^component 'actor', entry ") as info:
        hwplace.ComponentPlacement({"cluster": section}, cluster_of([4]))
    assert info.value.reason == reason
    assert info.value.component == "actor"


def test_an_eighteen_digit_rank_is_a_rank() -> None:
    section = {"num_nodes": 1, "component_placement": {"actor": "123456789012345678"}}
    with pytest.raises(hwplace.PlacementError, match=r"resource rank 123456789012345678 does not exist: .*\(ranks "
                                                     r"0-3\)$"):
        hwplace.ComponentPlacement({"cluster": section}, cluster_of([4]))


# -- the rules on each process (hwplace.placement) ---------------------------------------------------


def hand_cluster(*per_node: tuple[hwplace.Device, ...], manager: PluginManager | None = None,
                 hardware_type: str = "fake-accelerator", **section: Any) -> hwplace.Cluster:
    nodes = [hwplace.Node(rank, f"host-{rank}", f"10.0.0.{rank}",
                          {hardware_type: devs, "node": (hwplace.Device(0, "node"),)})
             for rank, devs in enumerate(per_node)]
    return hwplace.Cluster({"num_nodes": len(nodes), **section}, nodes=nodes, plugin_manager=manager)


def test_a_process_on_an_unhealthy_device_is_refused_naming_it() -> None:
    cluster = hand_cluster(devices(2), devices(3, {1: "ECC errors"}))
    with pytest.raises(hwplace.PlacementError, match=r"^process 3 would use fake-accelerator 1 on node 1, which is "
                                                     r"unhealthy: ECC errors$") as info:
        hwplace.PackedPlacementStrategy(0, 4).get_placement(cluster)
    assert info.value.rank == 3


def test_a_multi_device_process_with_one_unhealthy_device_is_refused() -> None:
    cluster = hand_cluster(devices(4, {3: "fell off the bus"}))
    with pytest.raises(hwplace.PlacementError, match=r"^process 1 would use fake-accelerator 3 on node 0, which is "
                                                     r"unhealthy: fell off the bus$") as info:
        hwplace.PackedPlacementStrategy(0, 3, num_accelerators_per_process=2).get_placement(cluster)
    assert info.value.rank == 1
    with pytest.raises(hwplace.PlacementError, match=r"^process 0 would use fake-accelerator 3 on node 0"):
        hwplace.FlexiblePlacementStrategy([[3, 0]]).get_placement(cluster)


def test_an_unhealthy_device_without_a_reason() -> None:
    cluster = hand_cluster((hwplace.Device(0, "gpu", healthy=False),))
    with pytest.raises(hwplace.PlacementError, match=r"which is unhealthy: no reason given$"):
        hwplace.PackedPlacementStrategy(0, 0).get_placement(cluster)


def test_healthy_devices_beside_an_unhealthy_one_are_used() -> None:
    cluster = hand_cluster(devices(4, {1: "ECC errors"}))
    placements = hwplace.FlexiblePlacementStrategy([[0], [2, 3]]).get_placement(cluster)
    assert where(placements) == [(0, (0,)), (0, (2, 3))]
    shared = hwplace.FlexiblePlacementStrategy([[2]]).get_placement(cluster, isolate_accelerator=False)
    assert shared[0].visible_accelerators == (0, 1, 2, 3)  # it sees the node's, but owns only a healthy one


def test_the_health_check_through_component_placement() -> None:
    section = {"num_nodes": 1, "component_placement": {"actor": "0-1", "critic": "2,3"}}
    cluster = hand_cluster(devices(4, {3: "ECC errors"}), component_placement=section["component_placement"])
    with pytest.raises(hwplace.PlacementError, match=r"^component 'critic', entry '3' of '2,3': process 1 would use "
                                                     r"fake-accelerator 3 on node 0, which is unhealthy: ECC errors$"):
        hwplace.ComponentPlacement({"cluster": section}, cluster)


def test_a_process_may_not_span_nodes() -> None:
    with pytest.raises(hwplace.PlacementError, match=r"^process 1 would span nodes 0 and 1 \(resources \[1, 2\]\); a "
                                                     r"process's resources must lie on one node$") as info:
        hwplace.FlexiblePlacementStrategy([[0], [2, 1]]).get_placement(cluster_of([2, 2]))
    assert info.value.rank == 1
    with pytest.raises(hwplace.PlacementError, match=r"^process 0 would span nodes 0 and 2 \(resources \[0, 1, 4\]\)"):
        hwplace.FlexiblePlacementStrategy([[0, 4, 1]]).get_placement(cluster_of([2, 2, 2]))


def test_a_process_may_not_mix_hardware_types() -> None:
    section = {"node_groups": [{"label": "gpu", "node_ranks": 0}, {"label": "arm", "node_ranks": 0, "hardware": {
        "type": "fake-robot", "configs": [{"node_rank": 0, "name": "x"}]}}]}
    cluster = cluster_of([2], **section)
    with pytest.raises(hwplace.PlacementError, match=r"^process 0 would mix hardware types fake-accelerator and "
                                                     r"fake-robot; a process's resources are of one type$"):
        hwplace.FlexiblePlacementStrategy([[1, 2]], node_group="gpu,arm").get_placement(cluster)


def test_a_node_kind_process_holds_exactly_one_node() -> None:
    cluster = cluster_of([0, 0, 0])
    for group in ("node", "cluster"):  # without accelerators the reserved group 'cluster' is of node kind too
        with pytest.raises(hwplace.PlacementError, match=r"^process 1 would hold 2 nodes; a process holds exactly one "
                                                         r"node$") as info:
            hwplace.FlexiblePlacementStrategy([[0], [1, 2]], node_group=group).get_placement(cluster)
        assert info.value.rank == 1
    placements = hwplace.FlexiblePlacementStrategy([[2], [2], [0]], node_group="node").get_placement(cluster)
    assert [(p.node_rank, p.local_rank, p.local_world_size) for p in placements] == [(2, 0, 2), (2, 1, 2), (0, 0, 1)]


# -- isolation_env: what backends receive and what they may return -----------------------------------


class Recording(hwplace.HardwareBackend):
    """An accelerator backend whose isolation_env records its calls and answers through ``answer``."""

    name = "test-recording"
    kind = "accelerator"

    def __init__(self, answer: Callable[[Sequence[hwplace.Device]], Any] | None = None) -> None:
        self.calls: list[Any] = []
        self.answer = answer

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        return []

    def isolation_env(self, devices: Sequence[hwplace.Device]) -> Any:
        self.calls.append(devices)
        if self.answer is not None:
            return self.answer(devices)
        return {"REC_VISIBLE": ",".join(d.properties["uuid"] for d in devices)}


def recorded(count: int) -> tuple[hwplace.Device, ...]:
    return tuple(hwplace.Device(i, "rec", properties={"uuid": f"U{i}"}) for i in range(count))


def with_recording(answer: Callable[[Sequence[hwplace.Device]], Any] | None,
                   run: Callable[[hwplace.Cluster], object], count: int = 4) -> Recording:
    backend = Recording(answer)
    manager = PluginManager()
    with registered_plugin(backend_plugin(backend), name="test-recording-plugin", plugin_manager=manager):
        run(hand_cluster(recorded(count), recorded(count), manager=manager, hardware_type=Recording.name))
    return backend


def test_isolation_env_receives_device_records_in_ascending_index_order() -> None:
    out: list[list[hwplace.Placement]] = []
    backend = with_recording(None, lambda c: out.append(
        hwplace.FlexiblePlacementStrategy([[3, 0, 2], [5], [4, 7]]).get_placement(c)))
    assert backend.calls == [recorded(4)[0:1] + recorded(4)[2:4], recorded(4)[1:2], (recorded(4)[0], recorded(4)[3])]
    assert all(type(call) is tuple for call in backend.calls)
    assert [p.env for p in out[0]] == [{"REC_VISIBLE": "U0,U2,U3"}, {"REC_VISIBLE": "U1"}, {"REC_VISIBLE": "U0,U3"}]


def test_isolation_env_without_isolation_receives_all_of_the_nodes_devices() -> None:
    out: list[list[hwplace.Placement]] = []
    backend = with_recording(None, lambda c: out.append(
        hwplace.FlexiblePlacementStrategy([[1], [2, 3], [5]]).get_placement(c, isolate_accelerator=False)))
    assert all(call == recorded(4) for call in backend.calls)
    assert [p.env for p in out[0]] == [{"REC_VISIBLE": "U0,U1,U2,U3"}] * 3
    assert [p.visible_accelerators for p in out[0]] == [(0, 1, 2, 3)] * 3
    assert [p.local_hardware_ranks for p in out[0]] == [(1,), (2, 3), (1,)]


def test_isolation_env_is_asked_once_per_distinct_device_set() -> None:
    backend = with_recording(None, lambda c: hwplace.PackedPlacementStrategy(0, 3).get_placement(c), count=2)
    assert len(backend.calls) == 4
    backend = with_recording(None, lambda c: hwplace.FlexiblePlacementStrategy(
        [[0], [0], [1], [0], [2]]).get_placement(c), count=2)
    assert backend.calls == [recorded(2)[:1], recorded(2)[1:], recorded(2)[:1]]


def raising(exc: BaseException) -> Callable[[Sequence[hwplace.Device]], Any]:
    def answer(devices: Sequence[hwplace.Device]) -> Any:
        raise exc

    return answer


BAD_ANSWERS: list[tuple[Callable[[Sequence[hwplace.Device]], Any], str]] = [
    (lambda d: None, r"returned None, not a dict of strings$"),
    (lambda d: "REC=1", r"returned 'REC=1', not a dict of strings$"),
    (lambda d: [("REC", "1")], r"returned \[\('REC', '1'\)\], not a dict of strings$"),
    (lambda d: {"REC": 1}, r"returned \{'REC': 1\}, not a dict of strings$"),
    (lambda d: {"OK": "1", "REC": None}, r"returned \{'OK': '1', 'REC': None\}, not a dict of strings$"),
    (lambda d: {1: "x"}, r"returned \{1: 'x'\}, not a dict of strings$"),
    (lambda d: {"A=B": "1"}, r"returned variable 'A=B'='1', which no environment can hold$"),
    (lambda d: {"A\0": "1"}, r"returned variable 'A\\x00'='1', which no environment can hold$"),
    (lambda d: {"A": "1\0"}, r"returned variable 'A'='1\\x00', which no environment can hold$"),
    (lambda d: {"": "1"}, r"returned variable ''='1', which no environment can hold$"),
    (raising(RuntimeError("driver gone")), r"raised RuntimeError\('driver gone'\)$"),
    (raising(KeyError("uuid")), r"raised KeyError\('uuid'\)$"),
]


@pytest.mark.parametrize(("answer", "problem"), BAD_ANSWERS)
def test_a_broken_isolation_env_is_a_plugin_error_naming_the_backend(
    answer: Callable[[Sequence[hwplace.Device]], Any], problem: str,
) -> None:
    with pytest.raises(hwplace.PluginError, match=r"^backend 'test-recording': isolation_env\(devices \[1, 2\]\) "
                                                  + problem):
        with_recording(answer, lambda c: hwplace.FlexiblePlacementStrategy([[2, 1]]).get_placement(c))


def test_a_raising_isolation_env_keeps_its_cause() -> None:
    cause = RuntimeError("driver gone")
    with pytest.raises(hwplace.PluginError, match="driver gone") as info:
        with_recording(raising(cause), lambda c: hwplace.PackedPlacementStrategy(0, 0).get_placement(c))
    assert info.value.__cause__ is cause


def test_an_isolation_env_that_exits_is_a_plugin_error() -> None:
    with pytest.raises(hwplace.PluginError, match=r"^backend 'test-recording': isolation_env\(devices \[0\]\) raised "
                                                  r"SystemExit\(3\)$"):
        with_recording(raising(SystemExit(3)), lambda c: hwplace.PackedPlacementStrategy(0, 0).get_placement(c))


def test_a_broken_isolation_env_through_component_placement() -> None:
    def run(cluster: hwplace.Cluster) -> None:
        hwplace.ComponentPlacement({"cluster": {"num_nodes": 2, "component_placement": {"actor": "0"}}}, cluster)

    with pytest.raises(hwplace.PluginError, match=r"^backend 'test-recording': isolation_env\(devices \[0\]\) "):
        with_recording(lambda d: {"A": 1}, run)


def test_an_isolation_env_mapping_is_copied_into_a_read_only_env() -> None:
    shared = {"REC": "x"}
    out: list[list[hwplace.Placement]] = []
    with_recording(lambda d: shared, lambda c: out.append(hwplace.PackedPlacementStrategy(0, 1).get_placement(c)))
    shared["REC"] = "changed"
    assert [p.env for p in out[0]] == [{"REC": "x"}, {"REC": "x"}]
    assert all(type(p.env) is FrozenDict for p in out[0])


def test_an_isolation_env_may_be_any_mapping_of_strings() -> None:
    out: list[list[hwplace.Placement]] = []
    with_recording(lambda d: MappingProxyType({"REC": str(d[0].index)}),
                   lambda c: out.append(hwplace.PackedPlacementStrategy(0, 1).get_placement(c)))
    assert [p.env for p in out[0]] == [{"REC": "0"}, {"REC": "1"}]
    assert all(type(p.env) is FrozenDict for p in out[0])


def test_component_placement_asks_once_per_device_and_its_components_share_what_a_device_sees() -> None:
    planned: list[hwplace.ComponentPlacement] = []
    config = {"cluster": {"num_nodes": 2, "component_placement": {"actor": "all", "rollout": "0-7:0-15"}}}
    backend = with_recording(None, lambda c: planned.append(hwplace.ComponentPlacement(config, c)))
    assert len(backend.calls) == 8  # one per device, though 24 processes on two components use them
    actor, rollout = planned[0].get_placements("actor"), planned[0].get_placements("rollout")
    for p in actor:
        same = [q for q in rollout if (q.node_rank, q.local_hardware_ranks) == (p.node_rank, p.local_hardware_ranks)]
        assert len(same) == 2
        assert all(q.env is p.env and q.visible_accelerators is p.visible_accelerators for q in same)
    assert [p.local_rank for p in rollout] == [*range(8), *range(8)]
    assert [p.local_world_size for p in rollout] == [8] * 16


def test_a_device_process_hides_the_nodes_accelerators() -> None:
    calls: list[Any] = []

    def record(devices: Sequence[hwplace.Device]) -> dict[str, str]:
        calls.append(devices)
        return {"REC_VISIBLE": "none" if not devices else "some"}

    backend = Recording(record)
    manager = PluginManager()
    section = {"num_nodes": 1, "node_groups": [{"label": "arm", "node_ranks": 0, "hardware": {
        "type": "fake-robot", "configs": [{"node_rank": 0, "name": "x"}]}}]}
    with registered_plugin(backend_plugin(backend), name="test-recording-plugin", plugin_manager=manager):
        cluster = fake_cluster(section, accelerators_per_node=2, accelerator_type=Recording.name,
                               plugin_manager=manager)
        [p] = hwplace.FlexiblePlacementStrategy([[0]], node_group="arm").get_placement(cluster)
        assert calls == [()]
        assert p.env == {"FAKE_ROBOTS": "x", "REC_VISIBLE": "none"}
        assert p.visible_accelerators == ()
        [shared] = hwplace.FlexiblePlacementStrategy([[0]], node_group="arm").get_placement(
            cluster, isolate_accelerator=False)
        assert calls == [()]  # not hidden: the accelerator backend is not asked
        assert shared.env == {"FAKE_ROBOTS": "x"}
        assert shared.visible_accelerators == (0, 1)


def test_a_hardware_type_without_a_backend_here_is_a_placement_error() -> None:
    robot = {"type": "fake-robot", "configs": [{"node_rank": 0}]}
    section = {"num_nodes": 1, "node_groups": [{"label": "x", "node_ranks": 0, "hardware": robot}]}
    cluster = fake_cluster(section)
    manager = PluginManager()
    space = resource_space(cluster, [cluster.config.group("x")])
    from hwplace.planning.placements import build_placements

    with registered_plugin(object(), name="fake", plugin_manager=manager):  # sets the fake plugin aside
        assert "fake-robot" not in manager.backends()
        lonely = hwplace.Cluster(cluster.config, nodes=cluster.nodes, plugin_manager=manager)
        with pytest.raises(hwplace.PlacementError, match=r"^no hardware backend 'fake-robot' is registered on this "
                                                         r"machine$"):
            build_placements(lonely, space, [[0]], True)
    assert "fake-robot" in manager.backends()  # and back afterwards


# -- the Placement record ----------------------------------------------------------------------------


def test_placement_is_immutable() -> None:
    [p] = hwplace.PackedPlacementStrategy(0, 0).get_placement(cluster_of([1]))
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'rank'"):
        p.rank = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'env'"):
        p.env = FrozenDict()  # type: ignore[misc]
    # slots: no new attributes (CPython 3.11 words this TypeError oddly for frozen slotted dataclasses)
    with pytest.raises((AttributeError, TypeError), match=r"extra|super\(type, obj\)"):
        p.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="read-only"):
        p.env["FAKE_VISIBLE_DEVICES"] = "1"
    assert not hasattr(p, "__dict__")
    assert type(p.visible_accelerators) is tuple
    assert type(p.local_hardware_ranks) is tuple


def test_placement_pickles_and_copies_equal() -> None:
    placements = hwplace.PackedPlacementStrategy(0, 3, 2).get_placement(cluster_of([2, 2]))
    for p in placements:
        for again in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p)):
            assert again == p
            assert hash(again) == hash(p)
            assert type(again.env) is FrozenDict
            with pytest.raises(TypeError, match="read-only"):
                again.env["X"] = "1"


def test_placements_compare_by_value() -> None:
    first = hwplace.PackedPlacementStrategy(0, 1).get_placement(cluster_of([2]))
    again = hwplace.PackedPlacementStrategy(0, 1).get_placement(cluster_of([2]))
    assert first == again
    assert first[0] != first[1]
    assert len(set(first + again)) == 2


def test_placement_fields_of_a_robot_process_on_a_node_without_accelerators() -> None:
    section = {"num_nodes": 2, "node_groups": [{"label": "arm", "node_ranks": 1, "hardware": {
        "type": "fake-robot", "configs": [{"node_rank": 1, "name": "x"}, {"node_rank": 1, "name": "y"}]}}]}
    cluster = fake_cluster(section, accelerators_per_node=[2, 0])
    placements = hwplace.PackedPlacementStrategy(0, 1, num_accelerators_per_process=2, node_group="arm").get_placement(
        cluster)
    [p] = placements
    assert (p.rank, p.node_id, p.node_rank, p.local_accelerator_id, p.local_rank, p.local_world_size) == (
        0, "fake-node-1", 1, -1, 0, 1)
    assert (p.visible_accelerators, p.isolate_accelerator, p.local_hardware_ranks) == ((), True, (0, 1))
    assert (p.hardware_type, p.node_group, p.env) == ("fake-robot", "arm", {"FAKE_ROBOTS": "x,y"})


def test_planning_makes_placements_equal_to_the_records_constructor() -> None:
    fields = (3, "node-a", 1, 2, 0, 4, (2,), True, (2,), "fake", "cluster", FrozenDict({"X": "2"}))
    made, built = _new_placement(*fields), hwplace.Placement(*fields)
    assert (made, hash(made), repr(made), type(made)) == (built, hash(built), repr(built), hwplace.Placement)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'rank'"):
        made.rank = 4  # type: ignore[misc]


def test_checked_strategies_equal_the_checking_constructors() -> None:
    lists = ((0, 1), (2,), (3,))
    flexible = hwplace.FlexiblePlacementStrategy.of_checked(lists, node_group="cluster")
    assert vars(flexible) == vars(hwplace.FlexiblePlacementStrategy(lists, node_group="cluster"))
    node = hwplace.NodePlacementStrategy.of_checked((0, 0, 1), node_group=None)
    assert vars(node) == vars(hwplace.NodePlacementStrategy([0, 0, 1]))
    with pytest.raises(hwplace.PlacementError, match="accelerator_id_lists is empty"):
        hwplace.FlexiblePlacementStrategy.of_checked((), node_group=None)
