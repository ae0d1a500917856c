"""RLinf (``pip install --no-deps rlinf==0.3.0``) as a baseline for the planning and launch benchmarks.

Only RLinf's public API is driven; nothing of it is copied here, and ``rlinf`` is imported on first use.

Planning (:func:`plan_seconds`): RLinf's ``rlinf.scheduler.ComponentPlacement(config, cluster)`` parses
``cluster.component_placement``, then ``get_strategy(name).get_placement(cluster)`` turns each component into its
per-process placements, which is what a worker-group launch consumes (hwplace builds those eagerly too). The cluster
is RLinf's own ``Cluster`` class with a planned inventory and no Ray: the object is made without running its
``__init__`` (which starts Ray) and given ``N`` ``NodeInfo`` records of ``gpus_per_node`` ``NV_GPU`` accelerators
plus the two node groups RLinf's node probe always builds (``cluster``, and ``node`` for node-only placement), the
way RLinf's own placement tests hand a fake cluster to ``ComponentPlacement``. RLinf's INFO logs are switched off
while timing (its f-string messages are still formatted, as in a real run).

Launch (:func:`launch_group_seconds`): ``Worker.create_group().launch(cluster, NodePlacementStrategy([0] * n),
name=...)``, then one no-op call on all ranks and ``.wait()``. RLinf's ``Cluster(num_nodes=1)`` refuses a Ray that
was started before it and would otherwise join any Ray cluster found on the machine (``address="auto"``), so on first
use it adopts the caller's Ray: ``Cluster.NAMESPACE`` is set to the caller's namespace and, while the ``Cluster`` is
built, ``ray.init`` is a no-op and ``ray.is_initialized`` reports False until that no-op ran. The cluster, its manager
actors and the no-op worker class are made once per process, outside the timings.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import statistics
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from types import ModuleType
from typing import Any
from unittest import mock

PIP_COMMAND = "pip install --no-deps rlinf==0.3.0"
_GROUP_COUNTER = itertools.count()
_state: dict[str, Any] = {}

RLINF_VERSION: str | None  # resolved on first access (importing rlinf imports torch: seconds)
RLINF_MISSING_REASON: str  # "" when rlinf imports


def _load() -> tuple[str | None, str]:
    if "version" not in _state:
        try:
            import rlinf.scheduler  # noqa: F401

            _state["version"], _state["reason"] = metadata.version("rlinf"), ""
        except Exception as exc:  # ImportError, or an import-time failure of one of its dependencies
            _state["version"] = None
            _state["reason"] = (f"rlinf cannot be imported ({type(exc).__name__}: {exc}); install it with "
                                f"`{PIP_COMMAND}` plus ray, torch and omegaconf")
    return _state["version"], _state["reason"]


def __getattr__(name: str) -> Any:
    if name == "RLINF_VERSION":
        return _load()[0]
    if name == "RLINF_MISSING_REASON":
        return _load()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _require() -> Any:
    version, reason = _load()
    if version is None:
        raise RuntimeError(reason)
    import rlinf.scheduler

    return rlinf.scheduler


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Drop INFO and lower log records (RLinf logs every placement list) for the duration."""
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(previous)


def _fake_cluster(num_nodes: int, gpus_per_node: int) -> Any:
    """RLinf's ``Cluster`` object holding a planned inventory, without Ray."""
    sched = _require()
    from rlinf.scheduler.cluster import NodeGroupInfo, NodeInfo
    from rlinf.scheduler.hardware import Accelerator, HardwareInfo, HardwareResource

    nodes = []
    for rank in range(num_nodes):
        gpus = [HardwareInfo(type=Accelerator.HW_TYPE, model="NV_GPU:planned") for _ in range(gpus_per_node)]
        nodes.append(NodeInfo(
            node_labels=[], node_rank=rank, ray_id=f"planned-{rank}", node_ip=f"planned-{rank}", num_cpus=0,
            python_interpreter_path=sys.executable, default_env_vars={}, env_vars={},
            hardware_resources=[HardwareResource(type=Accelerator.HW_TYPE, infos=gpus)] if gpus else [],
        ))
    cluster = object.__new__(sched.Cluster)  # not Cluster(): its __new__ keeps a singleton, its __init__ starts Ray
    cluster._num_nodes = num_nodes
    cluster._nodes = nodes
    cluster._cluster_cfg = None
    cluster._node_groups = [
        NodeGroupInfo(label=NodeGroupInfo.DEFAULT_GROUP_LABEL, nodes=nodes),
        NodeGroupInfo(label=NodeGroupInfo.NODE_PLACEMENT_GROUP_LABEL, nodes=nodes, ignore_hardware=True),
    ]
    return cluster


def plan_seconds(num_nodes: int, gpus_per_node: int, component_placement: dict[str, Any], repeat: int,
                 *, placements: bool = True) -> tuple[float, int]:
    """Median seconds for RLinf to plan ``component_placement`` on ``num_nodes`` x ``gpus_per_node`` GPUs.

    Also returns the number of processes planned. With ``placements=False`` only ``ComponentPlacement`` is built
    (parsing and strategy choice; the count is then the sum of world sizes), not the per-process placements.
    """
    sched = _require()
    from omegaconf import OmegaConf

    config = OmegaConf.create({"cluster": {"num_nodes": num_nodes, "component_placement": component_placement}})
    cluster = _fake_cluster(num_nodes, gpus_per_node)
    times: list[float] = []
    processes = 0
    with _quiet():
        for _ in range(max(1, repeat)):
            start = time.perf_counter()
            plan = sched.ComponentPlacement(config, cluster)
            if placements:
                processes = sum(len(plan.get_strategy(name).get_placement(cluster)) for name in plan.components)
            else:
                processes = sum(plan.get_world_size(name) for name in plan.components)
            times.append(time.perf_counter() - start)
    return statistics.median(times), processes


def _noop_worker_cls() -> Any:
    """The no-op Worker subclass, defined in a function so Ray ships it by value to the workers."""
    if "worker_cls" not in _state:
        sched = _require()

        class NoopWorker(sched.Worker):  # type: ignore[misc, name-defined]
            def noop(self) -> None:
                """Answer and do nothing."""

        _state["worker_cls"] = NoopWorker
    return _state["worker_cls"]


@contextlib.contextmanager
def _adopt_running_ray(ray: ModuleType) -> Iterator[None]:
    """Let RLinf's ``Cluster`` start on a Ray the caller already initialised."""
    real_is_initialized = ray.is_initialized
    called: list[bool] = []

    def init(*_args: object, **_kwargs: object) -> None:
        called.append(True)

    def is_initialized() -> bool:
        return bool(called) and real_is_initialized()

    with mock.patch.object(ray, "init", init), mock.patch.object(ray, "is_initialized", is_initialized):
        yield


def _local_cluster() -> Any:
    """RLinf's one-node ``Cluster`` on the caller's Ray, made once and waited for (managers up)."""
    sched = _require()
    import ray

    if not ray.is_initialized():
        raise RuntimeError("launch_group_seconds needs Ray: call ray.init() first")
    job = ray.get_runtime_context().get_job_id()
    if "cluster" in _state:
        if _state["job"] != job:
            raise RuntimeError("RLinf's Cluster is a per-process singleton: it cannot follow a restarted Ray")
        return _state["cluster"]
    from rlinf.scheduler.manager import (
        CollectiveManager,
        DeviceLockManager,
        NodeManager,
        PortLockManager,
        WorkerManager,
    )

    with _quiet():
        if sched.Cluster.has_initialized():  # the caller built RLinf's Cluster (and so its Ray) already
            cluster = sched.Cluster()
        else:
            sched.Cluster.NAMESPACE = ray.get_runtime_context().namespace
            with _adopt_running_ray(ray):
                cluster = sched.Cluster(num_nodes=1)
        managers = (WorkerManager, CollectiveManager, NodeManager, DeviceLockManager, PortLockManager)
        ray.get([ray.get_actor(m.MANAGER_NAME, namespace=sched.Cluster.NAMESPACE).__ray_ready__.remote()
                 for m in managers])
    _state["cluster"], _state["job"] = cluster, job
    return cluster


def _shut_down(group: Any, timeout: float = 60.0) -> None:
    """Kill every worker of ``group`` and wait until Ray reports each one dead."""
    import ray

    handles = [info.worker for info in group.worker_info_list]
    for handle in handles:
        ray.kill(handle, no_restart=True)
    for handle in handles:
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            ray.get(handle.__ray_ready__.remote(), timeout=timeout)


def launch_group_seconds(n: int) -> float:
    """Seconds to launch an RLinf group of ``n`` no-op workers on the initialised local Ray, until all answered once.

    The group is shut down (workers killed and confirmed dead) after the timing.
    """
    sched = _require()
    cluster = _local_cluster()
    worker_cls = _noop_worker_cls()
    name = f"hwplace_bench_{os.getpid()}_{next(_GROUP_COUNTER)}"
    with _quiet():
        start = time.perf_counter()
        group = worker_cls.create_group().launch(
            cluster, placement_strategy=sched.NodePlacementStrategy([0] * n), name=name)
        answers = group.noop().wait()
        seconds = time.perf_counter() - start
    try:
        if len(answers) != n:
            raise RuntimeError(f"RLinf group {name}: {len(answers)} of {n} workers answered")
    finally:
        _shut_down(group)
    return seconds


# Channel adapter (for benchmarks/channel_throughput.py): RLinf's Channel driven through its public API, on the
# same adopted local cluster as the launch benchmark.


def worker_base() -> type:
    """RLinf's ``Worker`` class, to subclass (RuntimeError with the missing reason when RLinf does not import)."""
    return _require().Worker  # type: ignore[no-any-return]


def launch_worker(worker_cls: Any, name: str) -> Any:
    """A launched RLinf group of one ``worker_cls`` on node 0 of the local cluster (adopting the caller's Ray)."""
    sched = _require()
    cluster = _local_cluster()
    with _quiet():
        return worker_cls.create_group().launch(cluster, placement_strategy=sched.NodePlacementStrategy([0]),
                                                name=name)


def create_channel(name: str) -> Any:
    """RLinf's ``Channel.create(name)`` (unbounded, one channel worker on node 0), made from the driver."""
    sched = _require()
    _local_cluster()
    with _quiet():
        return sched.Channel.create(name)


def shut_down(group: Any) -> None:
    """Kill every worker of an RLinf ``group`` and wait until Ray reports each one dead."""
    _shut_down(group)
