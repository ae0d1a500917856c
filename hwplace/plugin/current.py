"""The executor of this process: the one of the last cluster started here, or, in a worker, its own.

Channels are started and reached through it. Set by :class:`~hwplace.Cluster` on the driver and by the
worker host in each worker; an executor named but not yet loaded is looked up through the plugin manager
on first use. Imports the foundation, the contracts and :mod:`hwplace.plugin.manager`.
"""

from __future__ import annotations

from hwplace.contracts.executor import Executor
from hwplace.foundation.errors import ConfigError
from hwplace.plugin.manager import get_plugin_manager

_current: list[Executor | str] = []


def set_current_executor(executor: Executor | str) -> None:
    """Make ``executor`` (or the one of that name) the one this process's channels use."""
    _current[:] = [executor]


def current_executor() -> Executor:
    """The executor of this process: the one of the last cluster started here, or the worker's own."""
    if not _current:
        raise ConfigError("channel", "there is no running cluster in this process",
                          allowed="start one first with hwplace.Cluster(cluster_cfg), or use channels inside workers")
    executor = _current[0]
    if isinstance(executor, str):
        executor = get_plugin_manager().executor(executor)
        _current[:] = [executor]
    return executor
