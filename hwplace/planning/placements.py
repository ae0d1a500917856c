"""The :class:`Placement` record and the one routine that turns resource lists into placements."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

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
    cluster: Cluster, space: ResourceSpace, id_lists: Sequence[Sequence[int]], isolate_accelerator: bool,
    views: dict[tuple[int, str, tuple[int, ...]], View] | None = None,
) -> list[Placement]:
    """One placement per list of resource ranks, in rank order; every rule on a process is checked here.

    ``views`` keeps what a process on a node, of a type, with its own devices sees (made once for each); pass
    the same dict to place several components on one cluster with the same ``isolate_accelerator``."""
    resources = space.resources
    count = len(resources)
    # What a process sees depends only on its own resources: a process of one resource is keyed by its rank
    # in the space, one of several by its node, type and devices. Each key is checked once, its view made once.
    owned: dict[Any, tuple[Resource, tuple[Device, ...]]] = {}
    keys: list[Any] = []
    per_node = [0] * cluster.num_nodes
    for rank, ids in enumerate(id_lists):
        if len(ids) == 1:  # the common case, kept fast
            key: Any = ids[0]
            found = owned.get(key)
            if found is None:
                if key >= count:
                    raise _beyond(rank, key, space)
                first = resources[key]
                if not first.device.healthy:
                    raise _unhealthy(rank, first)
                found = owned[key] = (first, (first.device,))
        else:
            first, own = _own_resources(rank, ids, space)
            key = (first.node_rank, first.hardware_type, first.group, tuple(d.index for d in own))
            found = owned.setdefault(key, (first, own))
        keys.append(key)
        per_node[found[0].node_rank] += 1
    return _realise(cluster, keys, owned, per_node, isolate_accelerator, {} if views is None else views)


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
    cluster: Cluster, keys: list[Any], owned: dict[Any, tuple[Resource, tuple[Device, ...]]], per_node: list[int],
    isolate: bool, views: dict[tuple[int, str, tuple[int, ...]], View],
) -> list[Placement]:
    kinds = {t: cluster.kind(t) for t in {res.hardware_type for res, _ in owned.values()}}
    backends = _Backends(cluster)
    node_ids = [node.node_id for node in cluster.nodes]
    made: dict[Any, tuple[Any, ...]] = {}  # key: the fields of a placement that its rank does not change
    for key in dict.fromkeys(keys):  # in rank order of first use, so a failing backend fails at the same process
        res, own = owned[key]
        node_rank, hardware_type = res.node_rank, res.hardware_type
        local = (own[0].index,) if len(own) == 1 else tuple(d.index for d in own)
        view = views.get((node_rank, hardware_type, local))
        if view is None:
            view = views[(node_rank, hardware_type, local)] = _view(
                cluster, backends, node_rank, hardware_type, kinds[hardware_type], own, local, isolate)
        made[key] = (node_ids[node_rank], node_rank, view[0], per_node[node_rank], view[1], local, hardware_type,
                     res.group, view[2])
    next_local = [0] * len(per_node)
    placements: list[Placement] = []
    append = placements.append
    new = object.__new__
    placement: Any  # an _Unfrozen until its class becomes Placement
    for rank, (node_id, node_rank, accelerator, local_world_size, visible, local, hardware_type, group, env) in \
            enumerate(map(made.__getitem__, keys)):
        local_rank = next_local[node_rank]
        next_local[node_rank] = local_rank + 1
        placement = new(_Unfrozen)  # written here, not by a call per process: that would cost a tenth of the planning
        placement.rank = rank
        placement.node_id = node_id
        placement.node_rank = node_rank
        placement.local_accelerator_id = accelerator
        placement.local_rank = local_rank
        placement.local_world_size = local_world_size
        placement.visible_accelerators = visible
        placement.isolate_accelerator = isolate
        placement.local_hardware_ranks = local
        placement.hardware_type = hardware_type
        placement.node_group = group
        placement.env = env
        placement.__class__ = Placement
        append(placement)
    return placements


class _Unfrozen:
    """:class:`Placement`'s slots, unfrozen: a record is written here by plain attribute stores (a third of the
    cost of the frozen dataclass's ``__init__``, which sets each field through ``object.__setattr__``) and then
    becomes a ``Placement``, whose layout is the same. ``Placement`` has no ``__post_init__`` to skip."""

    __slots__ = tuple(f.name for f in dataclasses.fields(Placement))


def _new_placement(*fields: Any) -> Placement:
    """A :class:`Placement` of ``fields`` in order, as ``Placement(*fields)`` makes it, made as ``_realise``
    makes each (inlined there)."""
    placement: Any = object.__new__(_Unfrozen)
    for name, value in zip(_Unfrozen.__slots__, fields, strict=True):
        setattr(placement, name, value)
    placement.__class__ = Placement
    made: Placement = placement
    return made


if Placement.__slots__ != _Unfrozen.__slots__ or hasattr(Placement, "__post_init__") \
        or _new_placement(*range(12)) != Placement(*range(12)):  # pragma: no cover (a guard on the record's shape)
    raise ImportError("hwplace.planning.placements writes Placement's fields through an unfrozen twin of the "
                      "record: update it with the record")


class _Backends(dict[str, Any]):
    """``cluster.backend(name)`` by name, each looked up once (a view is made for each device)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.cluster = cluster

    def __missing__(self, hardware_type: str) -> Any:
        found = self[hardware_type] = self.cluster.backend(hardware_type)
        return found


View = tuple[int, tuple[int, ...], FrozenDict[str, str]]
"""A process's first own accelerator (-1 for none), the accelerators it sees and its isolation env."""


def _view(
    cluster: Cluster, backends: _Backends, node_rank: int, hardware_type: str, kind: str | None,
    own: tuple[Device, ...], local: tuple[int, ...], isolate: bool,
) -> View:
    """A process's first own accelerator, the accelerators it sees and its isolation env."""
    node = cluster.nodes[node_rank]
    if kind == "accelerator":
        shown = own if isolate else node.devices(hardware_type)
        visible = local if isolate else tuple(d.index for d in shown)
        return local[0], visible, _isolation_env(backends, hardware_type, shown)
    types = cluster.accelerator_types([node_rank])
    hidden = isolate and kind == "device"  # a device process owns no accelerator
    visible = () if hidden or not types else tuple(d.index for d in node.devices(types[0]))
    env = _isolation_env(backends, hardware_type, own)
    for other in types if hidden else ():
        env = FrozenDict({**env, **_isolation_env(backends, other, ())})
    return -1, visible, env


def _isolation_env(backends: _Backends, hardware_type: str, devices: Sequence[Device]) -> FrozenDict[str, str]:
    backend = backends[hardware_type]
    if backend is None:
        raise PlacementError(f"no hardware backend {hardware_type!r} is registered on this machine")
    try:
        env = backend.isolation_env(tuple(devices))
    except (Exception, SystemExit) as exc:  # a broken backend is reported, however it breaks
        raise PluginError(f"backend {hardware_type!r}: isolation_env(devices {[d.index for d in devices]}) raised "
                          f"{safe_repr(exc)}") from exc
    if not isinstance(env, dict) and not isinstance(env, Mapping):  # a dict, the common case, without the ABC
        raise _bad_env(hardware_type, devices, f"returned {safe_repr(env)}, not a dict of strings")
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise _bad_env(hardware_type, devices, f"returned {safe_repr(env)}, not a dict of strings")
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise _bad_env(hardware_type, devices, f"returned variable {name!r}={value!r}, which no environment "
                           "can hold")
    return FrozenDict(env)


def _bad_env(hardware_type: str, devices: Sequence[Device], problem: str) -> PluginError:
    return PluginError(f"backend {hardware_type!r}: isolation_env(devices {[d.index for d in devices]}) {problem}")
