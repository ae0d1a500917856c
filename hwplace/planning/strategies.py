"""Placement strategies: Packed, Flexible and Node. Each yields one :class:`Placement` per process.

A strategy that ``ComponentPlacement`` planned is a value: :meth:`PlacementStrategy.planned_on` makes a copy
that holds the placements made as a frozen :class:`Plan` and refuses every later change, so a stored plan
cannot be altered by a caller. Imports the layers below and the other modules of :mod:`hwplace.planning`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import FrozenInstanceError, dataclass
from typing import Any, TypeVar

from hwplace.config.records import NodeGroup
from hwplace.contracts.records import Placement
from hwplace.foundation.errors import PlacementError
from hwplace.foundation.wording import plural, ranks_text, safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.planning.placements import build_placements, gc_paused
from hwplace.planning.resources import ResourceSpace, resource_space

GroupSelection = str | NodeGroup | Sequence[str | NodeGroup] | None
S = TypeVar("S", bound="PlacementStrategy")


def _count(value: Any, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlacementError(f"{name} must be an integer, got {safe_repr(value)}")
    if value < minimum:
        raise PlacementError(f"{name} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True, eq=False)
class Plan:
    """The placements a strategy was planned to on one cluster (accelerators isolated), in rank order."""

    cluster: Cluster
    placements: tuple[Placement, ...]


class PlacementStrategy:
    """Base class: resolves the node group selection against a cluster and builds the placements.

    A planned strategy (:meth:`planned_on`, what ``ComponentPlacement.get_strategy`` returns) is immutable:
    setting or deleting any attribute raises ``dataclasses.FrozenInstanceError``.
    """

    default_group = "cluster"
    nodes_only = False
    _plan: Plan | None = None

    def __init__(self, node_group: GroupSelection = None) -> None:
        if node_group is None:
            node_group = self.default_group
        if isinstance(node_group, str):
            node_group = [label.strip() for label in node_group.split(",")]
        elif isinstance(node_group, NodeGroup):
            node_group = [node_group]
        elif not isinstance(node_group, Sequence):
            raise PlacementError(f"node_group must be a group label, 'a,b', a NodeGroup or a list of those, "
                                 f"got {safe_repr(node_group)}")
        for group in node_group:
            if not isinstance(group, str | NodeGroup):
                raise PlacementError(f"node_group holds {safe_repr(group)}; a group is a label (a string) or a "
                                     "NodeGroup")
        self.node_group: tuple[str | NodeGroup, ...] = tuple(node_group)
        if not self.node_group:
            raise PlacementError("node_group names no group")

    @property
    def planned(self) -> Plan | None:
        """The placements ``ComponentPlacement`` made with this strategy, and on which cluster; ``None`` for a
        strategy that was not planned."""
        return self._plan

    def planned_on(self: S, cluster: Cluster, placements: Iterable[Placement]) -> S:
        """A frozen copy of this strategy holding ``placements``: what it yields on ``cluster``, accelerators
        isolated, returned by :meth:`get_placement` there without building them again. This strategy is left
        as it is."""
        planned = copy.copy(self)
        object.__setattr__(planned, "_plan", Plan(cluster, tuple(placements)))
        return planned

    def __setattr__(self, name: str, value: Any) -> None:
        if self._plan is not None:
            raise FrozenInstanceError(f"cannot assign to {name!r}: {type(self).__name__} is planned, and a planned "
                                      "strategy is immutable (build a new strategy to place otherwise)")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if self._plan is not None:
            raise FrozenInstanceError(f"cannot delete {name!r}: {type(self).__name__} is planned, and a planned "
                                      "strategy is immutable")
        super().__delattr__(name)

    def groups(self, cluster: Cluster) -> list[NodeGroup]:
        """The node groups this strategy selects, resolved on ``cluster`` (labels looked up in its config).

        A ``NodeGroup`` object given directly is not checked against the cluster by the config: one naming
        node ranks the cluster lacks is a ``PlacementError`` naming the group and those ranks."""
        groups = [g if isinstance(g, NodeGroup) else cluster.config.group(g) for g in self.node_group]
        for group in groups:
            beyond = [rank for rank in group.node_ranks if rank >= cluster.num_nodes]
            if beyond:
                raise PlacementError(f"node group {group.label!r} names {ranks_text(beyond)}, but the cluster "
                                     f"has {plural(cluster.num_nodes, 'node')} (ranks 0-{cluster.num_nodes - 1})")
        return groups

    def resource_space(self, cluster: Cluster) -> ResourceSpace:
        """The resources this strategy's ids index on ``cluster``."""
        return resource_space(cluster, self.groups(cluster), nodes_only=self.nodes_only)

    def get_placement(self, cluster: Cluster, isolate_accelerator: bool = True) -> list[Placement]:
        """One :class:`Placement` per process, in rank order."""
        if not isinstance(isolate_accelerator, bool):
            raise PlacementError(f"isolate_accelerator must be True or False, got {safe_repr(isolate_accelerator)}")
        if isolate_accelerator and self._plan is not None and self._plan.cluster is cluster:
            return list(self._plan.placements)
        with gc_paused():
            space = self.resource_space(cluster)
            return build_placements(cluster, space, self.resource_lists(space), isolate_accelerator)

    def resource_lists(self, space: ResourceSpace) -> Sequence[Sequence[int]]:
        """The resource ranks of each process."""
        raise NotImplementedError

    @property
    def group_labels(self) -> list[str]:
        return [g.label if isinstance(g, NodeGroup) else g for g in self.node_group]


class PackedPlacementStrategy(PlacementStrategy):
    """Accelerators ``start..end`` in blocks of ``num_accelerators_per_process * stride`` ids.

    Inside a block, process k takes every ``stride``-th id from offset k: ``[0, 1, 2, 3]`` with stride 2
    gives ``[0, 2]`` and ``[1, 3]``.
    """

    def __init__(
        self,
        start_accelerator_id: int,
        end_accelerator_id: int,
        num_accelerators_per_process: int = 1,
        stride: int = 1,
        node_group: GroupSelection = None,
    ) -> None:
        super().__init__(node_group)
        self.start = _count(start_accelerator_id, "start_accelerator_id", minimum=0)
        self.end = _count(end_accelerator_id, "end_accelerator_id", minimum=0)
        self.num_per_process = _count(num_accelerators_per_process, "num_accelerators_per_process", minimum=1)
        self.stride = _count(stride, "stride", minimum=1)
        if self.end < self.start:
            raise PlacementError(f"end_accelerator_id {self.end} is below start_accelerator_id {self.start}")
        block = self.num_per_process * self.stride
        total = self.end - self.start + 1
        if total % block:
            raise PlacementError(
                f"{total} accelerators ({self.start}-{self.end}) do not split into blocks of "
                f"num_accelerators_per_process * stride = {self.num_per_process} * {self.stride} = {block}"
            )

    def resource_lists(self, space: ResourceSpace) -> list[list[int]]:
        resources = space.resources
        if self.end >= len(resources):  # checked before building anything: end may be absurdly large
            ranks = f", ranks 0-{len(resources) - 1}" if resources else ""
            raise PlacementError(f"end_accelerator_id {self.end} does not exist: {space.description}{ranks}")
        lists: list[list[int]] = []
        block = self.num_per_process * self.stride
        for block_start in range(self.start, self.end + 1, block):
            nodes = {res.node_rank for res in resources[block_start : block_start + block]}
            if len(nodes) > 1:
                raise PlacementError(
                    f"the block {block_start}-{block_start + block - 1} crosses a node boundary (nodes "
                    f"{sorted(nodes)}); choose start, end and sizes that keep each block on one node",
                    rank=len(lists))
            lists.extend(list(range(block_start + k, block_start + block, self.stride)) for k in range(self.stride))
        return lists

    def __repr__(self) -> str:
        return (f"PackedPlacementStrategy({self.start}, {self.end}, num_accelerators_per_process="
                f"{self.num_per_process}, stride={self.stride}, node_group={self.group_labels})")


class FlexiblePlacementStrategy(PlacementStrategy):
    """One list of accelerator ids per process; process i gets the i-th list (taken in ascending order)."""

    def __init__(self, accelerator_id_lists: Sequence[Sequence[int]], node_group: GroupSelection = None) -> None:
        super().__init__(node_group)
        if isinstance(accelerator_id_lists, str) or not isinstance(accelerator_id_lists, Sequence):
            raise PlacementError(f"accelerator_id_lists must be a list of lists of ids, got {accelerator_id_lists!r}")
        lists: list[tuple[int, ...]] = []
        for rank, ids in enumerate(accelerator_id_lists):
            if isinstance(ids, str) or not isinstance(ids, Sequence) or not ids:
                raise PlacementError(f"process {rank}: a non-empty list of accelerator ids is needed, got {ids!r}",
                                     rank=rank)
            for i in ids:
                if isinstance(i, bool) or not isinstance(i, int) or i < 0:
                    raise PlacementError(f"process {rank}: {i!r} is not an accelerator id (a non-negative "
                                         "integer)", rank=rank)
            unique = sorted(set(ids))
            if len(unique) != len(ids):
                raise PlacementError(f"process {rank}: accelerator ids {list(ids)} repeat an id", rank=rank)
            lists.append(tuple(unique))
        if not lists:
            raise PlacementError("accelerator_id_lists is empty: give one list per process")
        self.accelerator_id_lists: tuple[tuple[int, ...], ...] = tuple(lists)

    @classmethod
    def of_checked(cls, lists: tuple[tuple[int, ...], ...], node_group: GroupSelection) -> FlexiblePlacementStrategy:
        """The strategy of ``lists`` that are known good (non-empty tuples of ascending, distinct non-negative
        ids, as ``ComponentPlacement`` resolves them), without checking each list again."""
        strategy = cls.__new__(cls)
        PlacementStrategy.__init__(strategy, node_group)
        if not lists:
            raise PlacementError("accelerator_id_lists is empty: give one list per process")
        strategy.accelerator_id_lists = lists
        return strategy

    def resource_lists(self, space: ResourceSpace) -> tuple[tuple[int, ...], ...]:
        return self.accelerator_id_lists

    def __repr__(self) -> str:
        return f"FlexiblePlacementStrategy({len(self.accelerator_id_lists)} processes, node_group={self.group_labels})"


class NodePlacementStrategy(PlacementStrategy):
    """One node index per process (repeats allowed), counted over the nodes of the selected group(s)."""

    default_group = "node"
    nodes_only = True

    def __init__(self, node_ranks: Sequence[int], node_group: GroupSelection = None) -> None:
        super().__init__(node_group)
        if isinstance(node_ranks, str) or not isinstance(node_ranks, Sequence) or not node_ranks:
            raise PlacementError(f"node_ranks must be a non-empty list of node indices, got {node_ranks!r}")
        for rank, index in enumerate(node_ranks):
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise PlacementError(f"process {rank}: {index!r} is not a node index (a non-negative integer)",
                                     rank=rank)
        self.node_ranks: tuple[int, ...] = tuple(node_ranks)

    @classmethod
    def of_checked(cls, node_ranks: tuple[int, ...], node_group: GroupSelection) -> NodePlacementStrategy:
        """The strategy of ``node_ranks`` that are known good (a non-empty tuple of non-negative integers, as
        ``ComponentPlacement`` resolves them), without checking each one again."""
        strategy = cls.__new__(cls)
        PlacementStrategy.__init__(strategy, node_group)
        if not node_ranks:
            raise PlacementError(f"node_ranks must be a non-empty list of node indices, got {node_ranks!r}")
        strategy.node_ranks = node_ranks
        return strategy

    def resource_lists(self, space: ResourceSpace) -> list[tuple[int]]:
        return [(index,) for index in self.node_ranks]

    def __repr__(self) -> str:
        return f"NodePlacementStrategy({list(self.node_ranks)}, node_group={self.group_labels})"
