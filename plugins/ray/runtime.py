"""A group's workers as Ray actors, and the handles of calls on them: the driver's side.

Each worker process hosts one :class:`~hwplace_plugins.ray.host.WorkerHost` actor (its own module, so that a
worker process does not import this one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import os
import queue
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pickle import PicklingError
from typing import Any

import ray
from ray import cloudpickle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hwplace import CallCancelled, HwplaceError, WorkerError
from hwplace.executor import (
    GroupRequest,
    GroupRuntime,
    Handle,
    Incarnations,
    RemoteFailure,
    WorkerContext,
    WorkerSpec,
    first_line,
    unpicklable_arguments,
    wait_timeout,
)
from hwplace_plugins.ray.host import Cancelled, Returned


def _unwrapped(value: Any) -> Any:
    return value.value if isinstance(value, Returned) else value


def _actor_options(spec: WorkerSpec) -> dict[str, Any]:
    options: dict[str, Any] = {"scheduling_strategy": NodeAffinitySchedulingStrategy(spec.node.node_id, soft=False)}
    runtime_env: dict[str, Any] = {}
    if spec.process_env:
        runtime_env["env_vars"] = dict(spec.process_env)
    if spec.python_interpreter_path:
        runtime_env["py_executable"] = spec.python_interpreter_path
    if runtime_env:
        options["runtime_env"] = runtime_env
    return options


class Raised:
    """What ``ray.get`` raised for a call, kept apart from what the call returned (a method may return an
    exception object, even one of Ray's, as its value)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def session() -> str:
    """The Ray session this driver is in now (its job id), or ``""`` after ``ray.shutdown()``."""
    return ray.get_runtime_context().get_job_id() if ray.is_initialized() else ""


class RayGroupRuntime(GroupRuntime):
    """The actors of one group, in rank order, in the Ray session that started them."""

    def __init__(self, request: GroupRequest, host: Any, release: Callable[[str, bool], None]) -> None:
        self.session = session()
        self.name = request.name
        self.worker_class = request.worker_class
        self.specs = tuple(request.workers)
        self._release = release
        payload = cloudpickle.dumps(request.worker_class)  # type: ignore[no-untyped-call]
        shared = (payload, request.args, dict(request.kwargs))  # kept: restarts construct again
        self._host = host
        self.incarnations = Incarnations(len(self.specs))
        self._restart_lock = threading.RLock()  # a restart reads its targets under it
        self._deaths: queue.SimpleQueue[tuple[int, int, concurrent.futures.Future[Any]] | None] = queue.SimpleQueue()
        with _pickled(self.name, range(len(self.specs)), "the constructor", request.args, request.kwargs):
            # bulky: in the object store once for all ranks; else with each actor's creation, which saves each new
            # process a fetch from the store
            bulky = _bulky((payload, *request.args, *request.kwargs.values()))
            self._shared: Any = ray.put(shared) if bulky else shared
            self.actors = [self._start(rank) for rank in range(len(self.specs))]

    def _start(self, rank: int, attempt: int = 0, cause: str = "") -> Any:
        spec = self.specs[rank]
        context = WorkerContext(self.name, rank, len(self.specs), spec.placement, dict(spec.env), "ray", attempt, cause)
        return self._host.options(**_actor_options(spec)).remote(self._shared, context)

    def watch(self, on_death: Callable[[int, str], bool]) -> None:
        """Report each death of a current worker process to ``on_death`` (see ``Restarts.watch``).

        Each actor has a call pending that never returns (``WorkerHost.watch``); Ray completes its future, from a
        thread of its own, the moment the actor dies. A thread of this runtime takes those from a queue: nothing
        of hwplace waits inside Ray, so ``ray.shutdown()`` meanwhile cannot catch a wait in Ray's core worker.
        """
        self.incarnations.watch(on_death)
        threading.Thread(target=self._watch, name=f"hwplace-watch-{self.name}", daemon=True).start()
        with self._restart_lock:
            for rank, actor in enumerate(self.actors):
                self._watch_actor(rank, self.incarnations.current(rank), actor)

    def _watch_actor(self, rank: int, incarnation: int, actor: Any) -> None:
        future = actor.watch.remote().future()
        future.add_done_callback(lambda done: self._deaths.put((rank, incarnation, done)))

    def _watch(self) -> None:
        while True:
            item = self._deaths.get()
            if item is None or session() != self.session:  # shut down, or the Ray session ended
                return
            rank, incarnation, done = item
            try:
                done.result()
                cause = "its watch ended"
            except Exception as exc:
                cause = self._death(rank, exc)
            self.incarnations.died(rank, incarnation, cause)

    def _death(self, rank: int, error: BaseException) -> str:
        node = self.specs[rank].node
        return f"the worker process died (node {node.rank} is {node.address}, Ray node {node.node_id[:12]}): " \
               f"{first_line(error)}"

    def restart(self, ranks: Sequence[int], attempt: int, cause: str) -> Handle:
        """Start ``ranks`` again in place (see ``Restarts.restart``); a handle on their constructors."""
        self.check_session("restarting the group")
        with self._restart_lock:
            for rank in ranks:
                incarnation = self.incarnations.replace(rank)
                with contextlib.suppress(ray.exceptions.RayError, ValueError):
                    ray.kill(self.actors[rank], no_restart=True)
                self.actors[rank] = self._start(rank, attempt, cause)
                self._watch_actor(rank, incarnation, self.actors[rank])
            targets = self._targets(ranks)  # the constructors are sent before any call can reach the new
            refs = [actor.ready.remote() for actor, _ in targets]  # processes: an actor runs its calls in order
        return RayHandle(self, tuple(ranks), refs, targets, "the constructor")

    def _targets(self, ranks: Sequence[int]) -> list[tuple[Any, int]]:
        """Each rank's current process and its incarnation, read together: a restart numbers the new process
        before it starts it, so a call read in between would reach the old process and blame the new one."""
        with self._restart_lock:
            return [(self.actors[r], self.incarnations.current(r)) for r in ranks]

    def check_session(self, what: str) -> None:
        """Refuse to go on once the Ray session the group ran in has ended: calling Ray then would raise Ray's
        own errors, or silently start (or join) another Ray where none of the workers are."""
        if session() != self.session:
            raise WorkerError(f"{what}: the Ray session the group ran in has ended (ray.shutdown() was called, or "
                              "the driver joined another cluster since) and its workers with it; launch the group "
                              "again", group=self.name)

    def ready(self) -> Handle:
        self.check_session("the constructor")
        targets = self._targets(range(len(self.specs)))
        return RayHandle(self, tuple(range(len(self.specs))), [a.ready.remote() for a, _ in targets], targets,
                         "the constructor")

    def call(self, ranks: Sequence[int], method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Handle:
        self.check_session(f"{method}()")
        sent: tuple[Any, Any] = (args, kwargs)
        targets = self._targets(ranks)
        with _pickled(self.name, ranks, f"{method}()", args, kwargs):
            if len(ranks) > 1 and _bulky((*args, *kwargs.values())):
                sent = (ray.put(args), ray.put(kwargs))  # serialised once, not once per rank; Ray resolves them
            if inspect.iscoroutinefunction(getattr(self.worker_class, method, None)):  # run on the host's loop
                call = os.urandom(8).hex()  # what cancel() names it by
                refs = [actor.call_async.remote(call, method, *sent) for actor, _ in targets]
            else:
                call, refs = "", [actor.call.remote(method, *sent) for actor, _ in targets]
        return RayHandle(self, tuple(ranks), refs, targets, f"{method}()", call)

    def shutdown(self) -> None:
        self.incarnations.close()
        self._deaths.put(None)
        ended = session() != self.session  # then the workers ended with their session
        if not ended:
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            self._warn_of_dead_nodes()
        self._release(self.name, ended)

    def _warn_of_dead_nodes(self) -> None:
        """Say which workers Ray could not stop: those of a node whose raylet is gone."""
        dead = {n["NodeID"] for n in ray.nodes() if not n.get("Alive")}  # type: ignore[no-untyped-call]
        lost = [(rank, spec.node) for rank, spec in enumerate(self.specs) if spec.node.node_id in dead]
        if lost:
            warnings.warn(f"group {self.name!r}: Ray could not stop rank(s) " + ", ".join(
                f"{rank} (node {node.rank}, {node.address}, Ray node {node.node_id[:12]})" for rank, node in lost)
                + ": their node's raylet is gone; hwplace's worker processes exit when their raylet does, so "
                "none should be left, but check those machines for leftover processes if the node was not "
                "stopped cleanly", RuntimeWarning, stacklevel=4)

    def failure(self, rank: int, what: str, outcome: Any, incarnation: int = 0) -> HwplaceError | None:
        """The error an outcome of ``rank`` (its process ``incarnation``) stands for, or ``None`` for a result."""
        node_rank = self.specs[rank].placement.node_rank
        if isinstance(outcome, RemoteFailure):
            return outcome.error(what, group=self.name, rank=rank, node_rank=node_rank)
        if isinstance(outcome, Cancelled):
            return CallCancelled(f"group {self.name!r} rank {rank} on node {node_rank}: {what} was cancelled")
        if not isinstance(outcome, Raised):
            return None  # a value the method returned, whatever it is
        outcome = outcome.error
        if isinstance(outcome, ray.exceptions.RayActorError):
            node = self.specs[rank].node
            restarted = self.incarnations.died(rank, incarnation, self._death(rank, outcome))
            return WorkerError(f"{what} failed: the worker process has died (node {node_rank} is "
                               f"{node.address}, Ray node {node.node_id[:12]}): {first_line(outcome)}"
                               f"{'; it is being restarted' if restarted else ''}",
                               group=self.name, rank=rank, node_rank=node_rank, restarted=restarted)
        if isinstance(outcome, ray.exceptions.RayTaskError) and isinstance(outcome.cause, TypeError | PicklingError):
            # WorkerHost.call catches whatever the method raises: a TypeError here is Ray pickling its result
            return WorkerError(f"{what} returned a value that cannot be pickled ({_unpicklable(outcome.cause)}); "
                               "return plain data, arrays, tensors or objects that pickle", group=self.name, rank=rank,
                               node_rank=node_rank)
        if isinstance(outcome, ray.exceptions.ActorUnschedulableError | ray.exceptions.TaskUnschedulableError):
            node = self.specs[rank].node
            return WorkerError(f"{what} cannot run: the worker's node is gone (node {node_rank} is {node.address}, "
                               f"Ray node {node.node_id[:12]}; Ray cannot schedule there): {first_line(outcome)}",
                               group=self.name, rank=rank, node_rank=node_rank)
        return WorkerError(f"{what} failed in Ray: {first_line(outcome)}", group=self.name, rank=rank,
                           node_rank=node_rank)


def _unpicklable(error: BaseException) -> str:
    """What pickle said it could not pickle: ``a _thread.lock`` from "cannot pickle '_thread.lock' object"."""
    found = re.search(r"(?:cannot|Can't) pickle '?([\w.<>]+)'?", str(error))
    return f"a {found.group(1)} does not pickle" if found else first_line(error)


BULKY_BYTES = 100 * 1024  # Ray's own limit for passing an argument inline rather than through its object store


def _bulky(values: Sequence[Any], depth: int = 2) -> bool:
    """Whether arguments hold buffers (arrays, tensors, bytes) of ``BULKY_BYTES`` or more, looking into mappings
    and sequences ``depth`` levels deep: those are put in the object store once for all ranks. Smaller arguments
    travel with each rank's call, which saves every rank a fetch from the store (about 1 ms each)."""
    total = 0
    for value in values:
        if isinstance(value, (bytes, bytearray, memoryview)):
            total += len(value)
        elif hasattr(value, "nbytes") and isinstance(getattr(value, "nbytes", None), int):
            total += value.nbytes  # numpy arrays
        elif hasattr(value, "element_size") and hasattr(value, "numel"):
            total += int(value.element_size() * value.numel())  # torch tensors
        elif depth and isinstance(value, Mapping):
            total += BULKY_BYTES * _bulky(list(value.values()), depth - 1)
        elif depth and isinstance(value, (list, tuple)):
            total += BULKY_BYTES * _bulky(value, depth - 1)
        if total >= BULKY_BYTES:
            return True
    return False


@contextlib.contextmanager
def _pickled(group: str, ranks: Sequence[int], what: str, args: tuple[Any, ...],
             kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Turn Ray's failure to pickle a call's arguments into a WorkerError naming the argument and its type."""
    try:
        yield
    except (TypeError, PicklingError) as exc:
        raise unpicklable_arguments(what, group, ranks, args, kwargs, cloudpickle.dumps, exc) from None



class RayHandle(Handle):
    """Results of one call on some ranks of a group, gathered as they arrive; the first failure is raised."""

    def __init__(self, runtime: RayGroupRuntime, ranks: tuple[int, ...], refs: list[Any],
                 targets: list[tuple[Any, int]], what: str, call: str = "") -> None:
        self._runtime = runtime
        self._call = call  # an async method's call, named for WorkerHost.cancel; "" for a plain one
        self._ranks = ranks
        self._actors = [actor for actor, _ in targets]  # the processes called: a cancel reaches these, not their
        self._incarnations = [incarnation for _, incarnation in targets]  # successors, and a death is theirs
        self._refs = refs
        self._what = what
        self._index = {ref: i for i, ref in enumerate(refs)}
        self._outcomes: dict[int, Any] = {}
        self._cancelled = False  # once cancelled, every rank ends soon: wait reports them in rank order

    def _collect(self, refs: list[Any]) -> None:
        try:  # one get for every rank that has ended; one at a time where one failed
            self._outcomes.update((self._index[ref], _unwrapped(v)) for ref, v in zip(refs, ray.get(refs), strict=True))
        except ray.exceptions.RayError:
            for ref in refs:
                self._take(ref, None)

    def _take(self, ref: Any, timeout: float | None) -> bool:
        """Wait for one rank's outcome (at most ``timeout`` seconds) and keep it; False when the time ran out."""
        try:
            outcome = _unwrapped(ray.get(ref, timeout=timeout))
        except ray.exceptions.GetTimeoutError:
            return False
        except ray.exceptions.RayError as exc:
            outcome = Raised(exc)
        self._outcomes[self._index[ref]] = outcome
        return True

    def _pending(self) -> list[Any]:
        return [ref for i, ref in enumerate(self._refs) if i not in self._outcomes]

    def _raise_failures(self) -> None:
        for i in sorted(self._outcomes):
            error = self._runtime.failure(self._ranks[i], self._what, self._outcomes[i], self._incarnations[i])
            if error is not None:
                raise error

    def wait(self, timeout: float | None = None) -> list[Any]:
        self._runtime.check_session(self._what)
        timeout = wait_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        pending = self._pending()
        if self._cancelled and pending:  # every rank ends soon: report them in rank order, not arrival order
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=remaining)
            self._collect(ready)
        while pending:  # one rank's end at a time, so that a failure is raised without waiting for the others
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if len(pending) == 1:  # the last rank: one get waits for it and takes its outcome
                ready, pending = (pending, []) if self._take(pending[0], remaining) else ([], pending)
            else:
                ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
                if ready and pending:  # and every other rank that has ended meanwhile, without waiting
                    more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                    ready += more
                self._collect(ready)
            if not ready:
                self._raise_failures()
                raise TimeoutError(f"group {self._runtime.name!r}: {self._what} did not finish within "
                                   f"{timeout:g} s on ranks {self._waiting_ranks()}; it goes on running")
            self._raise_failures()
        self._raise_failures()
        return [self._outcomes[i] for i in range(len(self._refs))]

    def _waiting_ranks(self) -> list[int]:
        return [self._ranks[i] for i in range(len(self._refs)) if i not in self._outcomes]

    def done(self) -> bool:
        self._runtime.check_session(self._what)
        pending = self._pending()
        return not pending or len(ray.wait(pending, num_returns=len(pending), timeout=0)[0]) == len(pending)

    @property
    def num_done(self) -> int:
        self._runtime.check_session(self._what)
        pending = self._pending()
        ready = ray.wait(pending, num_returns=len(pending), timeout=0)[0] if pending else []
        return len(self._refs) - len(pending) + len(ready)

    async def wait_async(self) -> list[Any]:
        self._runtime.check_session(self._what)

        async def one(i: int, ref: Any) -> None:
            try:
                self._outcomes[i] = _unwrapped(await ref)
            except ray.exceptions.RayError as exc:
                self._outcomes[i] = Raised(exc)
            error = self._runtime.failure(self._ranks[i], self._what, self._outcomes[i], self._incarnations[i])
            if error is not None:
                raise error

        await asyncio.gather(*(one(i, ref) for i, ref in enumerate(self._refs) if i not in self._outcomes))
        self._raise_failures()
        return [self._outcomes[i] for i in range(len(self._refs))]

    def cancel(self, force: bool = False) -> bool:
        self._runtime.check_session(self._what)
        pending = self._pending()
        finished = set(ray.wait(pending, num_returns=len(pending), timeout=0)[0]) if pending else set()
        running = [ref for ref in pending if ref not in finished]
        if not running:
            return False
        self._cancelled = True
        if self._call:  # an async method: its host cancels its asyncio task
            for ref in running:
                self._actors[self._index[ref]].cancel.remote(self._call)
            return True
        if not force:
            return False
        for ref in running:  # a plain method: only ending its process stops it
            ray.kill(self._actors[self._index[ref]], no_restart=True)
        return True

    def __repr__(self) -> str:
        return f"<RayHandle {self._runtime.name!r} {self._what} on {len(self._refs)} ranks>"
