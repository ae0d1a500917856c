"""A group's worker processes, and the handles of calls on them, as the driver of a process cluster holds them.

The results of a call come back in rank order; the first rank that failed is raised as a ``WorkerError``
worded as the Ray executor words it (``"... failed: the worker process has died (node 1 is 127.0.0.1, ...)"``).
Imports the contracts, the foundation, the runtime's hosting records and this package.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from hwplace.contracts.executor import GroupRequest, GroupRuntime, Handle
from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import CallCancelled, HwplaceError, WorkerError
from hwplace.foundation.timeouts import wait_timeout
from hwplace.runtime.hosting import unpicklable_arguments
from hwplace.runtime.restarts import Incarnations
from hwplace.testing.processes.forked import Zygote
from hwplace.testing.processes.service import HubService
from hwplace.testing.processes.wire import dumps
from hwplace.testing.processes.workers import Outcome, WorkerProcess

EXECUTOR_NAME = "processes"


@contextlib.contextmanager
def _pickled(group: str, ranks: Sequence[int], what: str, args: tuple[Any, ...],
             kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Turn a failure to pickle a call's arguments into a WorkerError naming the argument and its type."""
    try:
        yield
    except Exception as exc:
        raise unpicklable_arguments(what, group, ranks, args, kwargs, dumps, exc) from None


def _main_path(worker_class: type) -> str | None:
    """The driver script's path when ``worker_class`` is defined in it (the worker loads it to find the class)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return path if worker_class.__module__ == "__main__" and isinstance(path, str) and os.path.isfile(path) else None


class ProcessGroupRuntime(GroupRuntime):
    """The worker processes of one group, in rank order."""

    def __init__(self, request: GroupRequest, service: HubService, authkey: bytes,
                 node_envs: Sequence[Mapping[str, str]], executor: Any, release: Callable[[str], None],
                 zygote: Zygote | None = None) -> None:
        self.name = request.name
        self.worker_class = request.worker_class
        self.specs = tuple(request.workers)
        self._release = release
        self._ids = itertools.count(1)
        self._service, self._authkey, self._node_envs, self._executor = service, authkey, node_envs, executor
        self._zygote = zygote
        self._args, self._kwargs = request.args, dict(request.kwargs)
        self.incarnations = Incarnations(len(self.specs))
        self._replacing = threading.Lock()  # held while a restart replaces processes: see _targets
        with _pickled(self.name, range(len(self.specs)), "the constructor", (request.worker_class, *request.args),
                      request.kwargs):
            self._payload, self._main = dumps(request.worker_class), _main_path(request.worker_class)
            starts = [self._start_message(rank) for rank in range(len(self.specs))]
        self.workers = [self._process(rank, start) for rank, start in enumerate(starts)]

    def _start_message(self, rank: int, attempt: int = 0, cause: str = "") -> bytes:
        spec = self.specs[rank]
        context = WorkerContext(self.name, rank, len(self.specs), spec.placement, dict(spec.env), EXECUTOR_NAME,
                                attempt, cause)
        return dumps(("start", self._payload, self._main, context, self._args, self._kwargs, self._executor))

    def _process(self, rank: int, start: bytes) -> WorkerProcess:
        spec = self.specs[rank]
        incarnation = self.incarnations.current(rank)

        def exited(why: str) -> None:
            self.incarnations.died(rank, incarnation, self._death(rank, why))

        return WorkerProcess(self._service, self._authkey, spec.python_interpreter_path,
                             self._node_envs[spec.node.rank], spec.process_env, start, exited, self._zygote)

    def _death(self, rank: int, why: str) -> str:
        spec = self.specs[rank]
        return f"the worker process died (node {spec.placement.node_rank} is {spec.node.address}, simulated node " \
               f"{spec.node.node_id}): {why}"

    def watch(self, on_death: Callable[[int, str], bool]) -> None:
        """Report each death of a current worker process to ``on_death`` (see ``Restarts.watch``)."""
        self.incarnations.watch(on_death)
        for rank, worker in enumerate(self.workers):
            if worker.exited is not None:  # died before the watch began
                self.incarnations.died(rank, self.incarnations.current(rank), self._death(rank, worker.exited))

    def restart(self, ranks: Sequence[int], attempt: int, cause: str) -> Handle:
        """Start ``ranks`` again in place (see ``Restarts.restart``); a handle on their constructors."""
        with self._replacing:
            for rank in ranks:
                self.incarnations.replace(rank)
                old = self.workers[rank]
                old.tell_stop("it was stopped to restart its group")
                old.kill()
                self.workers[rank] = self._process(rank, self._start_message(rank, attempt, cause))
        targets = self._targets(ranks)
        return ProcessHandle(self, tuple(ranks), [w.ready for w, _ in targets], targets, 0, "the constructor")

    def _targets(self, ranks: Sequence[int]) -> list[tuple[WorkerProcess, int]]:
        """Each rank's current process and its incarnation, read together: a restart numbers the new process
        before it starts it, so a call read in between would reach the old process and blame the new one."""
        with self._replacing:
            return [(self.workers[r], self.incarnations.current(r)) for r in ranks]

    def ready(self) -> Handle:
        targets = self._targets(range(len(self.specs)))
        return ProcessHandle(self, tuple(range(len(self.specs))), [w.ready for w, _ in targets], targets, 0,
                             "the constructor")

    def call(self, ranks: Sequence[int], method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Handle:
        call_id = next(self._ids)
        with _pickled(self.name, ranks, f"{method}()", args, kwargs):
            message = dumps(("call", call_id, method, args, dict(kwargs)))  # pickled once for every rank
        targets = self._targets(ranks)
        futures = [worker.call(call_id, message) for worker, _ in targets]
        interruptible = inspect.iscoroutinefunction(getattr(self.worker_class, method, None))
        return ProcessHandle(self, tuple(ranks), futures, targets, call_id, f"{method}()", interruptible)

    def shutdown(self) -> None:
        self.incarnations.close()
        for worker in self.workers:
            worker.tell_stop()
        for worker in self.workers:
            worker.wait_stopped()
        self._release(self.name)

    def failure(self, rank: int, what: str, outcome: Outcome, incarnation: int = 0) -> HwplaceError | None:
        """The error an outcome of ``rank`` (its process ``incarnation``) stands for, or ``None`` for a result."""
        kind = outcome[0]
        spec = self.specs[rank]
        node_rank = spec.placement.node_rank
        if kind == "value":
            return None
        if kind == "failure":
            return outcome[1].error(what, group=self.name, rank=rank, node_rank=node_rank)  # type: ignore[no-any-return]
        if kind == "cancelled":
            return CallCancelled(f"group {self.name!r} rank {rank} on node {node_rank}: {what} was cancelled")
        if kind == "unpicklable":
            return WorkerError(f"{what} returned a value that cannot be pickled ({outcome[1]}); return plain data, "
                               "arrays, tensors or objects that pickle", group=self.name, rank=rank,
                               node_rank=node_rank)
        restarted = self.incarnations.died(rank, incarnation, self._death(rank, outcome[1]))
        return WorkerError(f"{what} failed: the worker process has died (node {node_rank} is {spec.node.address}, "
                           f"simulated node {spec.node.node_id}): {outcome[1]}"
                           f"{'; it is being restarted' if restarted else ''}", group=self.name, rank=rank,
                           node_rank=node_rank, restarted=restarted)


class ProcessHandle(Handle):
    """Results of one call on some ranks of a group, gathered as they arrive; the first failure is raised."""

    def __init__(self, runtime: ProcessGroupRuntime, ranks: tuple[int, ...],
                 futures: list[concurrent.futures.Future[Outcome]], targets: list[tuple[WorkerProcess, int]],
                 call_id: int, what: str, interruptible: bool = False) -> None:
        self._runtime = runtime
        self._ranks = ranks
        self._workers = [worker for worker, _ in targets]  # the processes called: a cancel reaches these, not
        self._incarnations = [incarnation for _, incarnation in targets]  # their successors; a death is theirs
        self._futures = futures
        self._call_id = call_id
        self._what = what
        self._interruptible = interruptible
        self._cancelled = False  # once cancelled, every rank ends soon: wait reports them in rank order

    def _raise_failures(self) -> None:
        for rank, future, incarnation in zip(self._ranks, self._futures, self._incarnations, strict=True):
            if future.done():
                error = self._runtime.failure(rank, self._what, future.result(), incarnation)
                if error is not None:
                    raise error

    def _results(self) -> list[Any]:
        return [future.result()[1] for future in self._futures]

    def wait(self, timeout: float | None = None) -> list[Any]:
        timeout = wait_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        pending = [f for f in self._futures if not f.done()]
        if self._cancelled and pending:  # every rank ends soon: report them in rank order, not arrival order
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            concurrent.futures.wait(pending, remaining)
        while True:
            self._raise_failures()
            pending = [f for f in self._futures if not f.done()]
            if not pending:
                return self._results()
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            finished, _ = concurrent.futures.wait(pending, remaining, return_when=concurrent.futures.FIRST_COMPLETED)
            if not finished:
                self._raise_failures()
                waiting = [r for r, f in zip(self._ranks, self._futures, strict=True) if not f.done()]
                raise TimeoutError(f"group {self._runtime.name!r}: {self._what} did not finish within {timeout:g} s "
                                   f"on ranks {waiting}; it goes on running")

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    @property
    def num_done(self) -> int:
        return sum(f.done() for f in self._futures)

    async def wait_async(self) -> list[Any]:
        async def one(rank: int, future: concurrent.futures.Future[Outcome], incarnation: int) -> None:
            error = self._runtime.failure(rank, self._what, await asyncio.wrap_future(future), incarnation)
            if error is not None:
                raise error

        await asyncio.gather(*(one(r, f, i) for r, f, i in zip(self._ranks, self._futures, self._incarnations,
                                                                  strict=True)))
        self._raise_failures()
        return self._results()

    def cancel(self, force: bool = False) -> bool:
        running = [worker for worker, f in zip(self._workers, self._futures, strict=True) if not f.done()]
        if not running:
            return False
        self._cancelled = True
        if self._interruptible:  # an async method: its task in the worker is cancelled
            for worker in running:
                worker.cancel(self._call_id)
            return True
        if not force:
            return False
        for worker in running:  # a plain method: only ending its process stops it
            worker.kill()
        return True

    def __repr__(self) -> str:
        return f"<ProcessHandle {self._runtime.name!r} {self._what} on {len(self._futures)} ranks>"
