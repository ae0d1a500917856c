"""How ``hwplace run`` ends the entry point when a group uses up its restarts (hwplace.application.group_failure):
wherever the main thread waits, also where SIGINT is ignored (a job started in the background by a shell) or
handled by the entry point. ``tests/application/test_run.py`` has the same through ``hwplace run``."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

import hwplace
from hwplace.application.group_failure import GROUP_FAILED_SIGNAL, GroupFailed, ended_by_group_failure
from hwplace.executor import GroupRuntime, Handle, Restarts
from hwplace.foundation.errors import WorkerError
from hwplace.runtime.restarts import Supervisor
from hwplace.testing import fake_cluster

pytestmark = pytest.mark.time_limit(60)  # a failure that never arrives fails the test rather than hangs

PLACEMENTS = tuple(hwplace.PackedPlacementStrategy(0, 1).get_placement(fake_cluster(num_nodes=1,
                                                                                    accelerators_per_node=2)))


class Restarted(Handle):
    def wait(self, timeout: float | None = None) -> list[Any]:
        return [None]


class Executor(Restarts):
    """Restarts that always start."""

    def watch(self, runtime: GroupRuntime, on_death: Callable[[int, str], bool]) -> None:
        pass

    def restart(self, runtime: GroupRuntime, ranks: Sequence[int], attempt: int, cause: str) -> Handle:
        return Restarted()

    def gave_up(self, runtime: GroupRuntime, rank: int) -> None:
        pass


def supervisor() -> Supervisor:
    return Supervisor("doomed", PLACEMENTS, hwplace.Restart(1), Executor(), GroupRuntime())


def use_up_restarts(group: Supervisor, ready: threading.Event) -> None:
    """From another thread, once the main thread waits: rank 1 dies twice with one restart allowed."""
    ready.wait()
    group.died(1, "killed")
    while group.status()[1].state != "serving":  # the restart is seen through on a thread of its own
        threading.Event().wait(0.01)
    group.died(1, "killed again")


@contextlib.contextmanager
def sigint(handler: Any) -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted(handler: Any) -> list[WorkerError]:
    """The main thread waits with no timeout (as an entry point may) until a group's failure ends the wait."""
    failures: list[WorkerError] = []
    group, ready = supervisor(), threading.Event()
    threading.Thread(target=use_up_restarts, args=(group, ready), daemon=True).start()
    with sigint(handler), ended_by_group_failure(failures):
        ready.set()
        try:
            threading.Event().wait()  # never set: only the group's end can stop this wait
        except GroupFailed:
            return failures
    raise AssertionError("unreachable: the wait has no other end")


@pytest.mark.parametrize("handler", [signal.default_int_handler, signal.SIG_IGN, lambda signum, frame: None],
                         ids=["sigint-default", "sigint-ignored", "sigint-handled-by-the-job"])
def test_a_group_that_uses_up_its_restarts_ends_the_wait_with_its_last_death(handler: Any) -> None:
    failures = interrupted(handler)
    assert [(f.group, f.rank) for f in failures] == [("doomed", 1)]
    assert "killed again; its restarts are used up (1 of 1)" in str(failures[0])


def test_after_the_block_the_signal_is_ignored_rather_than_fatal_and_the_previous_handler_is_back() -> None:
    previous = signal.getsignal(GROUP_FAILED_SIGNAL)
    interrupted(signal.default_int_handler)
    assert signal.getsignal(GROUP_FAILED_SIGNAL) == (signal.SIG_IGN if previous in (signal.SIG_DFL, None)
                                                      else previous)
    signal.pthread_kill(threading.get_ident(), GROUP_FAILED_SIGNAL)  # a late one: this process lives on


def test_a_second_failure_is_recorded_but_does_not_interrupt_the_job_s_shutdown() -> None:
    failures: list[WorkerError] = []
    with ended_by_group_failure(failures):
        ready = threading.Event()
        threading.Thread(target=use_up_restarts, args=(supervisor(), ready), daemon=True).start()
        ready.set()
        with contextlib.suppress(GroupFailed):
            threading.Event().wait()  # only the first group's end stops this wait
        # the job shuts its groups down, and meanwhile another group uses up its restarts
        other = threading.Thread(target=use_up_restarts, args=(supervisor(), _set()))
        other.start()
        other.join()  # its signal reached this thread: a handler runs before the next line
        shut_down = True
    assert shut_down
    assert len(failures) == 2


def _set() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def test_off_the_main_thread_a_failure_is_only_recorded() -> None:
    failures: list[WorkerError] = []
    outcome: list[BaseException | None] = []

    def block() -> None:
        try:
            with ended_by_group_failure(failures):
                use_up_restarts(supervisor(), _set())
            outcome.append(None)
        except BaseException as exc:  # what the block raised, if anything, is the test's
            outcome.append(exc)

    thread = threading.Thread(target=block)
    thread.start()
    thread.join()
    assert outcome == [None]
    assert [(f.group, f.rank) for f in failures] == [("doomed", 1)]
