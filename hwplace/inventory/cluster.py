"""The cluster inventory: its nodes, in rank order, and the hardware every backend found on each.

Imports the layers below: the contracts, the plugin manager and the configuration records.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

from hwplace.config.records import ClusterConfig
from hwplace.config.section import parse_cluster_config
from hwplace.contracts.executor import Executor
from hwplace.contracts.hardware import HardwareBackend
from hwplace.contracts.records import Node
from hwplace.foundation.errors import ConfigError, PluginError
from hwplace.foundation.settings import read_job_name
from hwplace.foundation.wording import plural, ranks_text, safe_repr
from hwplace.inventory.detection import detect_node_hardware
from hwplace.plugin.manager import PluginManager
from hwplace.plugin.session import get_plugin_manager, session


class Cluster:
    """The nodes a job may use, in rank order, and their hardware.

    ``Cluster(cluster_cfg)`` asks the executor the config names (``cluster.executor``, Ray by default)
    for the live nodes; ``Cluster(cluster_cfg, nodes=[...])`` takes a given inventory
    (``hwplace.testing.fake_cluster`` builds one) and :meth:`this_machine` inventories this machine alone.
    ``cluster_cfg`` is the ``cluster:`` section (mapping, OmegaConf or :class:`ClusterConfig`); its
    ``num_nodes`` must not exceed the nodes found. ``plugin_manager`` defaults to the process-wide one.
    ``job_name`` is what this job's groups and device leases go by on a shared cluster (``hwplace status``);
    by default ``HWPLACE_JOB_NAME``, else the driver script's name. A cluster that discovers its nodes makes its
    executor this process's (:func:`hwplace.executor.session`), for channels and weight syncs created without
    ``cluster=``.
    """

    def __init__(
        self,
        cluster_cfg: Any = None,
        *,
        nodes: Sequence[Node] | None = None,
        plugin_manager: PluginManager | None = None,
        job_name: str | None = None,
    ) -> None:
        self.plugin_manager = plugin_manager or get_plugin_manager()
        if job_name is not None and (not isinstance(job_name, str) or not job_name.strip()):
            raise ConfigError("job_name", "must be a non-empty string", value=job_name)
        self.job_name: str = job_name.strip()[:100] if job_name is not None else read_job_name()
        self._executor: Executor | None = None
        config = parse_cluster_config(cluster_cfg, plugin_manager=self.plugin_manager) if cluster_cfg is not None \
            else None
        if nodes is None:
            if config is None:
                raise ConfigError("cluster", "Cluster() needs the cluster: section of a config, or nodes=[...]")
            nodes = self._discover(config)
        nodes = list(nodes)
        for index, node in enumerate(nodes):
            if not isinstance(node, Node):
                raise ConfigError("nodes", f"position {index} holds {safe_repr(node)}, not a hwplace.Node")
            if node.rank != index:
                raise ConfigError("nodes", f"node {node.node_id!r} has rank {node.rank} at position {index}; "
                                  "nodes must be given in rank order 0..N-1")
        if not nodes:
            raise ConfigError("nodes", "a cluster needs at least one node")
        if config is None:
            config = ClusterConfig(num_nodes=len(nodes))
        if config.num_nodes > len(nodes):
            found = "; ".join(f"node {n.rank}: {n.node_id} ({n.address})" for n in nodes)
            raise ConfigError("cluster.num_nodes", f"asks for {plural(config.num_nodes, 'node')} but "
                              f"{len(nodes)} {'is' if len(nodes) == 1 else 'are'} available",
                              allowed=f"found {found}")
        self.config: ClusterConfig = config
        self.nodes: tuple[Node, ...] = tuple(nodes[: config.num_nodes])

    def _discover(self, config: ClusterConfig) -> list[Node]:
        try:
            executor = self.plugin_manager.executor(config.executor)
        except PluginError as exc:
            raise ConfigError("cluster.executor", str(exc), allowed="install the executor's plugin (the Ray "
                              "executor comes with pip install 'hwplace[ray]'); to plan without running "
                              "anything use hwplace.testing.fake_cluster or Cluster.this_machine") from None
        nodes = list(executor.discover(config, self.plugin_manager))
        self._executor = executor
        session().set_executor(executor)
        return nodes

    def executor(self) -> Executor:
        """The executor that discovered this cluster's nodes and runs its workers."""
        if self._executor is None:
            raise ConfigError("cluster", "this cluster was built from a given inventory (fake_cluster, "
                              "this_machine or nodes=[...]), so it can plan but not run workers",
                              allowed="to launch workers, build it with hwplace.Cluster(cluster_cfg), which "
                              "asks the executor (Ray by default) for the live nodes")
        return self._executor

    @classmethod
    def this_machine(
        cls, cluster_cfg: Any = None, *, plugin_manager: PluginManager | None = None, refresh: bool = False
    ) -> Cluster:
        """This machine alone, as node 0, with what every backend detects here (no executor involved).

        Devices the config declares for node 0 are detected too. Detection runs once per process unless
        ``refresh`` is set.
        """
        manager = plugin_manager or get_plugin_manager()
        config = parse_cluster_config(cluster_cfg, plugin_manager=manager) if cluster_cfg is not None else None
        declared = config.declared_configs(0) if config else {}
        hardware, problems = detect_node_hardware(declared, manager=manager, refresh=refresh)
        hostname = socket.gethostname()
        address = hostname
        try:
            own = hardware.get(manager.node_backend().name, ())
        except PluginError:
            own = ()
        if own and isinstance(own[0].properties.get("address"), str):
            address = own[0].properties["address"]
        return cls(config, nodes=[Node(0, hostname, address, hardware, problems)], plugin_manager=manager)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def backend(self, hardware_type: str) -> HardwareBackend | None:
        """The backend named ``hardware_type``, or ``None`` when it is not registered here."""
        info = self.plugin_manager.backends().get(hardware_type)
        return info.backend if info else None

    def kind(self, hardware_type: str) -> str | None:
        """The kind ("accelerator", "device" or "node") of a hardware type, ``None`` if unknown here."""
        info = self.plugin_manager.backends().get(hardware_type)
        return info.kind if info else None

    def node_type(self) -> str:
        """The name of the backend of kind ``node``: what a node-kind resource is."""
        return self.plugin_manager.node_backend().name

    def accelerator_types(self, node_ranks: Sequence[int]) -> list[str]:
        """The accelerator types present on some of these nodes, by name."""
        kinds = {name: info.kind for name, info in self.plugin_manager.backends().items()}
        found = {t for r in node_ranks for t, devs in self.nodes[r].hardware.items()
                 if devs and kinds.get(t) == "accelerator"}
        return sorted(found)

    @property
    def problems(self) -> list[str]:
        """Detection problems, each once, prefixed with the nodes it was seen on ("nodes 0-3,7: ...")."""
        seen: dict[str, list[int]] = {}
        for node in self.nodes:
            for what, reason in node.problems.items():
                seen.setdefault(f"{what}: {reason}", []).append(node.rank)
        return [f"{ranks_text(ranks)}: {problem}" for problem, ranks in seen.items()]

    def __repr__(self) -> str:
        return f"<Cluster {plural(self.num_nodes, 'node')}>"
