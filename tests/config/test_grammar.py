"""Unit tests of the placement string grammar (SPEC section 3): parse, resolve, ranges and YAML values."""

from __future__ import annotations

import pytest
import yaml

import hwplace
from hwplace.config import grammar
from hwplace.config.grammar import (
    MAX_PROCESSES,
    Entry,
    ResolvedEntry,
    parse_placement,
    parse_range,
    placement_text,
    resolve_placement,
)

SIXTEEN = "the 16 accelerators of group 'cluster'"


def test_the_range_pattern_ends_at_the_end_of_the_text() -> None:
    # parse_range drops whitespace first, so only the pattern can show it: "$" would match before a final "\n"
    assert grammar._RANGE.match("3-5\n") is None
    assert grammar._RANGE.match("3-5") is not None


def resolve(text: str, num_resources: int = 16) -> list[ResolvedEntry]:
    return resolve_placement(text, parse_placement(text), num_resources, SIXTEEN)


def process_resources(text: str, num_resources: int = 16) -> list[list[int]]:
    """The resource ranks of every process, in process-rank order."""
    return [list(ids) for entry in resolve(text, num_resources) for ids in entry.resource_lists()]


def placement_error(text: str, num_resources: int = 16) -> hwplace.PlacementError:
    with pytest.raises(hwplace.PlacementError, match=r"^entry '.*' of '.*': ") as info:
        resolve(text, num_resources)
    return info.value


# -- the SPEC's examples, on one node of 16 GPUs -------------------------------------------------------


def test_plain_range_gives_one_process_per_resource() -> None:
    assert process_resources("0-7") == [[i] for i in range(8)]


def test_fewer_resources_than_processes_puts_consecutive_processes_on_each_resource() -> None:
    assert process_resources("0-3:0-7") == [[0], [0], [1], [1], [2], [2], [3], [3]]


def test_more_resources_than_processes_gives_each_process_consecutive_resources() -> None:
    assert process_resources("0-7:0-3") == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_three_entry_example_maps_fifteen_processes() -> None:
    lists = process_resources("0-1:0-3,3-5,7-10:7-14")
    assert len(lists) == 15
    assert lists[0:4] == [[0], [0], [1], [1]]  # processes 0-3, two per GPU on GPUs 0-1
    assert lists[4:7] == [[3], [4], [5]]  # processes 4-6 on GPUs 3-5
    assert lists[7:15] == [[7], [7], [8], [8], [9], [9], [10], [10]]  # 7-14, two per GPU on 7-10


def test_three_entry_example_entry_ranges() -> None:
    entries = resolve("0-1:0-3,3-5,7-10:7-14")
    got = [(e.first_resource, e.last_resource, e.first_process, e.last_process) for e in entries]
    assert got == [(0, 1, 0, 3), (3, 5, 4, 6), (7, 10, 7, 14)]
    assert [e.num_resources for e in entries] == [2, 3, 4]
    assert [e.num_processes for e in entries] == [4, 3, 8]


def test_node_group_example_two_processes_per_node() -> None:
    # On group `node` of 2 nodes each node is one resource: 0-1:0-3 puts 0,1 on node 0 and 2,3 on node 1.
    assert process_resources("0-1:0-3", num_resources=2) == [[0], [0], [1], [1]]


def test_commas_always_separate_entries() -> None:
    # `0-3:0-1,4-5` is two entries: the second continues the process numbering at 2.
    entries = resolve("0-3:0-1,4-5")
    assert len(entries) == 2
    assert (entries[1].first_process, entries[1].last_process) == (2, 3)
    assert process_resources("0-3:0-1,4-5") == [[0, 1], [2, 3], [4], [5]]


def test_single_rank_entries() -> None:
    assert process_resources("5") == [[5]]
    assert process_resources("2:0-3") == [[2], [2], [2], [2]]
    assert process_resources("0-3:0") == [[0, 1, 2, 3]]


def test_gaps_between_resource_ranges_are_allowed() -> None:
    assert process_resources("0,2,9-10") == [[0], [2], [9], [10]]


# -- parse_placement ---------------------------------------------------------------------------------


def test_parse_placement_returns_entries_with_spans() -> None:
    text = "0-3:0-1, all"
    entries = parse_placement(text)
    assert entries == [Entry((0, 3), (0, 1), (0, 7)), Entry(None, None, (9, 12))]
    assert [text[e.span[0] : e.span[1]] for e in entries] == ["0-3:0-1", "all"]


def test_whitespace_is_ignored() -> None:
    compact = "0-1:0-3,3-5,7-10:7-14"
    spaced = " 0 - 1 :\t0 - 3 ,  3-5 ,\t7 -10 : 7- 14  "
    assert process_resources(spaced) == process_resources(compact)
    assert [(e.resources, e.processes) for e in parse_placement(spaced)] == [
        (e.resources, e.processes) for e in parse_placement(compact)
    ]


def test_whitespace_around_all_is_ignored() -> None:
    assert process_resources("  all\t") == [[i] for i in range(16)]


def test_all_means_every_resource() -> None:
    assert process_resources("all") == [[i] for i in range(16)]
    assert process_resources("all", num_resources=3) == [[0], [1], [2]]
    assert process_resources("all:0-7") == [[2 * i, 2 * i + 1] for i in range(8)]
    assert process_resources("all:0-31", num_resources=16) == [[i // 2] for i in range(32)]


def test_all_covers_only_the_existing_resources() -> None:
    [entry] = resolve("all", num_resources=5)
    assert (entry.first_resource, entry.last_resource) == (0, 4)


# -- parse_range -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "expected"),
    [("0", (0, 0)), ("7", (7, 7)), ("0-7", (0, 7)), ("3-3", (3, 3)), (" 2 - 5 ", (2, 5)), ("\t12-15\t", (12, 15))],
)
def test_parse_range_accepts_a_and_a_b(part: str, expected: tuple[int, int]) -> None:
    assert parse_range(part) == expected


@pytest.mark.parametrize("part", ["", "a", "-1", "1-", "-", "1-2-3", "1:2", "all", "1,2", "x-3", "1.5"])
def test_parse_range_returns_none_for_non_ranges(part: str) -> None:
    assert parse_range(part) is None


def test_parse_range_rejects_descending_range() -> None:
    with pytest.raises(ValueError, match="descending"):
        parse_range("5-2")


# -- placement_text: YAML values ---------------------------------------------------------------------


def test_placement_text_keeps_strings() -> None:
    assert placement_text("0-3:0-1") == "0-3:0-1"


def test_yaml_integer_counts_as_its_string() -> None:
    value = yaml.safe_load("actor: 7")["actor"]
    assert isinstance(value, int)
    assert placement_text(value) == "7"
    assert process_resources(placement_text(value)) == [[7]]


def test_yaml_zero_is_resource_zero() -> None:
    assert placement_text(0) == "0"
    assert process_resources(placement_text(0)) == [[0]]


@pytest.mark.parametrize("value", [True, False, None, 1.5, ["0-3"], {"a": 1}, b"0-3"])
def test_placement_text_rejects_other_values(value: object) -> None:
    with pytest.raises(hwplace.PlacementError, match="placement"):
        placement_text(value)


def test_negative_yaml_integer_is_a_placement_error() -> None:
    text = placement_text(-1)
    with pytest.raises(hwplace.PlacementError, match="resource ranks are '-1'") as info:
        parse_placement(text)
    assert info.value.entry == "-1"


# -- syntax errors -----------------------------------------------------------------------------------


def parse_error(text: str) -> hwplace.PlacementError:
    with pytest.raises(hwplace.PlacementError, match=r"^entry '.*' of '.*': ") as info:
        parse_placement(text)
    return info.value


def test_errors_are_value_errors_and_hwplace_errors() -> None:
    exc = parse_error("0-3,")
    assert isinstance(exc, ValueError)
    assert isinstance(exc, hwplace.HwplaceError)


def test_trailing_comma_is_an_empty_entry() -> None:
    exc = parse_error("0-3,")
    assert "empty entry" in exc.reason
    assert exc.text == "0-3,"
    assert exc.span is not None
    assert exc.span[0] >= 3  # past the valid first entry
    assert exc.entry == ","
    assert "','" in str(exc)


def test_leading_comma_is_an_empty_entry() -> None:
    exc = parse_error(",0-3")
    assert "empty entry" in exc.reason
    assert exc.entry == ","


def test_double_comma_is_an_empty_entry() -> None:
    exc = parse_error("0-1,,2-3")
    assert "empty entry" in exc.reason
    assert exc.entry == ",,"
    assert exc.span == (3, 5)


def test_empty_string_is_an_error() -> None:
    exc = parse_error("")
    assert "empty entry" in exc.reason


def test_blank_string_is_an_error() -> None:
    exc = parse_error("  \t ")
    assert "empty entry" in exc.reason


def test_two_colons_is_an_error() -> None:
    exc = parse_error("0-1,2-3:0-1:4")
    assert "':'" in exc.reason
    assert exc.entry == "2-3:0-1:4"
    assert exc.span == (4, 13)
    assert "'2-3:0-1:4'" in str(exc)


def test_all_as_process_ranks_is_an_error() -> None:
    exc = parse_error("0-3:all")
    assert "process ranks" in exc.reason
    assert "all" in exc.reason
    assert exc.entry == "0-3:all"


def test_descending_resource_range_is_an_error() -> None:
    exc = parse_error("0-1, 7-4")
    assert "descending" in exc.reason
    assert "resource" in exc.reason
    assert exc.entry == "7-4"
    assert exc.span == (5, 8)


def test_descending_process_range_is_an_error() -> None:
    exc = parse_error("0-3:3-0")
    assert "descending" in exc.reason
    assert "process" in exc.reason
    assert exc.entry == "0-3:3-0"


@pytest.mark.parametrize(
    ("text", "entry", "what"),
    [
        ("a", "a", "resource"),
        ("0-3,x-5", "x-5", "resource"),
        ("0-3:b", "0-3:b", "process"),
        ("1.5", "1.5", "resource"),
        ("-1", "-1", "resource"),
        ("0--3", "0--3", "resource"),
        ("0-3:", "0-3:", "process"),
        (":0-3", ":0-3", "resource"),
        ("0-1 2-3", "0-1 2-3", "resource"),
        ("al", "al", "resource"),
    ],
)
def test_non_numeric_ranks_are_an_error(text: str, entry: str, what: str) -> None:
    exc = parse_error(text)
    assert exc.entry == entry
    assert what in exc.reason
    assert repr(entry) in str(exc)


def test_spans_locate_the_entry_after_whitespace() -> None:
    text = "0-3 ,   bad , 4"
    exc = parse_error(text)
    assert exc.entry == "bad"
    assert exc.span == (8, 11)


# -- resolution errors -------------------------------------------------------------------------------


def test_out_of_range_resource_is_an_error() -> None:
    exc = placement_error("0-7,8-16")
    assert "16" in exc.reason
    assert exc.entry == "8-16"
    assert SIXTEEN in exc.reason  # says what the ranks index
    assert "'8-16'" in str(exc)


def test_single_out_of_range_resource_is_an_error() -> None:
    exc = placement_error("16")
    assert exc.entry == "16"


def test_out_of_range_on_small_group() -> None:
    exc = placement_error("0-1:0-3,2", num_resources=2)
    assert exc.entry == "2"


def test_no_resources_at_all_is_an_error() -> None:
    exc = placement_error("all", num_resources=0)
    assert exc.entry == "all"
    assert "no resources" in exc.reason


def test_overlapping_entries_are_an_error() -> None:
    exc = placement_error("0-3,3-5")
    assert "overlap" in exc.reason
    assert exc.entry == "3-5"
    assert exc.span == (4, 7)


def test_descending_entries_are_an_error() -> None:
    exc = placement_error("4-5,0-1")
    assert "ascending" in exc.reason
    assert exc.entry == "0-1"


def test_all_followed_by_another_entry_overlaps() -> None:
    exc = placement_error("all,3")
    assert exc.entry == "3"


def test_process_ranks_must_start_at_zero() -> None:
    exc = placement_error("0-1:1-2")
    assert "continue at 0" in exc.reason
    assert exc.entry == "0-1:1-2"


def test_process_rank_gap_is_an_error() -> None:
    exc = placement_error("0-1:0-1,2-3:3-4")
    assert "continue at 2" in exc.reason
    assert exc.entry == "2-3:3-4"
    assert "'2-3:3-4'" in str(exc)


def test_process_rank_restart_is_an_error() -> None:
    exc = placement_error("0-1:0-1,2-3:0-1")
    assert "start at 0" in exc.reason
    assert exc.entry == "2-3:0-1"


def test_process_rank_duplicate_is_an_error() -> None:
    # Process 1 appears in both entries.
    exc = placement_error("0-1:0-1,2-3:1-2")
    assert exc.entry == "2-3:1-2"


def test_explicit_ranks_after_implicit_ones_must_continue() -> None:
    assert process_resources("0-1,2-3:2-3") == [[0], [1], [2], [3]]
    exc = placement_error("0-1,2-3:4-5")
    assert exc.entry == "2-3:4-5"


def test_counts_that_do_not_divide_are_an_error() -> None:
    exc = placement_error("0-2:0-1")
    assert "3 resources and 2 processes" in exc.reason
    assert "divide" in exc.reason
    assert exc.entry == "0-2:0-1"


def test_counts_that_do_not_divide_other_way_round() -> None:
    exc = placement_error("0-1:0-2,4-5")
    assert "2 resources and 3 processes" in exc.reason
    assert exc.entry == "0-1:0-2"


def test_too_many_processes_is_an_error() -> None:
    text = f"0:0-{MAX_PROCESSES}"
    exc = placement_error(text)
    assert exc.entry == text
    assert str(MAX_PROCESSES) in exc.reason


def test_too_many_processes_in_a_later_entry() -> None:
    text = f"0:0-{MAX_PROCESSES - 1},1"
    exc = placement_error(text)
    assert exc.entry == "1"


def test_exactly_max_processes_is_allowed() -> None:
    [entry] = resolve(f"0-1:0-{MAX_PROCESSES - 1}")
    assert entry.num_processes == MAX_PROCESSES


def test_the_first_offending_entry_is_reported() -> None:
    exc = placement_error("0-1,5-4,99")
    assert exc.entry == "5-4"


def test_error_message_quotes_the_whole_string_too() -> None:
    exc = placement_error("0-3,3-5")
    assert exc.text == "0-3,3-5"
    assert "'0-3,3-5'" in str(exc)


@pytest.mark.parametrize("resources", range(1, 13))
@pytest.mark.parametrize("processes", range(1, 13))
def test_resource_ids_are_the_resource_lists_as_tuples(resources: int, processes: int) -> None:
    if resources % processes and processes % resources:
        return
    for first in (0, 5):
        entry = ResolvedEntry(Entry(None, None, (0, 0)), first, first + resources - 1, 0, processes - 1)
        assert entry.resource_ids() == [tuple(ids) for ids in entry.resource_lists()]
