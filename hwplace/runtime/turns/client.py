"""A worker's side of turns: ``with self.turn():`` (or ``async with``), re-entrant, with the onload/offload hooks.

The worker connects once to its node's arbiter (:class:`hwplace.runtime.turns.arbiter.TurnServer`), whose address its
executor gives (``Executor.turn_arbiter``); a worker without own accelerators, or on a node where no group
shares one, takes a turn at no cost. Imports the layers below and :mod:`hwplace.runtime.turns.arbiter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from types import TracebackType
from typing import Any, Protocol

from hwplace.contracts.capabilities import TurnAddress, TurnArbitration
from hwplace.contracts.records import Placement
from hwplace.foundation.errors import WorkerError
from hwplace.foundation.timeouts import wait_timeout
from hwplace.foundation.trace import MEMORY, TURN, WAIT, begin, end, memory_held, span
from hwplace.planning.sharing import accelerator_units
from hwplace.plugin.session import session


class TurnTaker(Protocol):
    """What turns need of a worker (a :class:`hwplace.Worker` is one); its ``onload`` and ``offload`` are
    optional methods, looked up when a turn starts and ends."""

    @property
    def placement(self) -> Placement: ...

    @property
    def group_name(self) -> str: ...

    @property
    def rank(self) -> int: ...


class _Connection:
    """One worker's connection to its node's arbiter; one request at a time."""

    def __init__(self, address: TurnAddress, group: str, who: str) -> None:
        self._socket = socket.create_connection((address.host, address.port), timeout=10)
        self._socket.settimeout(None)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self._socket.makefile("rb")
        self._lock = threading.Lock()
        self._send({"token": address.token, "group": group, "who": who})

    def _send(self, message: dict[str, Any]) -> None:
        self._socket.sendall(json.dumps(message).encode() + b"\n")

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:  # a request and its answer, never interleaved with another thread's
            self._send(message)
            line = self._file.readline()
        if not line:
            raise OSError("the arbiter closed the connection")
        answer: dict[str, Any] = json.loads(line)
        return answer


class Turns:
    """The turn state of one worker: how deep it is in ``turn()`` blocks, and its arbiter connection."""

    def __init__(self, worker: TurnTaker) -> None:
        self._worker = worker
        self._units = [list(unit) for unit in accelerator_units(worker.placement)]
        self._who = f"{worker.group_name} rank {worker.rank}"
        self._changed = threading.Condition()
        self._depth = 0
        self._busy = False  # a thread of this worker is entering or leaving the turn (arbiter or hook)
        self._connection: _Connection | None = None
        self._held_remotely = False
        self._offloaded = False  # offload() ran and no onload() since: the worker's state is out
        self._held: tuple[str, str, int] | None = None  # the span of the turn held (begin), when tracing

    def _arbiter(self) -> _Connection | None:
        if self._connection is None and self._units:
            executor = session().executor
            address = executor.turn_arbiter(self._worker.placement) if isinstance(executor, TurnArbitration) else None
            if address is not None:
                try:
                    self._connection = _Connection(address, self._worker.group_name, self._who)
                except OSError as exc:
                    raise self._lost(exc) from None
        return self._connection

    def _lost(self, exc: OSError) -> WorkerError:
        context = self._worker.placement
        return WorkerError(f"the turn arbiter of node {context.node_rank} is gone ({exc.strerror or exc})",
                           group=self._worker.group_name, rank=self._worker.rank, node_rank=context.node_rank)

    def enter(self, timeout: float | None) -> None:
        """Enter this worker's turn (sharing it when another thread or coroutine of the worker holds it), waiting
        up to ``timeout`` s in all, also for a thread of the worker that is entering or leaving meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self._busy:  # another thread of this worker talks to the arbiter or runs a hook: after it
                if not self._changed.wait(_left(deadline)):
                    raise TimeoutError(f"{self._who}: no turn on {_units(self._units)} within {timeout:g} s (another "
                                       "call of this worker was still entering or leaving its turn)")
            if self._depth:
                self._depth += 1
                return
            self._busy = True
        try:
            with span("turn.wait", WAIT, units=self._units):  # formatted only when written
                onload = self._acquire(timeout, _left(deadline))
            with self._changed:
                self._depth = 1
                self._held = begin("turn", TURN)
            hook = getattr(self._worker, "onload", None)
            # onload() undoes offload(): a worker that defines offload() is onloaded only after it offloaded
            if onload and callable(hook) and (self._offloaded or not callable(getattr(self._worker, "offload", None))):
                self._offloaded = False
                try:
                    with span("onload", MEMORY):
                        hook()
                except BaseException:
                    with self._changed:
                        self._depth = 0
                    end(self._held)
                    self._release()
                    raise
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()

    def _acquire(self, timeout: float | None, left: float | None) -> bool:
        connection = self._arbiter()
        self._held_remotely = connection is not None
        if connection is None:
            return False
        try:
            answer = connection.ask({"op": "acquire", "units": self._units, "timeout": left})
        except OSError as exc:
            raise self._lost(exc) from None
        if not answer["granted"]:
            self._held_remotely = False
            held = ", ".join(answer["holders"]) or "workers of another group waiting before it"
            raise TimeoutError(f"{self._who}: no turn on {_units(self._units)} within {timeout:g} s (held by {held})")
        return bool(answer["onload"])

    def leave(self) -> None:
        """Leave the turn; the last of the worker's nested or shared turns releases it (offloading when asked)."""
        with self._changed:
            self._depth -= 1
            if self._depth:
                return
            self._busy = True  # until the arbiter has it back: a thread entering meanwhile waits, then asks anew
        end(self._held)
        try:
            self._release()
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()

    def _release(self) -> None:
        connection = self._connection
        if connection is None or not self._held_remotely:
            return
        self._held_remotely = False
        hook = getattr(self._worker, "offload", None)
        try:
            if connection.ask({"op": "release", "hooks": callable(hook)})["offload"]:
                try:
                    self._offloaded = True
                    with span("offload", MEMORY) as offloading:
                        hook()  # type: ignore[misc]
                        offloading.args.update(memory_held())  # held once offloaded: the "offloaded" phase
                finally:
                    connection.ask({"op": "released"})
        except OSError as exc:
            raise self._lost(exc) from None


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _units(units: list[list[Any]]) -> str:
    return ", ".join(f"{kind} {index}" for kind, index in units)


class Turn:
    """What ``worker.turn(timeout)`` returns: use it as ``with`` (or ``async with`` in an ``async def`` method)."""

    def __init__(self, turns: Turns, timeout: float | None) -> None:
        self._turns = turns
        self._timeout = wait_timeout(timeout)

    def __enter__(self) -> Turn:
        self._turns.enter(self._timeout)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._turns.leave()

    async def __aenter__(self) -> Turn:
        # a thread cannot be stopped: a cancelled wait leaves it waiting, and leaves the turn once it has it
        entering = asyncio.ensure_future(asyncio.to_thread(self._turns.enter, self._timeout))
        try:
            await asyncio.shield(entering)
        except asyncio.CancelledError:
            entering.add_done_callback(self._leave_if_entered)
            raise
        return self

    def _leave_if_entered(self, entering: asyncio.Future[None]) -> None:
        if not entering.cancelled() and entering.exception() is None:
            threading.Thread(target=self._leave_quietly, daemon=True, name="hwplace-turn-leave").start()

    def _leave_quietly(self) -> None:
        with contextlib.suppress(WorkerError):  # the arbiter is gone: nothing is held
            self._turns.leave()

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await asyncio.to_thread(self._turns.leave)
