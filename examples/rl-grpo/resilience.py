"""How the GRPO example keeps going when its processes die (docs/resilience.md).

Driver side: :class:`Producers` keeps each producer rank's long-running call going (a rank that hwplace restarted
in place gets its call again), and :func:`train_step` runs one training step on every trainer rank, forming the
ranks' collective anew and re-seeding a restarted rank from a live peer when one died during the step.
Worker side: :class:`Collective` forms the trainer ranks' gloo group once per *generation*, so that the ranks
that stayed alive and the restarted one meet in a new group while the old one is broken.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

import hwplace

POLL = 0.25  # seconds between looks at the producers while a training step runs
FORM_TIMEOUT = datetime.timedelta(seconds=60)  # a rank that never joins a generation fails it after this


class Collective:
    """The trainer ranks' gloo group, formed anew for each generation (a restart of any rank starts one).

    Rank 0 keeps one rendezvous store for its process's life; each generation's keys live under its own prefix,
    so a rank joining generation 3 never meets what generation 2 left there.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.store: dist.TCPStore | None = None
        self.generation = -1

    def form(self, generation: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        if self.rank == 0:
            if self.store is None:
                self.store = dist.TCPStore(address, port, self.world_size, is_master=True, timeout=FORM_TIMEOUT,
                                           wait_for_workers=False)
            store = self.store
        else:  # a new client each time: rank 0 may be a new process since the last generation
            store = dist.TCPStore(address, port, self.world_size, is_master=False, timeout=FORM_TIMEOUT)
        dist.init_process_group("gloo", store=dist.PrefixStore(f"generation-{generation}", store), rank=self.rank,
                                world_size=self.world_size, timeout=FORM_TIMEOUT)
        self.generation = generation


@dataclasses.dataclass
class _Call:
    group: hwplace.WorkerGroup
    rank: int
    method: str
    args: tuple[Any, ...]
    handle: hwplace.Handle | None = None
    died: float = 0.0  # when the executor reported the death that the rank is restarting from
    cause: str = ""  # what the report said
    results: list[Any] = dataclasses.field(default_factory=list)  # what each process of the rank returned


class Producers:
    """Calls that run until the channels close, one per rank: a rank restarted in place gets its call again.

    ``check()`` calls ``feed`` (if given), then raises the ``WorkerError`` of a rank that died for good (no
    restarts left) and says which rank stopped producing otherwise; ``restarts`` lists, per restart, the
    component, rank, seconds from the death's report to the call running again, and the death's cause.
    """

    def __init__(self, feed: Callable[[], None] | None = None) -> None:
        self.calls: dict[str, list[_Call]] = {}
        self.restarts: list[tuple[str, int, float, str]] = []
        self.feed = feed  # called at every check: what keeps the producers fed

    def start(self, name: str, group: hwplace.WorkerGroup, method: str, *args: Any) -> None:
        self.calls[name] = [_Call(group, rank, method, args) for rank in range(group.world_size)]
        for call in self.calls[name]:
            self._issue(call)

    def _issue(self, call: _Call) -> None:
        call.handle = getattr(call.group.execute_on(call.rank), call.method)(*call.args)

    def check(self) -> None:
        if self.feed is not None:
            self.feed()
        for name, calls in self.calls.items():
            for call in calls:
                if call.handle is None:  # restarting: call it again once the new process serves
                    state = call.group.status()[call.rank].state
                    if state == "serving":
                        self._issue(call)
                        self.restarts.append((name, call.rank, time.monotonic() - call.died, call.cause))
                    continue
                try:
                    call.results.extend(call.handle.wait(timeout=0))
                except TimeoutError:
                    continue  # still producing
                except hwplace.WorkerError as failed:
                    if not failed.restarted:
                        raise
                    call.handle, call.died, call.cause = None, time.monotonic(), str(failed).splitlines()[0]
                    continue
                raise RuntimeError(f"the {name} worker of rank {call.rank} stopped producing before training "
                                   "was done")

    def finish(self, timeout: float) -> dict[str, list[dict[str, Any]]]:
        """Each rank's results once the channels are closed: its last process's (a restarted rank's earlier
        processes returned nothing)."""
        finished: dict[str, list[dict[str, Any]]] = {}
        for name, calls in self.calls.items():
            finished[name] = []
            for call in calls:
                if call.handle is not None:
                    call.results.extend(call.handle.wait(timeout=timeout))
                finished[name].append(call.results[-1] if call.results else {})
        return finished


def wait_all(handles: list[hwplace.Handle], producers: Producers) -> list[Any]:
    """Every handle's outcome (its one result, or the exception it raised), watching the producers meanwhile."""
    outcomes: list[Any] = [None] * len(handles)
    pending = set(range(len(handles)))
    while pending:
        producers.check()
        for index in sorted(pending):
            try:
                [outcomes[index]] = handles[index].wait(timeout=POLL / len(handles))
            except TimeoutError:
                continue
            except hwplace.WorkerError as failed:
                outcomes[index] = failed
            pending.discard(index)
    return outcomes


@dataclasses.dataclass
class Trainers:
    """The trainer group as the driver drives it: its generation, and the restarts it came through."""

    group: hwplace.WorkerGroup
    generation: int = 0
    restarts: list[tuple[str, int, float, str]] = dataclasses.field(default_factory=list)
    kept: dict[str, Any] | None = None  # the state of the last step seen (rank 0's ``state`` in its result)
    counted: list[int] = dataclasses.field(default_factory=list)  # each rank's restarts in ``restarts`` so far
    formed: list[int] = dataclasses.field(default_factory=list)  # each rank's restarts when the collective was
    # last formed (none at launch)

    def __post_init__(self) -> None:
        self.formed = self.formed or [0] * self.group.world_size

    def step(self, producers: Producers, call: Callable[[hwplace.WorkerGroup], hwplace.Handle],
             reform: Callable[[hwplace.WorkerGroup, int, Any], hwplace.Handle]) -> list[Any]:
        """``call`` on every rank; when a rank died meanwhile (its group restarts it in place), wait for it,
        form the collective anew with ``reform`` (which re-seeds the restarted rank from a live one, or from the
        state kept here when none is left), and call again. A failure that no restart explains is raised."""
        while True:
            if self._restarted_since_formed():  # a rank died after its last step and is back (or coming back):
                self._reform(producers, reform, [])  # its new process is in no collective yet
                self._count(time.monotonic())
            ranks = range(self.group.world_size)
            outcomes = wait_all([call(self.group.execute_on(rank)) for rank in ranks], producers)
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            if not failures:
                self.kept = outcomes[0].pop("state", self.kept)
                return outcomes
            died = time.monotonic()
            if self._unexplained(failures, self.formed):  # (a peer's restart breaks the collective without
                raise failures[0]  # failing this step's call to it, when the call reached its new process)
            self._reform(producers, reform, failures)
            self._count(died)

    def _restart_counts(self) -> list[int]:
        return [status.restarts for status in self.group.status()]

    def _restarted_since_formed(self) -> bool:
        """Whether a rank restarted (or is restarting) since the collective was last formed."""
        return self._restart_counts() != self.formed

    def _unexplained(self, failures: list[BaseException], formed: list[int]) -> bool:
        """Whether no restart explains ``failures``: none says its rank restarted, and no rank restarted since
        the collective was formed with restart counts ``formed``."""
        return not any(isinstance(f, hwplace.WorkerError) and f.restarted for f in failures) and \
            self._restart_counts() == formed

    def _count(self, died: float) -> None:
        """Record every restart since the last look, those during a reform too."""
        statuses = self.group.status()
        self.counted += [0] * (len(statuses) - len(self.counted))
        for status in statuses:
            self.restarts += [("trainer", status.rank, time.monotonic() - died, status.cause or "")] * (
                status.restarts - self.counted[status.rank])
            self.counted[status.rank] = status.restarts

    def _reform(self, producers: Producers, reform: Callable[[hwplace.WorkerGroup, int, Any], hwplace.Handle],
                failures: list[BaseException]) -> None:
        while True:
            while any(status.state != "serving" for status in self.group.status()):
                for status in self.group.status():
                    if status.state == "dead":
                        raise hwplace.WorkerError(f"died and was not restarted: {status.cause}", group=self.group.name,
                                                  rank=status.rank, node_rank=status.node_rank) \
                            from (failures[0] if failures else None)
                producers.check()
                time.sleep(POLL / 5)
            restarts = self._restart_counts()  # what this generation is formed of
            self.generation += 1
            outcomes = wait_all([reform(self.group.execute_on(rank), self.generation, self.kept)
                                 for rank in range(self.group.world_size)], producers)
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            if not failures:
                self.formed = restarts
                return
            if self._unexplained(failures, restarts):
                raise failures[0]
