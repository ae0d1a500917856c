"""Offline inventories: clusters planned on paper (no executor, no detection), for ``hwplace plan --nodes``,
``hwplace run --nodes`` checks, tests and vendors planning their own accelerator.

Imports the layers below and :mod:`hwplace.inventory.cluster`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hwplace.config.checks import MAX_NODES
from hwplace.config.section import parse_cluster_config
from hwplace.contracts.hardware import BACKEND_ALIASES, Device
from hwplace.contracts.records import Node
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.settings import FAKE_ACCELERATOR, read_fake_accelerator_memory
from hwplace.foundation.wording import did_you_mean, safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.plugin.detection import MAX_DEVICES
from hwplace.plugin.manager import PluginManager, failures_note
from hwplace.plugin.session import get_plugin_manager

MAX_PLANNED_ACCELERATORS = 4_000_000  # over the whole offline cluster: bounds memory, far beyond any cluster
MAX_NODES_ITEMS = 10_000
_NODES_ITEM = re.compile(r"^(?:([0-9]{1,7})x)?([0-9]{1,7})(?::([a-z0-9][a-z0-9._-]{0,63}))?\Z")


def accelerator_counts(value: Any, num_nodes: int | None, config_nodes: int | None) -> list[int]:
    allowed = "one non-negative count per node, or a single integer for every node"
    if num_nodes is not None and (isinstance(num_nodes, bool) or not isinstance(num_nodes, int)
                                  or not 1 <= num_nodes <= MAX_NODES):
        raise ConfigError("num_nodes", f"must be an integer from 1 to {MAX_NODES}", value=num_nodes)
    if isinstance(value, int) and not isinstance(value, bool):
        counts = [value] * (num_nodes or config_nodes or 1)
    elif isinstance(value, Sequence) and not isinstance(value, str):
        counts = list(value)
        if num_nodes is not None and num_nodes != len(counts):
            raise ConfigError("accelerators_per_node", f"gives {len(counts)} counts for num_nodes={num_nodes}",
                              allowed=allowed)
        if not counts:
            raise ConfigError("accelerators_per_node", "is empty: a cluster needs at least one node", allowed=allowed)
        if len(counts) > MAX_NODES:
            raise ConfigError("accelerators_per_node", f"gives {len(counts)} nodes; at most {MAX_NODES}")
    else:
        raise ConfigError("accelerators_per_node", "must be an integer or a list of integers", value=value)
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_DEVICES:
            raise ConfigError("accelerators_per_node", f"{safe_repr(count)} is not a count from 0 to {MAX_DEVICES}",
                              value=value)
    if sum(counts) > MAX_PLANNED_ACCELERATORS:
        raise ConfigError("accelerators_per_node", f"asks for {sum(counts)} accelerators in all; at most "
                          f"{MAX_PLANNED_ACCELERATORS}")
    return counts


def _types(value: Any, counts: list[int], manager: PluginManager) -> list[str]:
    types = [value] * len(counts) if isinstance(value, str) else list(value) if isinstance(value, Sequence) else None
    if types is None or len(types) != len(counts):
        raise ConfigError("accelerator_type", f"must be a backend name, or one per node ({len(counts)})",
                          value=value)
    accelerators = sorted(b.name for b in manager.backends_of_kind("accelerator"))
    for name, count in zip(types, counts, strict=True):
        if count and name not in accelerators:
            raise ConfigError("accelerator_type", f"{safe_repr(name)} is not a registered accelerator backend",
                              allowed=f"registered: {', '.join(accelerators) or 'none'}"
                                      f"{did_you_mean(str(name), accelerators, BACKEND_ALIASES)}"
                                      f"{failures_note(manager)}")
    return types


def fake_cluster(
    cluster_cfg: Any = None,
    *,
    num_nodes: int | None = None,
    accelerators_per_node: int | Sequence[int] = 0,
    accelerator_type: str | Sequence[str] = FAKE_ACCELERATOR,
    plugin_manager: PluginManager | None = None,
) -> Cluster:
    """An offline :class:`~hwplace.Cluster` (no executor, no detection) of planned nodes.

    Each node has ``accelerators_per_node`` accelerators (an int for every node, or one count per node) of
    ``accelerator_type`` (any registered accelerator backend, or one per node), whose backend supplies the
    isolation variables; plus one record of the node backend, and the devices the config declares for it,
    each a healthy device whose properties are its config entry. ``num_nodes`` defaults to the config's, or
    to the number of counts given. Fake accelerators report ``memory_bytes`` from
    ``HWPLACE_FAKE_ACCELERATOR_MEMORY`` (default 80GiB) as the fake backend's do; planned accelerators of other
    types report no capacity.
    """
    manager = plugin_manager or get_plugin_manager()
    config = parse_cluster_config(cluster_cfg, plugin_manager=manager) if cluster_cfg is not None else None
    counts = accelerator_counts(accelerators_per_node, num_nodes, config.num_nodes if config else None)
    types = _types(accelerator_type, counts, manager)
    node_backends = manager.backends_of_kind("node")
    planned_fakes = any(count and name == FAKE_ACCELERATOR for count, name in zip(counts, types, strict=True))
    fake_memory = read_fake_accelerator_memory() if planned_fakes else 0
    nodes = []
    for rank, (count, type_name) in enumerate(zip(counts, types, strict=True)):
        name = f"fake-node-{rank}"
        hardware: dict[str, tuple[Device, ...]] = {}
        if count:
            properties = {"memory_bytes": fake_memory} if type_name == FAKE_ACCELERATOR else {}
            hardware[type_name] = tuple(Device(i, f"planned {type_name}", properties=properties)
                                        for i in range(count))
        for backend in node_backends:  # none when the node plugin is disabled: nothing stands in for it
            hardware[backend.name] = (Device(0, "planned node", properties={"hostname": name, "address": name}),)
        for device_type, configs in (config.declared_configs(rank) if config else {}).items():
            hardware[device_type] = tuple(
                Device(i, f"planned {device_type}", properties={k: v for k, v in c.items() if k != "node_rank"})
                for i, c in enumerate(configs))
        nodes.append(Node(rank, name, name, hardware))
    return Cluster(config, nodes=nodes, plugin_manager=manager)


def parse_nodes(spec: str) -> tuple[list[int], list[str]]:
    """``--nodes``: accelerator counts and types per node.

    ``4x8`` is 4 nodes of 8 fake accelerators, ``4x8:cuda`` of 8 ``cuda`` accelerators; items join with
    commas (``2x8:my-tpu,1x4:cuda``), and ``8,8,4`` gives one count per node.
    """
    allowed = ("[NODESx]ACCELERATORS[:TYPE] items joined by commas, such as 4x8, 4x8:cuda, 2x8:my-tpu,1x4:cuda "
               "or 8,8,4")
    counts: list[int] = []
    types: list[str] = []
    items = spec.replace(" ", "").split(",")
    if len(items) > MAX_NODES_ITEMS:
        raise ConfigError("--nodes", f"has {len(items)} items; at most {MAX_NODES_ITEMS}", allowed=allowed)
    for item in items:
        match = _NODES_ITEM.match(item)
        if match is None:
            raise ConfigError("--nodes", f"{item[:40]!r} is not a node count", allowed=allowed)
        repeat = int(match.group(1) or 1)
        if repeat == 0:
            raise ConfigError("--nodes", f"{item!r} has no nodes", allowed=allowed)
        if len(counts) + repeat > MAX_NODES:
            raise ConfigError("--nodes", f"asks for more than {MAX_NODES} nodes", allowed=allowed)
        counts += [int(match.group(2))] * repeat
        types += [match.group(3) or FAKE_ACCELERATOR] * repeat
    return counts, types
