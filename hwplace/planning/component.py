"""``ComponentPlacement``: every component of ``cluster.component_placement``, resolved and checked at once.

It plans from the :class:`~hwplace.JobConfig` it is given (or a ``ClusterConfig``); only a raw config (a path,
a mapping, an OmegaConf object) is parsed here, once. Each component's strategy is a planned one: it holds the
placements made here as an immutable :class:`~hwplace.planning.strategies.Plan`. Imports the layers below and
the other modules of :mod:`hwplace.planning`.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Mapping
from typing import Any

from hwplace.config.grammar import ResolvedEntry, parse_placement, resolve_placement
from hwplace.config.job_config import JobConfig, parse_job_config
from hwplace.config.records import ClusterConfig, ComponentSpec, NodeGroup
from hwplace.contracts.records import Placement
from hwplace.foundation.errors import ConfigError, PlacementError
from hwplace.foundation.wording import did_you_mean, plural, safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.planning.memory import DeviceKey, DeviceMemory, capacity_of, check_memory, device_memory
from hwplace.planning.placements import View, build_placements, gc_paused
from hwplace.planning.resources import ResourceSpace, resource_space
from hwplace.planning.strategies import FlexiblePlacementStrategy, NodePlacementStrategy, PlacementStrategy


class ComponentPlacement:
    """Places every component of ``cluster.component_placement`` of a job config on a cluster.

    ``config`` is a parsed :class:`~hwplace.JobConfig` or ``ClusterConfig``, used as it is, or a whole config
    (a YAML path, a mapping, an OmegaConf object), parsed with :func:`~hwplace.parse_job_config`. ``job`` is the
    job config planned from (a ``ClusterConfig`` alone makes one without other sections), ``config`` its
    ``cluster:`` record. Every component is placed when this object is built, so every mistake surfaces here as
    a :class:`~hwplace.PlacementError` naming the component and quoting the entry, not at launch.

    When the job has a ``resources:`` section, the peak memory of every accelerator is planned too
    (:mod:`hwplace.planning.memory`, in :attr:`memory`), and a device whose peak exceeds its capacity is a
    ``PlacementError`` naming the device, the phase, the components and both figures.
    """

    def __init__(
        self, config: str | os.PathLike[str] | Mapping[str, Any] | JobConfig | ClusterConfig | Any, cluster: Cluster
    ) -> None:
        if isinstance(config, ClusterConfig):
            config = JobConfig(config)
        self.job: JobConfig = config if isinstance(config, JobConfig) else parse_job_config(
            config, plugin_manager=cluster.plugin_manager)
        self.config: ClusterConfig = self.job.cluster
        if self.config.device_declarations() != cluster.config.device_declarations():
            raise ConfigError("cluster.node_groups", "declare devices other than the ones the cluster was built "
                              "with, so the cluster has not detected them",
                              allowed="build the Cluster (or fake_cluster) with the same config")
        if self.config.num_nodes > cluster.num_nodes:
            raise ConfigError("cluster.num_nodes", f"is {self.config.num_nodes} but the cluster has "
                              f"{plural(cluster.num_nodes, 'node')}", allowed="build the Cluster with the same config")
        if not self.config.components:
            raise ConfigError("cluster.component_placement", "is missing or empty: no component to place")
        self.cluster = cluster
        self._strategies: dict[str, PlacementStrategy] = {}  # planned on first use: planning never needs them
        self._lists: dict[str, tuple[list[tuple[int, ...]], bool, list[NodeGroup]]] = {}
        self._placements: dict[str, list[Placement]] = {}
        spaces: dict[tuple[str, ...], ResourceSpace] = {}
        views: dict[tuple[int, str, tuple[int, ...]], View] = {}  # what a process sees: the same for every component
        with gc_paused():  # tens of thousands of small records: collections would make planning superlinear
            for spec in self.config.components.values():
                self._place(spec, spaces, views)
        self.memory: list[DeviceMemory] = self._plan_memory() if self.job.resources else []
        """Each accelerator's peak memory, capacity and headroom; empty without a ``resources:`` section."""
        check_memory(self.memory)

    def _plan_memory(self) -> list[DeviceMemory]:
        capacities: dict[DeviceKey, int | None] = {}
        for placements in self._placements.values():
            for p in placements:
                if p.local_accelerator_id >= 0 and (p.node_rank, p.hardware_type, p.local_accelerator_id) \
                        not in capacities:
                    for device in self.cluster.nodes[p.node_rank].devices(p.hardware_type):
                        capacities[(p.node_rank, p.hardware_type, device.index)] = capacity_of(device.properties)
        return device_memory(self._placements, self.job.resources, capacities)

    def _place(self, spec: ComponentSpec, spaces: dict[tuple[str, ...], ResourceSpace],
               views: dict[tuple[int, str, tuple[int, ...]], View]) -> None:
        text = spec.placement
        groups = [self.config.group(label) for label in spec.node_groups]
        if spec.node_groups not in spaces:
            try:
                spaces[spec.node_groups] = resource_space(self.cluster, groups)
            except PlacementError as exc:
                raise exc.located(spec.name, text, None) from None
        space = spaces[spec.node_groups]
        try:
            resolved = resolve_placement(text, parse_placement(text), len(space), space.description)
        except PlacementError as exc:
            raise exc.located(spec.name, text, exc.span) from None
        lists = [ids for entry in resolved for ids in entry.resource_ids()]
        if space.is_node_kind:
            for entry in resolved:
                if entry.num_resources > entry.num_processes:
                    raise PlacementError(
                        f"{plural(entry.num_resources, 'node')} for "
                        f"{plural(entry.num_processes, 'process', 'processes')}: "
                        "a process holds exactly one node; give at least as many processes as nodes",
                        component=spec.name, text=text, span=entry.entry.span)
        try:
            placements = build_placements(self.cluster, space, lists, isolate_accelerator=True, views=views)
        except PlacementError as exc:
            raise exc.located(spec.name, text, _entry_span(resolved, exc.rank)) from None
        self._lists[spec.name] = (lists, space.is_node_kind, groups)
        self._placements[spec.name] = placements

    @property
    def components(self) -> list[str]:
        """Component names, in config order."""
        return list(self._placements)

    def _known(self, name: str) -> None:
        if not isinstance(name, str) or name not in self._placements:
            raise ConfigError("cluster.component_placement", f"has no component {safe_repr(name)}",
                              allowed=f"components: {', '.join(self._placements)}"
                                      f"{did_you_mean(str(name), self._placements)}")

    def get_strategy(self, name: str) -> PlacementStrategy:
        """The strategy that places component ``name``: Flexible on hardware groups, Node on node groups.

        It is planned on this cluster: immutable, it holds the placements made here, which ``get_placement``
        returns there (accelerators isolated) without building them again.
        """
        self._known(name)
        if name not in self._strategies:
            lists, node_kind, groups = self._lists[name]
            strategy = (NodePlacementStrategy.of_checked(tuple([ids[0] for ids in lists]), node_group=groups)
                        if node_kind else FlexiblePlacementStrategy.of_checked(tuple(lists), node_group=groups))
            self._strategies[name] = strategy.planned_on(self.cluster, self._placements[name])
        return self._strategies[name]

    def get_world_size(self, name: str) -> int:
        """How many processes component ``name`` has."""
        self._known(name)
        return len(self._placements[name])

    def get_placements(self, name: str) -> list[Placement]:
        """The placements of component ``name`` (accelerators isolated), in rank order."""
        self._known(name)
        return list(self._placements[name])

    def spec(self, name: str) -> ComponentSpec:
        """The configured node groups and placement string of component ``name``."""
        self._known(name)
        return self.config.components[name]


def _entry_span(resolved: list[ResolvedEntry], rank: int | None) -> tuple[int, int] | None:
    if rank is None or not resolved:
        return None
    index = bisect.bisect_right([e.first_process for e in resolved], rank) - 1
    return resolved[max(index, 0)].entry.span

