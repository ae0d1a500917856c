"""Property-based tests of the placement grammar (SPEC section 3) and of ComponentPlacement on it."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from limits import alarm

import hwplace
from hwplace.config.grammar import MAX_PROCESSES, ResolvedEntry, parse_placement, resolve_placement
from hwplace.testing import fake_cluster

ALPHABET = "0123456789-:, all\t"
PER_EXAMPLE_SECONDS = 10


@contextlib.contextmanager
def no_hang(seconds: int = PER_EXAMPLE_SECONDS) -> Iterator[None]:
    """Turn a hang into a test failure (where SIGALRM exists, in the main thread)."""
    with alarm(seconds, lambda: AssertionError(f"no answer within {seconds} s"), where_possible=True):
        yield


# Random strings: characters of the grammar, and tokens of it (which hit valid placements far more often).
TOKENS = ["0", "1", "2", "3", "7", "8", "15", "16", "-", ":", ",", "all", " ", "\t", "0-3", "0-1", "4-7", ":0-7"]
# Near-valid strings: entries of small (possibly descending, overlapping, out-of-range) ranges.
_number = st.integers(min_value=0, max_value=20).map(str)
_range = st.one_of(_number, st.tuples(_number, _number).map("-".join), st.just("all"))
_entry = st.one_of(_range, st.tuples(_range, _range).map(":".join))
grammar_strings = st.one_of(
    st.text(alphabet=ALPHABET, max_size=24),
    st.lists(st.sampled_from(TOKENS), max_size=10).map("".join),
    st.lists(_entry, min_size=1, max_size=5).map(",".join),
)


def check_resolution(text: str, resolved: list[ResolvedEntry], num_resources: int) -> None:
    """The invariants of every successful resolution, without materialising huge process lists."""
    assert resolved, "a successful resolution has at least one entry"
    next_process = 0
    previous_last = -1
    for entry in resolved:
        assert previous_last < entry.first_resource <= entry.last_resource < num_resources
        assert entry.first_process == next_process
        assert entry.last_process >= entry.first_process
        r, p = entry.num_resources, entry.num_processes
        assert r % p == 0 or p % r == 0
        previous_last = entry.last_resource
        next_process = entry.last_process + 1
    assert next_process <= MAX_PROCESSES


def check_error(exc: hwplace.PlacementError, text: str) -> None:
    assert exc.text == text
    assert exc.span is not None
    start, end = exc.span
    assert 0 <= start <= end
    assert start <= len(text)
    assert exc.entry is not None
    assert exc.entry == text[start:end]
    assert exc.reason


# -- (a) random strings: a resolution or a PlacementError, nothing else ----------------------------


@settings(deadline=None, max_examples=600)
@given(text=grammar_strings, num_resources=st.integers(min_value=0, max_value=40))
def test_random_strings_resolve_or_raise_placement_error(text: str, num_resources: int) -> None:
    with no_hang():
        try:
            resolved = resolve_placement(text, parse_placement(text), num_resources, "test resources")
        except hwplace.PlacementError as exc:
            check_error(exc, text)
            return
    check_resolution(text, resolved, num_resources)
    total = resolved[-1].last_process + 1
    if total <= 10_000:
        lists = [list(ids) for entry in resolved for ids in entry.resource_lists()]
        assert len(lists) == total
        assert all(0 <= i < num_resources for ids in lists for i in ids)


@settings(deadline=None, max_examples=300)
@given(text=grammar_strings)
def test_parse_alone_gives_entries_or_placement_error(text: str) -> None:
    with no_hang():
        try:
            entries = parse_placement(text)
        except hwplace.PlacementError as exc:
            check_error(exc, text)
            return
    assert len(entries) == text.count(",") + 1
    for entry in entries:
        start, end = entry.span
        assert text[start:end] == text[start:end].strip()
        assert text[start:end]


# -- (b) generated valid placements ----------------------------------------------------------------


@dataclass(frozen=True)
class Generated:
    text: str
    num_resources: int
    expected: list[list[int]]  # resource ranks of each process, in process order


def _range_text(first: int, last: int, draw: st.DrawFn) -> str:
    if first == last and draw(st.booleans()):
        return str(first)
    return f"{first}-{last}"


@st.composite
def valid_placements(draw: st.DrawFn) -> Generated:
    num_resources = draw(st.integers(min_value=1, max_value=48))
    if draw(st.integers(0, 9)) == 0:  # sometimes the single entry 'all'
        count = num_resources
        processes = draw(
            st.sampled_from(
                [count] + [count // d for d in range(2, count + 1) if count % d == 0] + [count * k for k in (2, 3)]
            )
        )
        suffix = "" if processes == count and draw(st.booleans()) else f":0-{processes - 1}"
        return Generated("all" + suffix, num_resources, _expected(0, count, 0, processes))
    parts: list[str] = []
    expected: list[list[int]] = []
    position, next_process = 0, 0
    while position < num_resources and (not parts or draw(st.booleans())):
        first = position + draw(st.integers(0, min(3, num_resources - position - 1)))
        last = first + draw(st.integers(0, min(7, num_resources - first - 1)))
        count = last - first + 1
        divisors = [d for d in range(1, count + 1) if count % d == 0]
        processes = draw(st.sampled_from(divisors + [count * k for k in (2, 3, 4)]))
        resources_text = _range_text(first, last, draw)
        if processes == count and draw(st.booleans()):
            parts.append(resources_text)
        else:
            parts.append(f"{resources_text}:{_range_text(next_process, next_process + processes - 1, draw)}")
        expected += _expected(first, count, next_process, processes)
        position, next_process = last + 1, next_process + processes
    spaces = st.sampled_from(["", "", " ", "\t", "  "])
    text = ",".join(draw(spaces) + part + draw(spaces) for part in parts)
    return Generated(text, num_resources, expected)


def _expected(first: int, count: int, first_process: int, processes: int) -> list[list[int]]:
    """The SPEC's divisibility rule written out independently of hwplace."""
    if count >= processes:
        share = count // processes
        return [list(range(first + k * share, first + (k + 1) * share)) for k in range(processes)]
    per = processes // count
    return [[first + k // per] for k in range(processes)]


@settings(deadline=None, max_examples=400)
@given(generated=valid_placements())
def test_valid_placements_cover_every_process_once_in_order(generated: Generated) -> None:
    text, n = generated.text, generated.num_resources
    resolved = resolve_placement(text, parse_placement(text), n, "test resources")
    check_resolution(text, resolved, n)
    # Processes are 0..N-1, each exactly once, in ascending entry order.
    ranks = [rank for entry in resolved for rank in range(entry.first_process, entry.last_process + 1)]
    assert ranks == list(range(len(generated.expected)))
    lists = [list(ids) for entry in resolved for ids in entry.resource_lists()]
    assert lists == generated.expected


@settings(deadline=None, max_examples=300)
@given(generated=valid_placements())
def test_valid_placements_follow_the_divisibility_rule(generated: Generated) -> None:
    text, n = generated.text, generated.num_resources
    for entry in resolve_placement(text, parse_placement(text), n, "test resources"):
        lists = [list(ids) for ids in entry.resource_lists()]
        assert len(lists) == entry.num_processes
        r, p = entry.num_resources, entry.num_processes
        if r >= p:
            # each process gets R/P consecutive resources, together exactly the entry's resources, in order
            assert all(len(ids) == r // p for ids in lists)
            assert all(ids == list(range(ids[0], ids[0] + r // p)) for ids in lists)
            assert [i for ids in lists for i in ids] == list(range(entry.first_resource, entry.last_resource + 1))
        else:
            # P/R consecutive processes on each resource, resources in ascending order
            assert all(len(ids) == 1 for ids in lists)
            flat = [ids[0] for ids in lists]
            assert flat == sorted(flat)
            for resource in range(entry.first_resource, entry.last_resource + 1):
                assert flat.count(resource) == p // r


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(generated=valid_placements(), data=st.data())
def test_whitespace_anywhere_changes_nothing(generated: Generated, data: st.DataObject) -> None:
    text, n = generated.text, generated.num_resources
    spaced = "".join(c + data.draw(st.sampled_from(["", "", " ", "\t"])) for c in text)
    before = resolve_placement(text, parse_placement(text), n, "r")
    after = resolve_placement(spaced, parse_placement(spaced), n, "r")
    assert [(e.first_resource, e.last_resource, e.first_process, e.last_process) for e in before] == [
        (e.first_resource, e.last_resource, e.first_process, e.last_process) for e in after
    ]


# -- (c) end to end through ComponentPlacement on a fake cluster ----------------------------------

# At most 4 digits in a row: at most 9,999 processes, so one example stays fast when it builds placements.
bounded_strings = grammar_strings.filter(lambda s: re.search(r"\d{5}", s) is None)
cluster_shapes = st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=3)

_CLUSTERS: dict[tuple[int, ...], hwplace.Cluster] = {}


def cached_cluster(counts: tuple[int, ...]) -> hwplace.Cluster:
    if counts not in _CLUSTERS:
        _CLUSTERS[counts] = fake_cluster({"num_nodes": len(counts)}, accelerators_per_node=list(counts))
    return _CLUSTERS[counts]


def place_or_error(
    config: dict[str, Any], cluster: hwplace.Cluster
) -> hwplace.ComponentPlacement | hwplace.HwplaceError:
    """The placement, or the PlacementError / ConfigError it raised; any other exception propagates."""
    try:
        return hwplace.ComponentPlacement(config, cluster)
    except (hwplace.PlacementError, hwplace.ConfigError) as exc:
        return exc


@settings(deadline=None, max_examples=400)
@given(text=bounded_strings, counts=cluster_shapes, group=st.sampled_from(["cluster", "node"]))
def test_component_placement_of_random_strings(text: str, counts: list[int], group: str) -> None:
    cluster = cached_cluster(tuple(counts))
    config = {
        "cluster": {
            "num_nodes": len(counts),
            "component_placement": {"actor": {"node_group": group, "placement": text}},
        }
    }
    with no_hang():
        placement = place_or_error(config, cluster)
    if isinstance(placement, hwplace.PlacementError):
        assert placement.component == "actor"
        assert placement.text == text
        assert placement.reason
        return
    if isinstance(placement, hwplace.HwplaceError):
        assert isinstance(placement, hwplace.ConfigError), placement
        return
    placements = placement.get_placements("actor")
    world = placement.get_world_size("actor")
    assert [p.rank for p in placements] == list(range(world))
    assert world >= 1
    per_node: dict[int, int] = {}
    for p in placements:
        node = cluster.nodes[p.node_rank]
        assert p.node_id == node.node_id
        # every resource of the process is one of its own node's resources
        if p.hardware_type == "node":
            assert p.local_hardware_ranks == (0,)
            assert p.local_accelerator_id == -1
        else:
            own = {d.index for d in node.devices(p.hardware_type)}
            assert p.local_hardware_ranks
            assert set(p.local_hardware_ranks) <= own
            assert p.local_accelerator_id == p.local_hardware_ranks[0]
        assert p.local_rank == per_node.get(p.node_rank, 0)
        per_node[p.node_rank] = p.local_rank + 1
    for p in placements:
        assert p.local_world_size == per_node[p.node_rank]
    # the strategy that ComponentPlacement hands out reproduces the same placements
    assert placement.get_strategy("actor").get_placement(cluster) == placements


@settings(deadline=None, max_examples=150)
@given(generated=valid_placements())
def test_component_placement_of_valid_strings_matches_the_grammar(generated: Generated) -> None:
    # one node per 8 resources (the last one may hold fewer); processes must not span nodes
    n = generated.num_resources
    counts = [8] * (n // 8) + ([n % 8] if n % 8 else [])
    cluster = cached_cluster(tuple(counts))
    config = {"cluster": {"num_nodes": len(counts), "component_placement": {"actor": generated.text}}}
    spans_nodes = any(len({i // 8 for i in ids}) > 1 for ids in generated.expected)
    placement = place_or_error(config, cluster)
    if spans_nodes:
        assert isinstance(placement, hwplace.PlacementError)
        assert placement.component == "actor"
        assert "one node" in placement.reason
        return
    assert isinstance(placement, hwplace.ComponentPlacement), placement
    got = [(p.node_rank, list(p.local_hardware_ranks)) for p in placement.get_placements("actor")]
    assert got == [(ids[0] // 8, [i % 8 for i in ids]) for ids in generated.expected]


# -- hostile sizes: long numbers and every spelling of 'all' ------------------------------------------


@given(digits=st.integers(min_value=19, max_value=20_000), where=st.sampled_from(["{n}", "0-{n}", "0:{n}", "{n}-{n}"]))
@settings(max_examples=40, deadline=None)
def test_numbers_too_long_for_a_rank_are_a_placement_error(digits: int, where: str) -> None:
    text = where.format(n="7" * digits)
    with pytest.raises(hwplace.PlacementError, match=f"has {digits} digits; a rank has at most 18") as info:
        parse_placement(text)
    assert "set_int_max_str_digits" not in str(info.value)
    assert len(str(info.value)) < 1000


@given(spelling=st.sampled_from(["all", "ALL", "All", "aLl", " a l L "]))
@settings(max_examples=10, deadline=None)
def test_all_in_any_letter_case(spelling: str) -> None:
    assert [(e.resources, e.processes) for e in parse_placement(spelling)] == [(None, None)]
