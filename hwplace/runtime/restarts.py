"""Restart in place (SPEC §12): what becomes of a group's ranks when their processes die.

A group launched with a :class:`~hwplace.Restart` policy has a :class:`Supervisor`: the executor (its
:class:`~hwplace.executor.Restarts` capability) tells it of each death, and it starts the dead rank (or, with
``scope="group"``, every rank) again in place while restarts are left, or leaves it ``dead`` with the cause.
Each rank's state is a :class:`RankStatus` (``group.status()``). The lease on the group's devices is the
group's, not a process's: it is held through the gap, until the group is shut down.

:class:`Incarnations` is the executors' side: which process of each rank is the current one, so that a death
is reported once, and only for the current process. Imports the layers below.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.config.restart import Restart
from hwplace.contracts.capabilities import Restarts
from hwplace.contracts.executor import GroupRuntime
from hwplace.contracts.records import Placement
from hwplace.foundation.errors import WorkerError
from hwplace.foundation.wording import first_line
from hwplace.plugin.session import session

SERVING, RESTARTING, DEAD = "serving", "restarting", "dead"


@dataclass(frozen=True)
class RankStatus:
    """One rank of a group: its ``state`` (``serving``, ``restarting`` or ``dead``), the ``restarts`` it has
    used (with ``scope="group"``, the group's), and the ``cause`` of its last death (``""`` if none)."""

    rank: int
    node_rank: int
    state: str
    restarts: int
    cause: str


FAILURE_LISTENERS = "group failure listeners"  # session state: told when a group's restarts are used up


def on_group_failure(listener: Callable[[WorkerError], None]) -> Callable[[], None]:
    """Tell ``listener`` (from a thread of its own) when a group of this process uses up its restarts, with the
    last death (``hwplace run`` ends the job then); returns the function that stops telling it."""
    listeners: list[Callable[[WorkerError], None]] = session().state(FAILURE_LISTENERS, list)
    listeners.append(listener)

    def remove() -> None:
        if listener in listeners:
            listeners.remove(listener)

    return remove



class Supervisor:
    """The ranks of one group: their states, and the restarts its policy allows."""

    def __init__(self, name: str, placements: Sequence[Placement], policy: Restart | None,
                 executor: Restarts | None, runtime: GroupRuntime,
                 on_change: Callable[[list[RankStatus]], None] | None = None) -> None:
        self.name = name
        self._on_change = on_change  # told every state change, outside the lock (hwplace status shows them)
        self.policy = policy or Restart(0)
        self._placements = tuple(placements)
        self._executor = executor
        self._runtime = runtime
        self._lock = threading.Lock()
        size = len(self._placements)
        self._states = [SERVING] * size
        self._causes = [""] * size
        self._used = [0] * size  # with scope="group", every rank's entry is the group's count
        self._closed = False
        self.failure: WorkerError | None = None  # a death that used up the restarts of a policy that had some
        self._listeners: list[Callable[[WorkerError], None]] = session().state(FAILURE_LISTENERS, list)
        self._told_failure = False
        self._given_up: list[int] = []  # ranks left dead after a failed restart, for the executor to show so
        self._early: dict[int, str] = {}  # deaths of a new process before its restart was seen through
        self._publishing = threading.Lock()  # one publication at a time, each of the newest states
        self._shown = self._current()  # the states as last published: what status() returns

    def start(self) -> None:
        """Be told of each death from now on (when the executor can restart)."""
        if self._executor is not None:
            self._executor.watch(self._runtime, self.died)

    def close(self) -> None:
        """The group is being shut down: its deaths from now on are its end, not a restart's cue."""
        with self._lock:
            self._closed = True

    def status(self) -> list[RankStatus]:
        """Each rank's state as last published: ``on_change`` (what hwplace status shows) was told it first, so
        ``group.status()`` is never ahead of hwplace status."""
        with self._lock:
            return list(self._shown)

    def _current(self) -> list[RankStatus]:
        return [RankStatus(rank, p.node_rank, self._states[rank], self._used[rank], self._causes[rank])
                for rank, p in enumerate(self._placements)]

    def died(self, rank: int, cause: str) -> bool:
        """A process of ``rank`` died of ``cause``: whether it will be restarted."""
        with self._lock:
            if self._closed or self._states[rank] == DEAD:
                return False
            if self._states[rank] == RESTARTING:  # a process stopped by its group's restart; or, restarting a rank
                if self.policy.scope == "rank":  # alone, its new process, dead before the restart was seen
                    self._early[rank] = cause  # through: once it is (its constructor returned), another death
                return True
            self._causes[rank] = cause
            restarting = self._next(rank, cause)
        self._changed()
        return restarting

    def _changed(self) -> None:
        with self._lock:
            given_up, self._given_up = self._given_up, []
        for rank in given_up:  # the executor told of the death itself; not of a restart's failure
            if self._executor is not None and not self._closed:
                with contextlib.suppress(Exception):  # the session ended: no peer is left to tell
                    self._executor.gave_up(self._runtime, rank)
        with self._publishing:  # two threads' changes told in the order of their states: the last told is newest
            with self._lock:
                found = self._current()
            if self._on_change is not None and not self._closed:
                with contextlib.suppress(Exception):  # what hwplace status shows, no more: the restart goes on
                    self._on_change(found)
            with self._lock:
                self._shown = found
        failure = self.failure
        if failure is not None and not self._closed and not self._told_failure:
            self._told_failure = True
            for listener in list(self._listeners):
                listener(failure)

    def _next(self, rank: int, cause: str) -> bool:
        """Under the lock: restart ``rank`` (or the group) if restarts are left, else leave it dead."""
        if self._used[rank] >= self.policy.max_restarts or self._executor is None:
            self._states[rank] = DEAD
            if self.policy.max_restarts:  # restarts left at 0 end the group (SPEC §12); without any, today's rule
                self.failure = WorkerError(f"{cause}; its restarts are used up ({self._used[rank]} of "
                                           f"{self.policy.max_restarts})", group=self.name, rank=rank,
                                           node_rank=self._placements[rank].node_rank)
            return False
        ranks = [rank] if self.policy.scope == "rank" else list(range(len(self._placements)))
        attempt = self._used[rank] + 1
        try:
            handle = self._executor.restart(self._runtime, ranks, attempt, cause)  # under the lock: see close()
        except Exception as exc:  # nothing could start (the executor's session ended, say): the rank is dead
            self._states[rank] = DEAD
            self._causes[rank] = f"{cause}; its restart could not start: {first_line(exc)}"
            self._given_up.append(rank)
            self.failure = WorkerError(self._causes[rank], group=self.name, rank=rank,
                                       node_rank=self._placements[rank].node_rank)
            return False
        for r in ranks:
            self._states[r] = RESTARTING
            self._used[r] = attempt
        threading.Thread(target=self._await, args=(ranks, handle), name=f"hwplace-restart-{self.name}",
                         daemon=True).start()
        return True

    def _await(self, ranks: list[int], handle: Any) -> None:
        """Wait for the restarted ranks' constructors; one that fails (or a node gone) is another death."""
        try:
            handle.wait()
        except Exception as exc:  # a constructor raised, the node is gone, the session ended
            failed = exc.rank if isinstance(exc, WorkerError) and exc.rank in ranks else ranks[0]
            with self._lock:
                for r in ranks:
                    self._early.pop(r, None)  # this failure is that death
                if self._closed:
                    return
                cause = f"its restart failed: {first_line(exc)}"
                self._causes[failed] = cause
                if not self._next(failed, cause) and failed not in self._given_up:
                    self._given_up.append(failed)
            self._changed()
            return
        with self._lock:
            for r in ranks:
                if self._states[r] == RESTARTING:
                    self._states[r] = SERVING
            for r in ranks:
                early = self._early.pop(r, None)
                if early is not None and self._states[r] == SERVING and not self._closed:
                    self._causes[r] = early
                    self._next(r, early)
        self._changed()


class _Answer:
    """Whether a death will be restarted, once the group has said so."""

    def __init__(self, value: bool | None = None) -> None:
        self._value = value
        self._given = threading.Event()
        if value is not None:
            self._given.set()

    def give(self, value: bool) -> None:
        self._value = value
        self._given.set()

    def get(self) -> bool:
        self._given.wait()
        return bool(self._value)


class Incarnations:
    """For an executor's :class:`~hwplace.executor.Restarts`: which process of each rank is current (its
    incarnation, counted from 0), and whether each death is to be told to the group.

    A call records the incarnation it went to; when it fails because that process died, :meth:`died` answers
    whether the rank will be restarted (the ``WorkerError``'s ``restarted``): the first report of a current
    process's death asks the group (outside any lock: the group may restart at once), later ones wait for the
    same answer, and a process that :meth:`replace` stopped counts as restarted.
    """

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._current = [0] * size
        self._states = [SERVING] * size
        self._answers: dict[tuple[int, int], _Answer] = {}
        self._on_death: Callable[[int, str], bool] | None = None
        self._closed = False
        self._publish: Callable[[tuple[int, ...], tuple[str, ...]], None] | None = None

    def current(self, rank: int) -> int:
        return self._current[rank]

    def publish(self, publish: Callable[[tuple[int, ...], tuple[str, ...]], None]) -> None:
        """From now on, tell ``publish(incarnations, states)`` each change: the executor puts them in the group's
        :class:`~hwplace.contracts.executor.GroupEntry`, where the peers' messaging reads them."""
        self._publish = publish

    def watch(self, on_death: Callable[[int, str], bool]) -> None:
        self._on_death = on_death

    def close(self) -> None:
        """The group is shut down: deaths from now on are not told."""
        with self._lock:
            self._closed = True

    def replace(self, rank: int) -> int:
        """``rank`` gets a new process (its old one, if alive, is stopped as restarted): the new incarnation.
        Told (``publish``) before the process starts, so that it finds its own incarnation in the entry."""
        with self._lock:
            self._answers.setdefault((rank, self._current[rank]), _Answer(True))
            self._current[rank] += 1
            self._states[rank] = SERVING
            incarnation = self._current[rank]
        self._told()
        return incarnation

    def gave_up(self, rank: int) -> None:
        """The group gave ``rank`` up after its restart failed (``Restarts.gave_up``): its current process is
        ``dead`` to the peers."""
        with self._lock:
            self._states[rank] = DEAD
        self._told()

    def _told(self) -> None:
        if self._publish is not None:
            with self._lock:
                incarnations, states = tuple(self._current), tuple(self._states)
            self._publish(incarnations, states)

    def died(self, rank: int, incarnation: int, cause: str) -> bool:
        """Incarnation ``incarnation`` of ``rank`` died: whether the rank will be restarted."""
        with self._lock:
            key = (rank, incarnation)
            answer = self._answers.get(key)
            first = answer is None
            if answer is None:
                if self._on_death is None or self._closed or incarnation != self._current[rank]:
                    return False
                answer = self._answers[key] = _Answer()
            on_death = self._on_death
        if first and on_death is not None:
            try:
                restarting = bool(on_death(rank, cause))
            except BaseException:
                answer.give(False)
                raise
            with self._lock:
                if incarnation == self._current[rank]:  # not yet replaced: the peers learn it is down
                    self._states[rank] = RESTARTING if restarting else DEAD
            self._told()
            answer.give(restarting)
        return answer.get()
