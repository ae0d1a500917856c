"""The records a validated ``cluster:`` section is made of; immutable, built once by
:mod:`hwplace.config.section` and passed on. Records only, with the lookups they answer. Imports the
foundation and :mod:`hwplace.config.checks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hwplace.config.checks import check_num_nodes
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.frozen import FrozenDict
from hwplace.foundation.wording import did_you_mean, safe_repr

RESERVED_GROUPS = ("cluster", "node")
DEFAULT_EXECUTOR = "ray"


@dataclass(frozen=True)
class EnvConfig:
    """Environment and interpreter for some nodes of a group."""

    node_ranks: tuple[int, ...]
    env_vars: Mapping[str, str]
    python_interpreter_path: str | None = None


@dataclass(frozen=True)
class HardwareConfig:
    """A group's declared hardware type, and for device backends the per-node device configs."""

    type: str
    configs: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class NodeGroup:
    """A labelled set of nodes; ``hardware`` and ``ignore_hardware`` decide what its resources are."""

    label: str
    node_ranks: tuple[int, ...]
    env_configs: tuple[EnvConfig, ...] = ()
    hardware: HardwareConfig | None = None
    ignore_hardware: bool = False
    path: str = "cluster"  # the key path of its entry in cluster.node_groups; "cluster" for the reserved groups

    def __post_init__(self) -> None:
        for rank in self.node_ranks:
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise ConfigError(f"{self.path}.node_ranks", f"group {self.label!r} holds node rank "
                                  f"{safe_repr(rank)}", allowed="node ranks are non-negative integers")

    @property
    def declares_devices(self) -> bool:
        """Whether this group declares devices of its own (``hardware.configs``)."""
        return self.hardware is not None and bool(self.hardware.configs)

    def env_vars(self, node_rank: int) -> dict[str, str]:
        """The environment variables this group sets on one of its nodes."""
        env: dict[str, str] = {}
        for config in self.env_configs:
            if node_rank in config.node_ranks:
                env.update(config.env_vars)
        return env

    def python_interpreter_path(self, node_rank: int) -> str | None:
        """The interpreter this group's processes use on one of its nodes, ``None`` for the default."""
        for config in self.env_configs:
            if node_rank in config.node_ranks and config.python_interpreter_path:
                return config.python_interpreter_path
        return None


@dataclass(frozen=True)
class ComponentSpec:
    """One component's placement as configured: the node group(s) and the placement string."""

    name: str
    node_groups: tuple[str, ...]
    placement: str
    path: str


@dataclass(frozen=True)
class ClusterConfig:
    """The validated ``cluster:`` section."""

    num_nodes: int
    address: str | None = None
    node_groups: tuple[NodeGroup, ...] = ()
    components: Mapping[str, ComponentSpec] = field(default_factory=FrozenDict)
    executor: str = DEFAULT_EXECUTOR

    def __post_init__(self) -> None:
        check_num_nodes(self.num_nodes)
        for group in self.node_groups:
            beyond = [rank for rank in group.node_ranks if rank >= self.num_nodes]
            if beyond:
                raise ConfigError(f"{group.path}.node_ranks", f"node rank {beyond[0]} is out of range: "
                                  f"cluster.num_nodes is {self.num_nodes}")
        object.__setattr__(self, "components", FrozenDict(self.components))

    def group(self, label: str) -> NodeGroup:
        """A configured group, or the reserved ``cluster`` / ``node`` group, by label."""
        labels = [g.label for g in self.node_groups] + list(RESERVED_GROUPS)
        if not isinstance(label, str):
            raise ConfigError("node_group", "a node group is named by its label, a string", value=label,
                              allowed=f"groups: {', '.join(labels)}")
        if label in RESERVED_GROUPS:
            return NodeGroup(label, tuple(range(self.num_nodes)), ignore_hardware=label == "node")
        for group in self.node_groups:
            if group.label == label:
                return group
        raise ConfigError("cluster.node_groups", f"there is no node group {label!r}",
                          allowed=f"groups: {', '.join(labels)}{did_you_mean(label, labels)}")

    def declared_configs(self, node_rank: int) -> dict[str, list[Mapping[str, Any]]]:
        """The device configs every group declares for one node, by hardware type, in declaration order."""
        found: dict[str, list[Mapping[str, Any]]] = {}
        for group in self.node_groups:
            if group.hardware is not None:
                for config in group.hardware.configs:
                    if config["node_rank"] == node_rank:
                        found.setdefault(group.hardware.type, []).append(config)
        return found

    def declared_range(self, label: str, node_rank: int) -> range:
        """Where group ``label``'s own declared devices sit among the node's devices of their type.

        Devices of one type on one node are detected in declaration order, group after group; a group
        owns exactly the ones its own ``hardware.configs`` declare.
        """
        target = self.group(label).hardware
        start = 0
        for group in self.node_groups:
            if group.hardware is None:
                continue
            count = sum(1 for config in group.hardware.configs if config["node_rank"] == node_rank)
            if group.label == label:
                return range(start, start + count)
            if target is not None and group.hardware.type == target.type:
                start += count
        return range(0)

    def device_declarations(self) -> tuple[tuple[str, HardwareConfig], ...]:
        """Every group that declares devices, with its declaration: what a Cluster detects."""
        return tuple((g.label, g.hardware) for g in self.node_groups if g.hardware is not None and g.hardware.configs)
