"""Stable node ranks (SPEC section 6): label, then environment, then head-first address order; no Ray needed."""

from __future__ import annotations

from typing import Any

import pytest

from hwplace import ConfigError
from hwplace_plugins.ray.ranks import FoundNode, assign_ranks, nodes_table


def node(node_id: str, address: str = "10.0.0.1", *, head: bool = False, **kwargs: Any) -> FoundNode:
    return FoundNode(node_id, address, head, **kwargs)


def ranked(nodes: list[FoundNode]) -> list[tuple[int | None, str, str]]:
    """(rank, node id, source) of each node, in the order assign_ranks returns them."""
    return [(n.rank, n.node_id, n.source) for n in assign_ranks(nodes)]


# -- explicit ranks ----------------------------------------------------------------------------------


def test_label_wins_over_the_order() -> None:
    nodes = [node("a", head=True), node("b", "10.0.0.2", label_rank="0")]
    assert ranked(nodes) == [(0, "b", "label"), (1, "a", "order")]


def test_env_is_used_when_there_is_no_label() -> None:
    nodes = [node("a", head=True), node("b", "10.0.0.2", env_rank="0")]
    assert ranked(nodes) == [(0, "b", "env"), (1, "a", "order")]


def test_label_and_env_that_agree_count_as_label() -> None:
    nodes = [node("a", label_rank="1", env_rank="1"), node("b", "10.0.0.2")]
    assert ranked(nodes) == [(0, "b", "order"), (1, "a", "label")]


def test_label_and_env_that_disagree_are_a_config_error() -> None:
    nodes = [node("node-disagrees", "10.0.0.7", label_rank="1", env_rank="0"), node("b")]
    with pytest.raises(ConfigError, match=r"node node-disagre \(10\.0\.0\.7\) has node label 1 but environment 0"):
        assign_ranks(nodes)


def test_whitespace_around_a_rank_is_ignored() -> None:
    assert ranked([node("a", env_rank=" 1\n"), node("b", "10.0.0.2")]) == [(0, "b", "order"), (1, "a", "env")]


@pytest.mark.parametrize("raw", ["x", "-1", "+1", "1.0", "1 2", "\u0661", "1" * 19])
def test_bad_rank_values_name_the_node(raw: str) -> None:
    bad = node("0123456789abcdef", "10.0.0.5", env_rank=raw)
    with pytest.raises(ConfigError, match=r"node 0123456789ab \(10\.0\.0\.5\) has .*non-negative integer") as exc:
        assign_ranks([bad, node("b")])
    assert exc.value.path == "HWPLACE_NODE_RANK"
    assert "0123456789abc" not in str(exc.value)  # the id is shortened to 12 characters


def test_label_and_env_errors_say_which_source() -> None:
    with pytest.raises(ConfigError, match="has node label HWPLACE_NODE_RANK 'x'"):
        assign_ranks([node("a", label_rank="x")])
    with pytest.raises(ConfigError, match="has environment variable HWPLACE_NODE_RANK 'y'"):
        assign_ranks([node("a", env_rank="y")])


def test_eighteen_digits_parse_and_are_then_out_of_range() -> None:
    with pytest.raises(ConfigError, match=f"claims rank {'9' * 18}, but 1 node is alive"):
        assign_ranks([node("a", env_rank="9" * 18)])


def test_rank_equal_to_the_number_of_nodes_is_out_of_range() -> None:
    nodes = [node("a", head=True), node("b", "10.0.0.2", label_rank="2")]
    with pytest.raises(ConfigError, match=r"claims rank 2, but 2 nodes are alive; ranks are 0-1\nnodes found:") as exc:
        assign_ranks(nodes)
    assert "10.0.0.2" in str(exc.value)


def test_highest_rank_is_in_range() -> None:
    assert ranked([node("a", env_rank="1"), node("b", "10.0.0.2", env_rank="0")]) == [(0, "b", "env"), (1, "a", "env")]


def test_duplicate_ranks_name_both_nodes_and_show_the_table() -> None:
    nodes = [node("first-node", "10.0.0.1", env_rank="0"), node("second-node", "10.0.0.2", label_rank="0"),
             node("third", "10.0.0.3")]
    with pytest.raises(ConfigError, match=r"nodes first-node \(10\.0\.0\.1\) and second-node \(10\.0\.0\.2\) both "
                                          r"claim rank 0") as exc:
        assign_ranks(nodes)
    message = str(exc.value)
    assert "each node rank belongs to one node" in message
    assert message.endswith(nodes_table(nodes))
    assert "third" in message  # the table lists every node, not only the two in conflict


# -- the order of the others -------------------------------------------------------------------------


def test_head_first_then_addresses_numerically() -> None:
    nodes = [node("n10", "10.0.0.10"), node("n9", "10.0.0.9"), node("head", "10.0.0.200", head=True),
             node("n2", "9.255.255.255")]
    assert [n.node_id for n in assign_ranks(nodes)] == ["head", "n2", "n9", "n10"]


def test_same_address_is_ordered_by_node_id() -> None:
    nodes = [node("bbb", "10.0.0.1"), node("aaa", "10.0.0.1"), node("ccc", "10.0.0.1")]
    assert [n.node_id for n in assign_ranks(nodes)] == ["aaa", "bbb", "ccc"]


def test_addresses_that_are_not_ips_come_after_ips() -> None:
    nodes = [node("h2", "host-b"), node("ip", "192.168.1.1"), node("h1", "host-a"), node("v6", "::1")]
    assert [n.node_id for n in assign_ranks(nodes)] == ["ip", "v6", "h1", "h2"]


def test_a_non_ip_head_still_comes_first() -> None:
    nodes = [node("ip", "10.0.0.1"), node("head", "localhost", head=True)]
    assert [n.node_id for n in assign_ranks(nodes)] == ["head", "ip"]


def test_unranked_nodes_fill_the_free_ranks_in_order() -> None:
    nodes = [node("head", "10.0.0.1", head=True), node("x3", "10.0.0.50", label_rank="3"),
             node("late", "10.0.0.9"), node("x0", "10.0.0.60", env_rank="0"), node("early", "10.0.0.2")]
    assert ranked(nodes) == [(0, "x0", "env"), (1, "head", "order"), (2, "early", "order"), (3, "x3", "label"),
                             (4, "late", "order")]


def test_ranks_are_stable_under_input_order() -> None:
    nodes = [node("a", "10.0.0.3", head=True), node("b", "10.0.0.1", env_rank="2"), node("c", "10.0.0.2"),
             node("d", "host")]
    assert ranked(nodes) == ranked(list(reversed(nodes))) == [(0, "a", "order"), (1, "c", "order"),
                                                               (2, "b", "env"), (3, "d", "order")]


def test_input_nodes_are_not_changed() -> None:
    nodes = [node("a", env_rank="0")]
    assign_ranks(nodes)
    assert nodes[0].rank is None
    assert nodes[0].source == "order"


def test_no_nodes() -> None:
    assert assign_ranks([]) == []


# -- the table ---------------------------------------------------------------------------------------


def test_table_of_ranked_nodes() -> None:
    nodes = assign_ranks([
        node("0123456789abcdef", "10.0.0.1", head=True, hostname="gpu-a", hardware_summary="8 fake-accelerator"),
        node("fedcba9876543210", "10.0.0.22", label_rank="0"),
    ])
    lines = nodes_table(nodes).splitlines()
    assert lines[0] == "nodes found:"
    assert lines[1].split() == ["rank", "node", "id", "address", "host", "head", "hardware"]
    assert lines[2].split() == ["0", "(label)", "fedcba987654", "10.0.0.22", "-", "-"]
    assert lines[3].split() == ["1", "(order)", "0123456789ab", "10.0.0.1", "gpu-a", "yes", "8", "fake-accelerator"]
    assert all(line.startswith("  ") and line == line.rstrip() for line in lines[1:])
    columns = [line.index("10.0.0") for line in lines[2:]]
    assert columns[0] == columns[1] == lines[1].index("address")  # the columns line up


def test_table_of_unranked_nodes_shows_dashes() -> None:
    lines = nodes_table([node("abc", "host-x")]).splitlines()
    assert lines[2].split() == ["-", "abc", "host-x", "-", "-"]


def test_an_empty_environment_value_counts_as_unset() -> None:
    ranked = assign_ranks([node("b", "10.0.0.2", env_rank=" "), node("a", "10.0.0.1", head=True, env_rank="1")])
    assert [(n.node_id, n.rank, n.source) for n in ranked] == [("b", 0, "order"), ("a", 1, "env")]
