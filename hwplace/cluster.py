"""The cluster inventory: its nodes, in rank order, and the hardware every backend found on each."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hwplace.config import ClusterConfig, parse_cluster_config
from hwplace.errors import ConfigError
from hwplace.hardware import Device, HardwareBackend
from hwplace.plugin_manager import Detection, PluginManager, get_plugin_manager


@dataclass(frozen=True)
class Node:
    """One node: its cluster-wide ``rank``, the executor's ``node_id``, and its hardware by backend name.

    ``problems`` lists the backends whose detection failed on this node, with the reason.
    """

    rank: int
    node_id: str
    address: str
    hardware: Mapping[str, tuple[Device, ...]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def devices(self, hardware_type: str) -> tuple[Device, ...]:
        """This node's devices of one hardware type (empty when it has none)."""
        return self.hardware.get(hardware_type, ())


def detect_node_hardware(
    declared: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    backends: Sequence[str] | None = None,
    manager: PluginManager | None = None,
) -> tuple[dict[str, tuple[Device, ...]], tuple[str, ...]]:
    """Run detection here, on this node: every accelerator and node backend, plus the declared devices.

    ``declared`` maps a device backend's name to this node's configs for it. ``backends``, when given,
    limits the undeclared backends that run. Returns the devices by backend name and the problems found.
    """
    manager = manager or get_plugin_manager()
    hardware: dict[str, tuple[Device, ...]] = {}
    problems = [f"plugin {f.plugin!r} ({f.distribution}): {f.error}" for f in manager.failures]
    for name, info in manager.backends().items():
        if name in declared:
            detection = manager.detect(name, declared[name])
        elif info.kind != "device" and (backends is None or name in backends):
            detection = manager.detect(name)
        else:
            continue
        _record(detection, hardware, problems)
    missing = sorted(set(declared) - set(manager.backends()))
    problems += [f"{name}: no such backend is registered on this node" for name in missing]
    return hardware, tuple(problems)


def _record(detection: Detection, hardware: dict[str, tuple[Device, ...]], problems: list[str]) -> None:
    if detection.error is not None:
        problems.append(f"{detection.backend}: {detection.error}")
    elif detection.devices:
        hardware[detection.backend] = detection.devices


def this_node(declared: Mapping[str, Sequence[Mapping[str, Any]]], rank: int = 0) -> Node:
    """This machine as a node, with everything detected on it."""
    hardware, problems = detect_node_hardware(declared)
    hostname = socket.gethostname()
    node_info = hardware.get("node", ())
    address = str(node_info[0].properties.get("address", hostname)) if node_info else hostname
    return Node(rank, hostname, address, hardware, problems)


class Cluster:
    """The nodes a job may use, in rank order, and their hardware.

    ``Cluster(cluster_cfg)`` inventories this machine as node 0; ``Cluster(cluster_cfg, nodes=[...])`` takes
    a given inventory (``hwplace.testing.fake_cluster`` builds one). ``cluster_cfg`` is the ``cluster:``
    section (mapping or OmegaConf); its ``num_nodes`` must not exceed the nodes found.
    """

    def __init__(self, cluster_cfg: Any = None, *, nodes: Sequence[Node] | None = None) -> None:
        config = parse_cluster_config(cluster_cfg) if cluster_cfg is not None else None
        if nodes is None:
            nodes = [this_node(config.declared_configs(0) if config else {})]
        for index, node in enumerate(nodes):
            if node.rank != index:
                raise ConfigError("nodes", f"node {node.node_id!r} has rank {node.rank} at position {index}; "
                                  "nodes must be given in rank order 0..N-1")
        if config is None:
            config = ClusterConfig(num_nodes=max(len(nodes), 1))
        if config.num_nodes > len(nodes):
            found = "; ".join(f"node {n.rank}: {n.node_id} ({n.address})" for n in nodes) or "none"
            raise ConfigError("cluster.num_nodes", f"asks for {config.num_nodes} nodes but {len(nodes)} "
                              f"{'is' if len(nodes) == 1 else 'are'} available", allowed=f"found {found}")
        self.config: ClusterConfig = config
        self.nodes: tuple[Node, ...] = tuple(nodes[: config.num_nodes])
        self._manager = get_plugin_manager()

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def backend(self, hardware_type: str) -> HardwareBackend | None:
        """The backend named ``hardware_type``, or ``None`` when it is not registered here."""
        info = self._manager.backends().get(hardware_type)
        return info.backend if info else None

    def kind(self, hardware_type: str) -> str | None:
        """The kind ("accelerator", "device" or "node") of a hardware type, ``None`` if unknown here."""
        info = self._manager.backends().get(hardware_type)
        return info.kind if info else None

    def accelerator_types(self, node_ranks: Sequence[int]) -> list[str]:
        """The accelerator types present on some of these nodes, by name."""
        kinds = {name: info.kind for name, info in self._manager.backends().items()}
        found = {t for r in node_ranks for t, devs in self.nodes[r].hardware.items()
                 if devs and kinds.get(t) == "accelerator"}
        return sorted(found)

    @property
    def problems(self) -> list[str]:
        """Detection problems, each once, prefixed with the nodes it was seen on ("nodes 0-3,7: ...")."""
        seen: dict[str, list[int]] = {}
        for node in self.nodes:
            for problem in node.problems:
                seen.setdefault(problem, []).append(node.rank)
        return [f"{_ranks_text(ranks)}: {problem}" for problem, ranks in seen.items()]

    def __repr__(self) -> str:
        return f"<Cluster {self.num_nodes} node(s)>"


def _ranks_text(ranks: list[int]) -> str:
    """``node 3``, or ``nodes 0-3,7`` for ascending ranks."""
    if len(ranks) == 1:
        return f"node {ranks[0]}"
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return "nodes " + ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)
