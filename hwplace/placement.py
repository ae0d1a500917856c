"""The :class:`Placement` record and the one routine that turns resource lists into placements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hwplace.cluster import Cluster, Node
from hwplace.errors import PlacementError, PluginError
from hwplace.resources import NODE, ResourceSpace


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one process runs and what it sees."""

    rank: int
    node_id: str
    node_rank: int
    local_accelerator_id: int
    local_rank: int
    local_world_size: int
    visible_accelerators: list[int]
    isolate_accelerator: bool
    local_hardware_ranks: list[int]
    hardware_type: str
    node_group: str
    env: dict[str, str]


def build_placements(
    cluster: Cluster, space: ResourceSpace, id_lists: Sequence[Sequence[int]], isolate_accelerator: bool
) -> list[Placement]:
    """One placement per list of resource ranks, in rank order; every rule on a process is checked here."""
    resources, count = space.resources, len(space.resources)
    chosen = []
    per_node: dict[int, int] = {}
    for rank, ids in enumerate(id_lists):
        bad = [i for i in ids if i >= count]
        if bad:
            ranks = f" (ranks 0-{count - 1})" if count else ""
            raise PlacementError(f"process {rank} asks for resource {bad[0]}, but there are "
                                 f"{space.description}{ranks}", rank=rank)
        own = [resources[i] for i in ids]
        first = own[0]
        for res in own:
            if res.node_rank != first.node_rank:
                raise PlacementError(f"process {rank} would span nodes {first.node_rank} and {res.node_rank} "
                                     f"(resources {list(ids)}); a process's resources must lie on one node",
                                     rank=rank)
            if res.hardware_type != first.hardware_type:
                raise PlacementError(f"process {rank} would mix hardware types {first.hardware_type} and "
                                     f"{res.hardware_type}; a process's resources are of one type", rank=rank)
            if not res.device.healthy:
                raise PlacementError(f"process {rank} would use {res.hardware_type} {res.local_index} on node "
                                     f"{res.node_rank}, which is unhealthy: {res.device.reason or 'no reason given'}",
                                     rank=rank)
        if first.hardware_type == NODE and len(own) > 1:
            raise PlacementError(f"process {rank} would hold {len(own)} nodes; a process holds exactly one node",
                                 rank=rank)
        chosen.append((first.node_rank, first.hardware_type, first.group, sorted(r.local_index for r in own)))
        per_node[first.node_rank] = per_node.get(first.node_rank, 0) + 1
    return _realise(cluster, chosen, per_node, isolate_accelerator)


def _realise(
    cluster: Cluster, chosen: list[tuple[int, str, str, list[int]]], per_node: dict[int, int], isolate: bool
) -> list[Placement]:
    env_cache: dict[tuple[str, tuple[int, ...]], dict[str, str]] = {}
    node_accelerators: dict[int, list[int]] = {}
    kinds: dict[str, str | None] = {}
    next_local: dict[int, int] = {}
    placements = []
    for rank, (node_rank, hardware_type, group, local) in enumerate(chosen):
        node = cluster.nodes[node_rank]
        kind = kinds.get(hardware_type) or kinds.setdefault(hardware_type, cluster.kind(hardware_type))
        if kind == "accelerator":
            visible = local if isolate else [d.index for d in node.devices(hardware_type)]
            env_ids = visible
            first = local[0]
        else:
            if node_rank not in node_accelerators:
                node_accelerators[node_rank] = _all_accelerators(cluster, node)
            visible = node_accelerators[node_rank]
            env_ids = local
            first = -1
        key = (hardware_type, tuple(env_ids))
        if key not in env_cache:
            env_cache[key] = _isolation_env(cluster, hardware_type, env_ids)
        local_rank = next_local.get(node_rank, 0)
        next_local[node_rank] = local_rank + 1
        placements.append(Placement(
            rank=rank, node_id=node.node_id, node_rank=node_rank, local_accelerator_id=first,
            local_rank=local_rank, local_world_size=per_node[node_rank], visible_accelerators=list(visible),
            isolate_accelerator=isolate, local_hardware_ranks=list(local), hardware_type=hardware_type,
            node_group=group, env=dict(env_cache[key]),
        ))
    return placements


def _all_accelerators(cluster: Cluster, node: Node) -> list[int]:
    """A node's accelerator ids, of its first accelerator type by name where it has several."""
    types = cluster.accelerator_types([node.rank])
    return [d.index for d in node.devices(types[0])] if types else []


def _isolation_env(cluster: Cluster, hardware_type: str, ids: list[int]) -> dict[str, str]:
    backend = cluster.backend(hardware_type)
    if backend is None:
        if hardware_type == NODE:
            return {}
        raise PlacementError(f"no hardware backend {hardware_type!r} is registered on this machine")
    try:
        env = backend.isolation_env(ids)
    except Exception as exc:
        raise PluginError(f"backend {hardware_type!r}: isolation_env({ids}) raised {exc!r}") from exc
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise PluginError(f"backend {hardware_type!r}: isolation_env({ids}) returned {env!r}, "
                          "not a dict of strings")
    return env
