"""Stable node ranks for the nodes Ray reports, and the table shown when the cluster is not what was asked.

Pure functions over plain records: no Ray here, so the rules are tested without a cluster.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from hwplace import ConfigError
from hwplace.names import NODE_RANK

RANK_VARIABLE = NODE_RANK  # a node's environment variable, or its Ray node label of the same name
MAX_RANK_DIGITS = 18


@dataclass(frozen=True)
class FoundNode:
    """A live Ray node as discovery saw it, before and after it gets its rank."""

    node_id: str
    address: str
    is_head: bool
    label_rank: str | None = None  # the raw values, checked by assign_ranks
    env_rank: str | None = None
    hostname: str = ""
    hardware_summary: str = ""  # "8 fake-accelerator", for the table
    rank: int | None = None
    source: str = field(default="order", compare=False)  # where its rank came from: "label", "env" or "order"


def _parse_rank(raw: str, node: FoundNode, where: str) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= MAX_RANK_DIGITS):
        raise ConfigError(RANK_VARIABLE, f"node {node.node_id[:12]} ({node.address}) has {where} {raw!r}",
                          allowed="a node rank is a non-negative integer")
    return int(text)


def _address_key(address: str) -> tuple[int, int, str]:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return (1, 0, address)
    return (0, int(ip) + (ip.version - 4) * 2**32, address)


def assign_ranks(nodes: Sequence[FoundNode]) -> list[FoundNode]:
    """Give every node its rank, 0..N-1, and return them in rank order.

    A node's ``HWPLACE_NODE_RANK`` (Ray node label, or the environment of its raylet) wins; two sources on
    one node must agree. The other nodes take the free ranks in order: the head node first, then by
    address and node id. Duplicate or out-of-range ranks are a ``ConfigError`` with the table of nodes.
    """
    explicit: dict[int, FoundNode] = {}
    rest: list[FoundNode] = []
    for node in nodes:
        label = _parse_rank(node.label_rank, node, "node label HWPLACE_NODE_RANK") \
            if node.label_rank is not None else None
        env = _parse_rank(node.env_rank, node, "environment variable HWPLACE_NODE_RANK") \
            if node.env_rank is not None and node.env_rank.strip() else None  # set but empty counts as unset
        if label is not None and env is not None and label != env:
            raise ConfigError(RANK_VARIABLE, f"node {node.node_id[:12]} ({node.address}) has node label "
                              f"{label} but environment {env}", allowed="set one, or make them agree")
        rank = label if label is not None else env
        if rank is None:
            rest.append(node)
            continue
        source = "label" if label is not None else "env"
        if rank >= len(nodes):
            raise ConfigError(RANK_VARIABLE, f"node {node.node_id[:12]} ({node.address}) claims rank {rank}, "
                              f"but {len(nodes)} {'node is' if len(nodes) == 1 else 'nodes are'} alive",
                              allowed=f"ranks are 0-{len(nodes) - 1}\n{nodes_table(nodes)}")
        if rank in explicit:
            other = explicit[rank]
            raise ConfigError(RANK_VARIABLE, f"nodes {other.node_id[:12]} ({other.address}) and "
                              f"{node.node_id[:12]} ({node.address}) both claim rank {rank}",
                              allowed=f"each node rank belongs to one node\n{nodes_table(nodes)}")
        explicit[rank] = replace(node, rank=rank, source=source)
    rest.sort(key=lambda n: (not n.is_head, _address_key(n.address), n.node_id))
    free = (r for r in range(len(nodes)) if r not in explicit)
    ranked = list(explicit.values()) + [replace(node, rank=next(free), source="order") for node in rest]
    return sorted(ranked, key=lambda n: n.rank if n.rank is not None else -1)


def nodes_table(nodes: Sequence[FoundNode]) -> str:
    """The nodes found, one line each: rank (and where it came from), id, address, head, hardware."""
    rows = [("rank", "node id", "address", "host", "head", "hardware")]
    for node in nodes:
        rank = "-" if node.rank is None else f"{node.rank} ({node.source})"
        rows.append((rank, node.node_id[:12], node.address, node.hostname or "-", "yes" if node.is_head else "",
                     node.hardware_summary or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "nodes found:\n  " + "\n  ".join(lines)
