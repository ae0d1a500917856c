"""A throwaway multi-node Ray cluster on this machine, one raylet per node, each with the environment hwplace
gives it (its node rank, its fake accelerators): the Ray executor's :class:`hwplace.executor.LocalClusters`
capability, which ``hwplace run --nodes`` and :func:`hwplace.testing.local_ray_cluster` use.

Ray is imported when a cluster starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hwplace import ConfigError
from hwplace_plugins.ray.connect import check_token, init, own_sigterm

OBJECT_STORE_BYTES = 2**30  # each node's object store in a local cluster; Ray takes the memory as it is used


def _driver_paths() -> str:
    """The driver's import path outside its interpreter's own folders (test folders, a source checkout)."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths = [os.path.realpath(p or os.curdir) for p in sys.path]
    own = [p for p in paths if os.path.isdir(p) and not any(p == x or p.startswith(x + os.sep) for x in prefixes)]
    existing = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(dict.fromkeys([*own, *filter(None, existing.split(os.pathsep))]))


@contextlib.contextmanager
def local_ray_cluster(node_envs: Sequence[Mapping[str, str]], *, cpus_per_node: int = 1,
                      object_store_bytes: int = OBJECT_STORE_BYTES) -> Iterator[str]:
    """A real Ray cluster of one raylet per entry of ``node_envs`` (node ``i``'s environment), with this process
    connected to it; yields its address and stops every process it started when the block ends.

    Each node gets an object store of ``object_store_bytes`` (1 GiB: Ray's test clusters default to 150 MiB,
    where a 100 MB model's two versions no longer fit and every put spills to disk; the memory is taken only as
    it is used). Its workers can import what the driver imports from outside its environment (the folders
    pytest puts on ``sys.path``, a source checkout). Its files live in a private folder, so another process's
    ``ray.init()`` never finds it (Ray's "latest cluster on this machine" stays what ``ray start`` made).
    """
    import ray  # noqa: PLC0415 (optional: Ray, the executor's runtime)
    from ray.cluster_utils import Cluster as RayCluster  # noqa: PLC0415 (optional: Ray)

    if ray.is_initialized():
        raise ConfigError("local_ray_cluster", "this process is already connected to Ray",
                          allowed="call ray.shutdown() first, or use that cluster")
    check_token()  # its head would stop on a failed check inside Ray, and the start time out
    paths = _driver_paths()

    def node_args(rank: int) -> dict[str, Any]:
        env = {**node_envs[rank], "PYTHONPATH": paths}
        common_args = {"num_cpus": cpus_per_node, "env_vars": env, "object_store_memory": object_store_bytes}
        return {**common_args, "include_dashboard": False} if rank == 0 else common_args

    with _private_ray_folder() as folder:
        # Ray records the latest cluster started on a machine (``ray_current_cluster`` in its temp folder),
        # where another process's ray.init() looks: this one is recorded in its own folder, found by nobody.
        # A node started here takes SIGTERM for itself: the program keeps its own handler (own_sigterm).
        with _environment(RAY_TMPDIR=folder), own_sigterm():
            cluster = RayCluster(initialize_head=False)
            try:
                cluster.add_node(**node_args(0))
            except BaseException:
                cluster.shutdown()  # type: ignore[no-untyped-call]
                raise
        try:
            with own_sigterm():
                for rank in range(1, len(node_envs)):
                    _add_worker_node(cluster, node_args(rank))
                cluster.wait_for_nodes()
            init(ray, address=cluster.address)
            try:
                yield str(cluster.address)
            finally:
                ray.shutdown()
        finally:
            cluster.shutdown()  # type: ignore[no-untyped-call]


def _add_worker_node(cluster: Any, args: Mapping[str, Any]) -> None:
    """Add a node; if that fails (or is interrupted) midway, end the processes it had started: Ray tracks a
    node's processes only once the node is up, and ``cluster.shutdown()`` stops only those."""
    before = _children()
    try:
        cluster.add_node(**args)
    except BaseException:
        for pid in _children() - before:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        raise


def _children() -> set[int]:
    """The ids of this process's child processes now (Linux's ``/proc``; empty where there is none)."""
    found = set()
    me = str(os.getpid())
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rpartition(")")[2].split()
            except OSError:
                continue
            if len(fields) > 1 and fields[1] == me:
                found.add(int(entry))
    return found


@contextlib.contextmanager
def _private_ray_folder() -> Iterator[str]:
    """A folder of this process's own for a throwaway cluster's files, removed afterwards. It is short
    (``/tmp/hwplace-ray-*``): Ray's socket paths inside it must stay under the system's limit."""
    folder = tempfile.mkdtemp(prefix="hwplace-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
