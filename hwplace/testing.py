"""Helpers for testing hwplace and hwplace plugins: offline clusters, a local Ray cluster, throwaway plugin
registration, and ``BackendConformance``, the conformance kit for backend authors (it imports pytest, so
it is loaded when first used)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hwplace.cluster import Cluster, Node
from hwplace.config import MAX_NODES, parse_cluster_config
from hwplace.errors import ConfigError, PluginError
from hwplace.hardware import Device
from hwplace.plugin_manager import MAX_DEVICES, PluginManager, failures_note, get_plugin_manager
from hwplace.wording import did_you_mean, safe_repr

FAKE_ACCELERATOR = "fake-accelerator"
MAX_PLANNED_ACCELERATORS = 4_000_000  # over the whole offline cluster: bounds memory, far beyond any cluster


def _counts(value: Any, num_nodes: int | None, config_nodes: int | None) -> list[int]:
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
                                      f"{did_you_mean(str(name), accelerators)}{failures_note(manager)}")
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
    to the number of counts given.
    """
    manager = plugin_manager or get_plugin_manager()
    config = parse_cluster_config(cluster_cfg, plugin_manager=manager) if cluster_cfg is not None else None
    counts = _counts(accelerators_per_node, num_nodes, config.num_nodes if config else None)
    types = _types(accelerator_type, counts, manager)
    node_backends = manager.backends_of_kind("node")
    nodes = []
    for rank, (count, type_name) in enumerate(zip(counts, types, strict=True)):
        name = f"fake-node-{rank}"
        hardware: dict[str, tuple[Device, ...]] = {}
        if count:
            hardware[type_name] = tuple(Device(i, f"planned {type_name}") for i in range(count))
        for backend in node_backends:  # none when the node plugin is disabled: nothing stands in for it
            hardware[backend.name] = (Device(0, "planned node", properties={"hostname": name, "address": name}),)
        for device_type, configs in (config.declared_configs(rank) if config else {}).items():
            hardware[device_type] = tuple(
                Device(i, f"planned {device_type}", properties={k: v for k, v in c.items() if k != "node_rank"})
                for i, c in enumerate(configs))
        nodes.append(Node(rank, name, name, hardware))
    return Cluster(config, nodes=nodes, plugin_manager=manager)


def _driver_paths() -> str:
    """The driver's import path outside its interpreter's own folders (test folders, a source checkout)."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths = [os.path.realpath(p or os.curdir) for p in sys.path]
    own = [p for p in paths if os.path.isdir(p) and not any(p == x or p.startswith(x + os.sep) for x in prefixes)]
    existing = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(dict.fromkeys([*own, *filter(None, existing.split(os.pathsep))]))


@contextlib.contextmanager
def local_ray_cluster(
    num_nodes: int = 2,
    accelerators_per_node: int | Sequence[int] = 0,
    *,
    cpus_per_node: int = 1,
    env_vars: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """A real multi-node Ray cluster on this machine, with the driver connected to it; yields its address.

    Node ``i`` is a raylet of its own whose environment has ``HWPLACE_NODE_RANK=i`` and
    ``HWPLACE_FAKE_ACCELERATORS`` (``accelerators_per_node``: one count for every node, or one per node),
    plus ``env_vars``. Its workers can import what the driver imports from outside its environment (the
    folders pytest puts on ``sys.path``, a source checkout). The cluster stops when the block ends.
    """
    counts = _counts(accelerators_per_node, num_nodes, None)
    if isinstance(cpus_per_node, bool) or not isinstance(cpus_per_node, int) or cpus_per_node < 1:
        raise ConfigError("cpus_per_node", "must be a positive integer", value=cpus_per_node)
    import ray
    from ray.cluster_utils import Cluster as RayCluster

    if ray.is_initialized():
        raise ConfigError("local_ray_cluster", "this process is already connected to Ray",
                          allowed="call ray.shutdown() first, or use that cluster")
    common = {**(env_vars or {}), "PYTHONPATH": _driver_paths()}

    def node_args(rank: int) -> dict[str, Any]:
        env = {**common, "HWPLACE_NODE_RANK": str(rank), "HWPLACE_FAKE_ACCELERATORS": str(counts[rank])}
        return {"num_cpus": cpus_per_node, "env_vars": env, "include_dashboard": False} if rank == 0 else \
            {"num_cpus": cpus_per_node, "env_vars": env}

    cluster = RayCluster(initialize_head=True, head_node_args=node_args(0))
    try:
        for rank in range(1, len(counts)):
            cluster.add_node(**node_args(rank))
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        try:
            yield str(cluster.address)
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def registered_plugin(
    plugin: object, name: str | None = None, *, plugin_manager: PluginManager | None = None
) -> Iterator[str]:
    """Register a plugin for the duration of a ``with`` block; the manager is as it was afterwards.

    Works when the plugin is also installed (the normal state while developing it): an installed plugin
    that is the same object, has the same name, or provides a backend or executor of the same name is set
    aside for the block and restored after it.
    """
    manager = plugin_manager or get_plugin_manager()
    existing = manager.name_of(plugin)
    if existing is not None and name in (None, existing):
        yield existing
        return
    put_aside: list[tuple[str, object, str]] = []

    def set_aside(other: str) -> None:
        put_aside.append((other, manager.plugin(other), manager.plugins()[other]))
        manager.unregister(other)

    if existing is not None:
        set_aside(existing)
    registered = name or manager.default_name(plugin)
    if manager.plugin(registered) is not None:
        set_aside(registered)
    try:
        manager.register(plugin, name=registered)
        try:
            while (clash := _clash(manager, registered)) is not None:
                set_aside(clash)
            yield registered
        finally:
            manager.unregister(registered)
    finally:
        for other, obj, dist in reversed(put_aside):
            manager.register(obj, name=other, distribution=dist)


def _clash(manager: PluginManager, registered: str) -> str | None:
    """Another plugin that provides a backend or executor of the same name as ``registered`` does, if any."""
    try:
        manager.backends()
        manager.executors()
    except PluginError as exc:
        others = [p for p in exc.plugins if p != registered]
        if registered not in exc.plugins or not others:
            raise
        return others[0]
    return None


if TYPE_CHECKING:  # what the lazy __getattr__ below hands out, as type checkers should see it
    from hwplace.conformance import ODD_CONFIGS as ODD_CONFIGS
    from hwplace.conformance import BackendConformance as BackendConformance


def __getattr__(name: str) -> Any:
    if name in ("BackendConformance", "ODD_CONFIGS"):  # the kit needs pytest: loaded on first use only
        from hwplace import conformance

        return getattr(conformance, name)
    raise AttributeError(f"module 'hwplace.testing' has no attribute {name!r}")
