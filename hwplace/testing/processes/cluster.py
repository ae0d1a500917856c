"""``process_cluster``: a :class:`~hwplace.Cluster` whose workers are processes this one starts.

Imports the inventory, the testing helpers' plugin registration and this package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hwplace.inventory.cluster import Cluster
from hwplace.testing import registered_plugin
from hwplace.testing.plugins import backend_plugin
from hwplace.testing.processes.executor import ProcessExecutor

PLUGIN_NAME = "hwplace-processes-executor"


@contextlib.contextmanager
def process_cluster(
    num_nodes: int = 2,
    accelerators_per_node: int | Sequence[int] = 4,
    *,
    cluster_cfg: Mapping[str, Any] | None = None,
    node_envs: Sequence[Mapping[str, str]] | None = None,
    inherit_env: bool = False,
    env_vars: Mapping[str, str] | None = None,
    job_name: str | None = None,
    preload: Sequence[str] | None = (),
) -> Iterator[Cluster]:
    """A cluster of ``num_nodes`` simulated nodes on this machine, each worker a process of its own; no Ray.

    Node ``i`` has ``HWPLACE_NODE_RANK=i`` and ``HWPLACE_FAKE_ACCELERATORS`` (``accelerators_per_node``: one
    count, or one per node) in the environment its detection and its workers see, plus ``env_vars``; or the
    environments of ``node_envs``; or (``inherit_env``, one node) this machine's own. ``cluster_cfg`` is the
    rest of the ``cluster:`` section (``component_placement``, ``node_groups``...). Workers fork from a zygote
    that imported hwplace's worker host and the modules ``preload`` names (``["torch"]``: each worker then starts
    without importing torch again), where a new interpreter would start the same; ``preload=None`` starts every
    worker as a new interpreter. The executor is
    registered as a plugin for the block; when the block ends, every worker process and server it started is
    stopped.
    """
    nodes = 1 if inherit_env else (len(node_envs) if node_envs is not None else num_nodes)
    executor = ProcessExecutor(nodes, accelerators_per_node, node_envs=node_envs, inherit_env=inherit_env,
                               env_vars=env_vars, preload=preload)
    try:
        with registered_plugin(backend_plugin(executor), name=PLUGIN_NAME):
            config = {"num_nodes": nodes, **(cluster_cfg or {}), "executor": executor.name}
            yield Cluster(config, job_name=job_name)
    finally:
        executor.shutdown()
