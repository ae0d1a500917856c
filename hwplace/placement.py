"""The :class:`Placement` record and the one routine that turns resource lists into placements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hwplace.cluster import Cluster
from hwplace.errors import PlacementError, PluginError
from hwplace.resources import NODE, Resource, ResourceSpace


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
    resources = space.resources
    chosen: list[tuple[Resource, list[int]]] = []
    per_node = [0] * cluster.num_nodes
    for rank, ids in enumerate(id_lists):
        if len(ids) == 1:  # the common case, kept fast
            if ids[0] >= len(resources):
                raise _beyond(rank, ids[0], space)
            first = resources[ids[0]]
            if not first.device.healthy:
                raise _unhealthy(rank, first)
            local = [first.local_index]
        else:
            first, local = _own_resources(rank, ids, space)
        chosen.append((first, local))
        per_node[first.node_rank] += 1
    return _realise(cluster, chosen, per_node, isolate_accelerator)


def _own_resources(rank: int, ids: Sequence[int], space: ResourceSpace) -> tuple[Resource, list[int]]:
    bad = [i for i in ids if i >= len(space.resources)]
    if bad:
        raise _beyond(rank, bad[0], space)
    own = [space.resources[i] for i in ids]
    first = own[0]
    for res in own:
        if res.node_rank != first.node_rank:
            raise PlacementError(f"process {rank} would span nodes {first.node_rank} and {res.node_rank} "
                                 f"(resources {list(ids)}); a process's resources must lie on one node", rank=rank)
        if res.hardware_type != first.hardware_type:
            raise PlacementError(f"process {rank} would mix hardware types {first.hardware_type} and "
                                 f"{res.hardware_type}; a process's resources are of one type", rank=rank)
        if not res.device.healthy:
            raise _unhealthy(rank, res)
    if first.hardware_type == NODE:
        raise PlacementError(f"process {rank} would hold {len(own)} nodes; a process holds exactly one node",
                             rank=rank)
    return first, sorted(r.local_index for r in own)


def _beyond(rank: int, index: int, space: ResourceSpace) -> PlacementError:
    ranks = f" (ranks 0-{len(space) - 1})" if len(space) else ""
    return PlacementError(f"process {rank} asks for resource {index}, but there are {space.description}{ranks}",
                          rank=rank)


def _unhealthy(rank: int, res: Resource) -> PlacementError:
    return PlacementError(f"process {rank} would use {res.hardware_type} {res.local_index} on node {res.node_rank}, "
                          f"which is unhealthy: {res.device.reason or 'no reason given'}", rank=rank)


def _realise(
    cluster: Cluster, chosen: list[tuple[Resource, list[int]]], per_node: list[int], isolate: bool
) -> list[Placement]:
    env_cache: dict[tuple[str, tuple[int, ...], tuple[str, ...]], dict[str, str]] = {}
    node_types: dict[int, tuple[str, ...]] = {}  # a node's accelerator types, by name
    kinds = {t: cluster.kind(t) or NODE for t in {res.hardware_type for res, _ in chosen}}
    next_local = [0] * len(per_node)
    placements = []
    for rank, (res, local) in enumerate(chosen):
        node_rank, hardware_type = res.node_rank, res.hardware_type
        node = cluster.nodes[node_rank]
        kind, first = kinds[hardware_type], -1
        hidden: tuple[str, ...] = ()
        if kind == "accelerator":
            visible = local if isolate else [d.index for d in node.devices(hardware_type)]
            env_ids, first = visible, local[0]
        else:
            if node_rank not in node_types:
                node_types[node_rank] = tuple(cluster.accelerator_types([node_rank]))
            env_ids = local
            if kind == "device" and isolate:  # a device process owns no accelerator: hide them all
                visible, hidden = [], node_types[node_rank]
            else:  # a node process owns its node, accelerators included
                types = node_types[node_rank]
                visible = [d.index for d in node.devices(types[0])] if types else []
        key = (hardware_type, tuple(env_ids), hidden)
        env = env_cache.get(key)
        if env is None:
            env = env_cache[key] = _isolation_env(cluster, hardware_type, env_ids)
            for other in hidden:
                env.update(_isolation_env(cluster, other, []))
        local_rank = next_local[node_rank]
        next_local[node_rank] = local_rank + 1
        placements.append(Placement(rank, node.node_id, node_rank, first, local_rank, per_node[node_rank],
                                    list(visible), isolate, local, hardware_type, res.group, dict(env)))
    return placements


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
