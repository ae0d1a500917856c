"""Helpers for testing hwplace and hwplace plugins: offline clusters, a local Ray cluster, throwaway plugins
(``backend_plugin``) and their registration, and ``BackendConformance``, the conformance kit for backend
authors (it needs pytest, so it is loaded when first used).

The top of the core: nothing but the tests and the package face imports it.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hwplace.foundation.errors import PluginError
from hwplace.foundation.settings import FAKE_ACCELERATOR
from hwplace.inventory.local import local_cluster
from hwplace.inventory.offline import fake_cluster
from hwplace.plugin.manager import PluginManager
from hwplace.plugin.session import Session, get_plugin_manager, swapped_session
from hwplace.testing.plugins import backend_plugin

__all__ = [
    "FAKE_ACCELERATOR",
    "ODD_CONFIGS",
    "BackendConformance",
    "ProcessExecutor",
    "Session",
    "backend_plugin",
    "fake_cluster",
    "local_cluster",
    "local_ray_cluster",
    "process_cluster",
    "registered_plugin",
    "swapped_session",
]


@contextlib.contextmanager
def local_ray_cluster(
    num_nodes: int = 2,
    accelerators_per_node: int | Sequence[int] = 0,
    *,
    cpus_per_node: int = 1,
    env_vars: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """A real multi-node Ray cluster on this machine, with this process connected to it; yields its address.

    Node ``i`` is a raylet of its own whose environment has ``HWPLACE_NODE_RANK=i`` and
    ``HWPLACE_FAKE_ACCELERATORS`` (``accelerators_per_node``: one count for every node, or one per node), plus
    ``env_vars``. The cluster stops when the block ends, and no other process's ``ray.init()`` finds it. Started
    by the Ray executor's :class:`hwplace.executor.LocalClusters` capability (:func:`local_cluster` with
    ``executor="ray"``).
    """
    with local_cluster(num_nodes, accelerators_per_node, executor="ray", cpus_per_node=cpus_per_node,
                       env_vars=env_vars) as address:
        yield address


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
    from hwplace.testing.conformance import ODD_CONFIGS as ODD_CONFIGS
    from hwplace.testing.conformance import BackendConformance as BackendConformance
    from hwplace.testing.processes import ProcessExecutor as ProcessExecutor
    from hwplace.testing.processes import process_cluster as process_cluster


def __getattr__(name: str) -> Any:
    if name in ("BackendConformance", "ODD_CONFIGS"):
        # the kit imports pytest (an optional dependency): its module is loaded on first use only
        return getattr(importlib.import_module(f"{__name__}.conformance"), name)
    if name in ("ProcessExecutor", "process_cluster"):
        # the process executor's modules use registered_plugin, above: loaded once this module is
        return getattr(importlib.import_module(f"{__name__}.processes"), name)
    raise AttributeError(f"module 'hwplace.testing' has no attribute {name!r}")
