"""A throwaway cluster of several nodes on this machine, started by an executor that offers it
(:class:`hwplace.executor.LocalClusters`): ``hwplace run --nodes`` and :func:`hwplace.testing.local_ray_cluster`.

hwplace decides what each node is (its environment: its node rank and its count of fake accelerators, plus the
caller's variables, all checked here before anything starts); the executor only starts the nodes. Imports the
layers below and :mod:`hwplace.inventory.offline`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

from hwplace.config.checks import env_vars as checked_env_vars
from hwplace.contracts.capabilities import LocalClusters, require
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.settings import FAKE_ACCELERATORS, NODE_RANK
from hwplace.inventory.offline import accelerator_counts
from hwplace.plugin.manager import PluginManager
from hwplace.plugin.session import get_plugin_manager


@contextlib.contextmanager
def local_cluster(
    num_nodes: int = 2,
    accelerators_per_node: int | Sequence[int] = 0,
    *,
    executor: str = "ray",
    cpus_per_node: int = 1,
    env_vars: Mapping[str, str] | None = None,
    plugin_manager: PluginManager | None = None,
) -> Iterator[str]:
    """Start ``num_nodes`` nodes on this machine through the executor named ``executor``, connect this process and
    yield the cluster's address; everything started stops when the block ends.

    Node ``i`` has ``HWPLACE_NODE_RANK=i`` and ``HWPLACE_FAKE_ACCELERATORS`` (``accelerators_per_node``: one count
    for every node, or one per node) in its environment, plus ``env_vars``.
    """
    counts = accelerator_counts(accelerators_per_node, num_nodes, None)
    if isinstance(cpus_per_node, bool) or not isinstance(cpus_per_node, int) or cpus_per_node < 1:
        raise ConfigError("cpus_per_node", "must be a positive integer", value=cpus_per_node)
    common = checked_env_vars(env_vars or {}, "env_vars")
    for name in (NODE_RANK, FAKE_ACCELERATORS):
        if name in common:
            raise ConfigError(f"env_vars.{name}", "is set by the local cluster for each node",
                              allowed="give accelerators_per_node instead; node ranks are 0, 1, ...")
    manager = plugin_manager or get_plugin_manager()
    starter = require(manager.executor(executor), LocalClusters, "a local cluster")
    envs = [{**common, NODE_RANK: str(rank), FAKE_ACCELERATORS: str(count)} for rank, count in enumerate(counts)]
    with starter.local_cluster(envs, cpus_per_node=cpus_per_node) as address:
        yield address
