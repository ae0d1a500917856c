"""Worker groups: launching one process per placement through the cluster's executor, and calling them."""

from __future__ import annotations

import re
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hwplace.config.records import NodeGroup
from hwplace.config.restart import Restart
from hwplace.contracts.capabilities import Leases, Restarts, TurnArbitration, require
from hwplace.contracts.executor import GroupRequest, GroupRuntime, Handle, WorkerSpec
from hwplace.contracts.records import Placement
from hwplace.contracts.registry import IDENTITY_PROPERTIES, DeviceLease, GroupRecord, WorkerRecord
from hwplace.foundation.errors import ConfigError, PlacementError, WorkerError
from hwplace.foundation.settings import trace_env
from hwplace.foundation.wording import did_you_mean, plural, safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.planning.sharing import shared_accelerators
from hwplace.planning.strategies import PlacementStrategy
from hwplace.plugin.session import session
from hwplace.runtime.restarts import RankStatus, Supervisor

GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}\Z")
PROGRESS_FROM = 8  # groups of at least this many workers show launch progress on a terminal


def torch_env(placement: Placement, world_size: int, master_addr: str, master_port: int) -> dict[str, str]:
    """The torch.distributed variables of one worker.

    ``LOCAL_RANK`` is the index of the worker's first own accelerator among the accelerators it sees, so
    ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` picks its own device whether or not it is
    isolated; a worker without accelerators gets its index among the group's processes on its node.
    """
    local_rank = placement.local_rank
    if placement.local_accelerator_id in placement.visible_accelerators:
        local_rank = placement.visible_accelerators.index(placement.local_accelerator_id)
    return {
        "RANK": str(placement.rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(placement.local_world_size),
        "NODE_RANK": str(placement.node_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def worker_specs(
    cluster: Cluster, placements: Sequence[Placement], master_port: int, groups: Mapping[str, NodeGroup] | None = None
) -> list[WorkerSpec]:
    """What each worker starts with: its group's ``env_configs`` and interpreter, isolation and torch variables.

    ``groups`` are the node groups the placements came from, by label (a strategy may hold groups of its
    own); a label not among them is looked up in the cluster's config.
    """
    master_addr = cluster.nodes[placements[0].node_rank].address
    specs = []
    for placement in placements:
        group = (groups or {}).get(placement.node_group) or cluster.config.group(placement.node_group)
        process_env = group.env_vars(placement.node_rank)
        python = group.python_interpreter_path(placement.node_rank)
        env = {**process_env, **placement.env, **torch_env(placement, len(placements), master_addr, master_port),
               **trace_env()}
        specs.append(WorkerSpec(placement, cluster.nodes[placement.node_rank], env, process_env, python))
    return specs


def group_record(cluster: Cluster, name: str, worker_class: type, placements: Sequence[Placement]) -> GroupRecord:
    """What the cluster's registry keeps of a group: its workers and the devices they lease.

    Accelerators and devices are leased; a node-kind resource (a whole node, shared by any number of
    processes) is not. A device leased by several ranks of the group is one lease naming them all.
    """
    leases: dict[tuple[str, str, str], DeviceLease] = {}
    workers = []
    for p in placements:
        node = cluster.nodes[p.node_rank]
        workers.append(WorkerRecord(p.rank, p.node_rank, p.node_id, node.address,
                                    f"{p.hardware_type} {','.join(map(str, p.local_hardware_ranks))}"))
        if cluster.kind(p.hardware_type) not in ("accelerator", "device"):
            continue
        for index in p.local_hardware_ranks:
            found = [d for d in node.devices(p.hardware_type) if d.index == index]
            properties = found[0].properties if found else {}
            identity = next((f"{k}={properties[k]}" for k in IDENTITY_PROPERTIES if k in properties), f"index={index}")
            lease = DeviceLease(p.hardware_type, index, identity, p.node_id, p.node_rank, node.address, (p.rank,))
            held = leases.setdefault(lease.key, lease)
            if held is not lease:
                leases[lease.key] = replace(held, ranks=(*held.ranks, p.rank))
    return GroupRecord(cluster.job_name, name, f"{worker_class.__module__}.{worker_class.__qualname__}",
                       tuple(workers), tuple(leases.values()))


class GroupLauncher:
    """A worker class and its constructor arguments, ready to ``launch`` as a group."""

    def __init__(self, worker_class: type[Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        self.worker_class = worker_class
        self.args = args
        self.kwargs = dict(kwargs)

    def launch(
        self,
        cluster: Cluster,
        placement_strategy: PlacementStrategy,
        name: str,
        isolate_accelerator: bool = True,
        restart: Restart | None = None,
    ) -> WorkerGroup:
        """Start one worker per placement of ``placement_strategy`` on ``cluster``; returns when all are constructed.

        ``restart`` (a :class:`hwplace.Restart`) starts a worker whose process dies again in place, on the same
        node and devices, while restarts are left (SPEC §12). A name in use is a ``ConfigError``; a device
        (accelerator, robot) that a group of another live job on the cluster holds is a ``PlacementError`` naming
        it, its node and the holder; a constructor that raises makes this raise ``WorkerError`` with its rank and
        traceback, after stopping the group's other workers.
        """
        if not isinstance(cluster, Cluster):
            raise ConfigError("cluster", f"{safe_repr(cluster)} is not a hwplace.Cluster")
        if not isinstance(placement_strategy, PlacementStrategy):
            raise PlacementError(f"placement_strategy must be a hwplace placement strategy (for example "
                                 f"ComponentPlacement.get_strategy(name)), got {safe_repr(placement_strategy)}")
        if not isinstance(name, str) or not GROUP_NAME.match(name):
            raise ConfigError("name", f"{safe_repr(name)} is not a usable group name",
                              allowed="1 to 100 letters, digits, '_', '.' and '-', starting with a letter or digit")
        if restart is not None and not isinstance(restart, Restart):
            raise ConfigError("restart", f"{safe_repr(restart)} is not a restart policy",
                              allowed="hwplace.Restart(max_restarts=3, scope='rank'), or None")
        executor = cluster.executor()
        leases = require(executor, Leases, f"launching group {name!r}")
        if restart is not None and restart.max_restarts:
            require(executor, Restarts, f"launching group {name!r} with restarts")
        watcher = executor if isinstance(executor, Restarts) else None  # status() shows deaths with or without
        placements = placement_strategy.get_placement(cluster, isolate_accelerator)
        if not placements:
            raise PlacementError(f"group {name!r}: the strategy places no process")
        launched: weakref.WeakKeyDictionary[Any, dict[str, tuple[Placement, ...]]] = session().state(
            "launched groups", weakref.WeakKeyDictionary)
        running = launched.setdefault(executor, {})  # this driver's running groups on that executor
        if not isinstance(executor, TurnArbitration) and shared_accelerators({**running, name: tuple(placements)}):
            require(executor, TurnArbitration, f"launching group {name!r}, which shares accelerators with "
                    f"{', '.join(running)}")
        port = executor.free_port(cluster.nodes[placements[0].node_rank])
        groups = {g.label: g for g in placement_strategy.groups(cluster)}
        specs = worker_specs(cluster, placements, port, groups)
        record = group_record(cluster, name, self.worker_class, placements)
        leases.register_group(record)
        try:
            runtime = executor.start_group(GroupRequest(name, self.worker_class, self.args, self.kwargs, specs))
        except BaseException:
            leases.deregister_group(name)
            raise
        try:
            _wait_ready(runtime.ready(), name, len(specs))
        except BaseException:
            runtime.shutdown()
            leases.deregister_group(name)
            raise
        running[name] = tuple(placements)
        def changed(ranks: list[RankStatus]) -> None:
            leases.update_workers(name, [replace(w, state=s.state, restarts=s.restarts, cause=s.cause)
                                         for w, s in zip(record.workers, ranks, strict=True)])

        supervisor = Supervisor(name, placements, restart, watcher, runtime, changed)
        supervisor.start()

        def release() -> None:
            running.pop(name, None)
            leases.deregister_group(name)

        return WorkerGroup(name, self.worker_class, tuple(placements), runtime, release=release, supervisor=supervisor)


def _wait_ready(handle: Handle, name: str, count: int) -> None:
    if count < PROGRESS_FROM or not sys.stderr.isatty():
        handle.wait()
        return
    start = time.monotonic()
    while True:
        try:
            handle.wait(timeout=0.25)
        except TimeoutError:
            sys.stderr.write(f"\rhwplace: launching group {name!r}: {handle.num_done}/{count} workers ready "
                             f"({time.monotonic() - start:.0f} s)")
            sys.stderr.flush()
            continue
        except WorkerError:
            sys.stderr.write("\n")
            raise
        sys.stderr.write(f"\rhwplace: launched group {name!r}: {count}/{count} workers ready "
                         f"({time.monotonic() - start:.1f} s)\n")
        return


class WorkerGroup:
    """The running workers of one group. ``group.method(*args)`` calls ``method`` on every worker.

    The call returns a :class:`hwplace.executor.Handle` at once; ``.wait()`` gives one result per rank, in
    rank order. ``execute_on(*ranks)`` narrows the next calls to some ranks.
    """

    def __init__(
        self,
        name: str,
        worker_class: type[Any],
        placements: tuple[Placement, ...],
        runtime: GroupRuntime,
        ranks: tuple[int, ...] | None = None,
        release: Callable[[], None] | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.name = name
        self._supervisor = supervisor or Supervisor(name, placements, None, None, runtime)
        self.worker_class = worker_class
        self.placements = placements
        self._runtime = runtime
        self._release = release  # ends the group's device leases, after its workers stop
        self.ranks: tuple[int, ...] = tuple(range(len(placements))) if ranks is None else ranks
        self._closed: list[bool] = [False]  # shared with the views execute_on returns

    @property
    def world_size(self) -> int:
        return len(self.placements)

    def execute_on(self, *ranks: int) -> WorkerGroup:
        """This group, calling only ``ranks`` (in the order given)."""
        if not ranks:
            raise WorkerError("execute_on needs at least one rank", group=self.name)
        for rank in ranks:
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
                raise WorkerError(f"execute_on got rank {safe_repr(rank)}; the group has ranks "
                                  f"0-{self.world_size - 1}", group=self.name)
        view = WorkerGroup(self.name, self.worker_class, self.placements, self._runtime, tuple(ranks), self._release,
                           self._supervisor)
        view._closed = self._closed
        return view

    def __getattr__(self, method: str) -> Callable[..., Handle]:
        if method.startswith("_"):
            raise AttributeError(method)
        target = getattr(self.worker_class, method, None)
        if not callable(target):
            public = [m for m in dir(self.worker_class)
                      if not m.startswith("_") and callable(getattr(self.worker_class, m, None))]
            raise AttributeError(f"{self.worker_class.__name__} has no method {method!r}"
                                 f"{did_you_mean(method, public)}")

        def call(*args: Any, **kwargs: Any) -> Handle:
            if self._closed[0]:
                raise WorkerError(f"cannot call {method!r}: the group was shut down", group=self.name)
            failure = self._supervisor.failure
            if failure is not None:
                raise WorkerError(f"cannot call {method!r}: {failure.problem}", group=self.name, rank=failure.rank,
                                  node_rank=failure.node_rank)
            return self._runtime.call(self.ranks, method, args, kwargs)

        call.__name__ = method
        return call

    def status(self) -> list[RankStatus]:
        """Each rank's state (``serving``, ``restarting`` or ``dead``), the restarts it used and its last death's
        cause, in rank order (of every rank, whatever ``execute_on`` narrowed)."""
        return self._supervisor.status()

    def shutdown(self) -> None:
        """Stop every worker of the group (calls in flight fail), free its name and end its device leases; a
        second call does nothing."""
        if not self._closed[0]:
            self._closed[0] = True
            self._supervisor.close()
            try:
                self._runtime.shutdown()
            finally:
                if self._release is not None:
                    self._release()

    def __repr__(self) -> str:
        state = "shut down" if self._closed[0] else "running"
        return f"<WorkerGroup {self.name!r}: {plural(self.world_size, 'worker')} of " \
               f"{self.worker_class.__name__}, {state}>"

