"""Helpers for testing hwplace and hwplace plugins: offline fake clusters and throwaway plugin registration."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from hwplace.cluster import Cluster, Node, detect_node_hardware
from hwplace.config import parse_cluster_config
from hwplace.errors import ConfigError, PluginError
from hwplace.hardware import Device
from hwplace.plugin_manager import get_plugin_manager

FAKE_ACCELERATOR = "fake-accelerator"
_environment_lock = threading.Lock()


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    with _environment_lock:
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            yield
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old


def _per_node(accelerators_per_node: int | Sequence[int], num_nodes: int | None, config_nodes: int | None) -> list[int]:
    if isinstance(accelerators_per_node, bool):
        raise ConfigError("accelerators_per_node", "must be an integer or a list of integers",
                          value=accelerators_per_node)
    if isinstance(accelerators_per_node, int):
        count = num_nodes or config_nodes or 1
        counts = [accelerators_per_node] * count
    else:
        counts = list(accelerators_per_node)
        if num_nodes is not None and num_nodes != len(counts):
            raise ConfigError("accelerators_per_node", f"gives {len(counts)} counts for num_nodes={num_nodes}",
                              allowed="one count per node, or a single integer for every node")
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError("accelerators_per_node", f"{count!r} is not a non-negative integer",
                              value=accelerators_per_node)
    if not counts:
        raise ConfigError("num_nodes", "a cluster needs at least one node")
    return counts


def fake_cluster(
    cluster_cfg: Any = None, *, num_nodes: int | None = None, accelerators_per_node: int | Sequence[int] = 0
) -> Cluster:
    """An offline :class:`~hwplace.Cluster` (no Ray) of fake nodes.

    Each node has ``accelerators_per_node`` fake accelerators (an int for every node, or one count per
    node), found by the fake backend's own detection, plus the devices the config declares for it,
    found by their backends. ``num_nodes`` defaults to the config's, or to the number of counts given.
    """
    config = parse_cluster_config(cluster_cfg) if cluster_cfg is not None else None
    counts = _per_node(accelerators_per_node, num_nodes, config.num_nodes if config else None)
    manager = get_plugin_manager()
    if any(counts) and FAKE_ACCELERATOR not in manager.backends():
        raise PluginError(f"the {FAKE_ACCELERATOR!r} backend is not registered (is the 'fake' plugin disabled?)")
    nodes = []
    for rank, count in enumerate(counts):
        declared = config.declared_configs(rank) if config else {}
        with _environment("HWPLACE_FAKE_ACCELERATORS", str(count)):
            hardware, problems = detect_node_hardware(declared, backends=[FAKE_ACCELERATOR], manager=manager)
        name = f"fake-node-{rank}"
        hardware["node"] = (Device(0, "hwplace fake node", properties={"hostname": name, "address": name}),)
        nodes.append(Node(rank, name, name, hardware, problems))
    return Cluster(config, nodes=nodes)


@contextlib.contextmanager
def registered_plugin(plugin: object, name: str | None = None) -> Iterator[str]:
    """Register a throwaway plugin in the process-wide plugin manager; always unregistered afterwards."""
    manager = get_plugin_manager()
    registered = manager.register(plugin, name=name)
    try:
        yield registered
    finally:
        manager.unregister(registered)
