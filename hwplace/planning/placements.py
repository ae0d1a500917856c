"""The :class:`Placement` record and the one routine that turns resource lists into placements."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping, Sequence

from hwplace.contracts.hardware import Device
from hwplace.contracts.records import Placement
from hwplace.foundation.errors import PlacementError, PluginError
from hwplace.foundation.frozen import FrozenDict
from hwplace.foundation.wording import safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.planning.resources import Resource, ResourceSpace


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the garbage collector: tens of thousands of small records would make planning superlinear."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def build_placements(
    cluster: Cluster, space: ResourceSpace, id_lists: Sequence[Sequence[int]], isolate_accelerator: bool
) -> list[Placement]:
    """One placement per list of resource ranks, in rank order; every rule on a process is checked here."""
    resources = space.resources
    chosen: list[tuple[Resource, tuple[Device, ...]]] = []
    per_node: dict[int, int] = {}
    for rank, ids in enumerate(id_lists):
        if len(ids) == 1:  # the common case, kept fast
            if ids[0] >= len(resources):
                raise _beyond(rank, ids[0], space)
            first = resources[ids[0]]
            if not first.device.healthy:
                raise _unhealthy(rank, first)
            own: tuple[Device, ...] = (first.device,)
        else:
            first, own = _own_resources(rank, ids, space)
        chosen.append((first, own))
        per_node[first.node_rank] = per_node.get(first.node_rank, 0) + 1
    return _realise(cluster, chosen, per_node, isolate_accelerator)


def _own_resources(rank: int, ids: Sequence[int], space: ResourceSpace) -> tuple[Resource, tuple[Device, ...]]:
    bad = [i for i in ids if i >= len(space.resources)]
    if bad:
        raise _beyond(rank, bad[0], space)
    if space.is_node_kind:
        raise PlacementError(f"process {rank} would hold {len(ids)} nodes; a process holds exactly one node",
                             rank=rank)
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
    return first, tuple(sorted((r.device for r in own), key=lambda d: d.index))


def _beyond(rank: int, index: int, space: ResourceSpace) -> PlacementError:
    ranks = f" (ranks 0-{len(space) - 1})" if len(space) else ""
    return PlacementError(f"process {rank} asks for resource {index}, but {space.description}{ranks}",
                          rank=rank)


def _unhealthy(rank: int, res: Resource) -> PlacementError:
    return PlacementError(f"process {rank} would use {res.hardware_type} {res.local_index} on node {res.node_rank}, "
                          f"which is unhealthy: {res.device.reason or 'no reason given'}", rank=rank)


def _realise(
    cluster: Cluster, chosen: list[tuple[Resource, tuple[Device, ...]]], per_node: dict[int, int], isolate: bool
) -> list[Placement]:
    # What a process sees depends only on its node, hardware type and own devices: work it out once for each.
    seen: dict[tuple[int, str, tuple[int, ...]], tuple[int, tuple[int, ...], FrozenDict[str, str]]] = {}
    kinds = {t: cluster.kind(t) for t in {res.hardware_type for res, _ in chosen}}
    node_ids = [node.node_id for node in cluster.nodes]
    next_local: dict[int, int] = {}
    placements: list[Placement] = []
    append = placements.append
    for rank, (res, own) in enumerate(chosen):
        node_rank, hardware_type = res.node_rank, res.hardware_type
        local = (own[0].index,) if len(own) == 1 else tuple(d.index for d in own)
        key = (node_rank, hardware_type, local)
        view = seen.get(key)
        if view is None:
            view = seen[key] = _view(cluster, node_rank, hardware_type, kinds[hardware_type], own, local, isolate)
        local_rank = next_local.get(node_rank, 0)
        next_local[node_rank] = local_rank + 1
        append(Placement(rank, node_ids[node_rank], node_rank, view[0], local_rank, per_node[node_rank], view[1],
                         isolate, local, hardware_type, res.group, view[2]))
    return placements


def _view(
    cluster: Cluster, node_rank: int, hardware_type: str, kind: str | None, own: tuple[Device, ...],
    local: tuple[int, ...], isolate: bool,
) -> tuple[int, tuple[int, ...], FrozenDict[str, str]]:
    """A process's first own accelerator, the accelerators it sees and its isolation env."""
    node = cluster.nodes[node_rank]
    if kind == "accelerator":
        shown = own if isolate else node.devices(hardware_type)
        visible = local if isolate else tuple(d.index for d in shown)
        return local[0], visible, FrozenDict(_isolation_env(cluster, hardware_type, shown))
    types = cluster.accelerator_types([node_rank])
    hidden = isolate and kind == "device"  # a device process owns no accelerator
    visible = () if hidden or not types else tuple(d.index for d in node.devices(types[0]))
    env = _isolation_env(cluster, hardware_type, own)
    for other in types if hidden else ():
        env.update(_isolation_env(cluster, other, ()))
    return -1, visible, FrozenDict(env)


def _isolation_env(cluster: Cluster, hardware_type: str, devices: Sequence[Device]) -> dict[str, str]:
    backend = cluster.backend(hardware_type)
    if backend is None:
        raise PlacementError(f"no hardware backend {hardware_type!r} is registered on this machine")
    try:
        env = backend.isolation_env(tuple(devices))
    except (Exception, SystemExit) as exc:  # a broken backend is reported, however it breaks
        raise PluginError(f"backend {hardware_type!r}: isolation_env(devices {[d.index for d in devices]}) raised "
                          f"{safe_repr(exc)}") from exc
    if not isinstance(env, Mapping):
        raise _bad_env(hardware_type, devices, f"returned {safe_repr(env)}, not a dict of strings")
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise _bad_env(hardware_type, devices, f"returned {safe_repr(env)}, not a dict of strings")
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise _bad_env(hardware_type, devices, f"returned variable {name!r}={value!r}, which no environment "
                           "can hold")
    return dict(env)


def _bad_env(hardware_type: str, devices: Sequence[Device], problem: str) -> PluginError:
    return PluginError(f"backend {hardware_type!r}: isolation_env(devices {[d.index for d in devices]}) {problem}")
