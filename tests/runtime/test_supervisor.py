"""The restart bookkeeping alone (hwplace.runtime.restarts): a group's Supervisor against an executor of this file
whose restarts succeed, fail or cannot start as each test says; and Incarnations, which tells each death once.
The end-to-end behaviour on Ray and the process executor is tests/runtime/test_restarts.py."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import hwplace
from hwplace.executor import GroupRuntime, Handle, Incarnations, Restarts
from hwplace.runtime.restarts import RankStatus, Supervisor, on_group_failure
from hwplace.testing import fake_cluster, swapped_session

PLACEMENTS = tuple(hwplace.PackedPlacementStrategy(0, 1).get_placement(fake_cluster(num_nodes=1,
                                                                                    accelerators_per_node=4)))


class Done(Handle):
    """A restart's constructors: finished, or failed with ``error``."""

    def __init__(self, error: BaseException | None = None, gate: threading.Event | None = None) -> None:
        self.error = error
        self.gate = gate

    def wait(self, timeout: float | None = None) -> list[Any]:
        if self.gate is not None:
            self.gate.wait()  # the constructors finish once the test opens the gate
        if self.error is not None:
            raise self.error
        return [None]


class Executor(Restarts):
    """Restarts that answer as ``outcomes`` says, one per restart (then success); records what it was asked."""

    def __init__(self, *outcomes: BaseException | str | None, gate: threading.Event | None = None) -> None:
        self.outcomes = list(outcomes)
        self.gate = gate
        self.asked: list[tuple[list[int], int, str]] = []
        self.restarted = threading.Event()
        self.on_death: Callable[[int, str], bool] | None = None
        self.given_up: list[int] = []
        self.runtimes: list[GroupRuntime] = []  # the group runtime each watch and restart was given

    def watch(self, runtime: GroupRuntime, on_death: Callable[[int, str], bool]) -> None:
        self.on_death = on_death
        self.runtimes.append(runtime)

    def restart(self, runtime: GroupRuntime, ranks: Sequence[int], attempt: int, cause: str) -> Handle:
        self.asked.append((list(ranks), attempt, cause))
        self.runtimes.append(runtime)
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome == "cannot start":
            raise RuntimeError("the session ended")
        self.restarted.set()
        return Done(outcome if isinstance(outcome, BaseException) else None, self.gate)

    def gave_up(self, runtime: GroupRuntime, rank: int) -> None:
        self.given_up.append(rank)


def supervised(policy: hwplace.Restart | None, executor: Executor) -> Supervisor:
    supervisor = Supervisor("g", PLACEMENTS, policy, executor, GroupRuntime())
    supervisor.start()
    return supervisor


def settled(supervisor: Supervisor) -> list[tuple[str, int]]:
    """Each rank's (state, restarts) once no rank is restarting (the test's limit bounds the wait)."""
    while any(s.state == "restarting" for s in supervisor.status()):
        threading.Event().wait(0.01)
    return [(s.state, s.restarts) for s in supervisor.status()]


@pytest.mark.time_limit(30)
def test_a_rank_is_restarted_alone_until_its_restarts_are_used_up() -> None:
    executor = Executor()
    supervisor = supervised(hwplace.Restart(2), executor)
    assert executor.on_death is not None
    assert supervisor.died(1, "killed") is True
    assert settled(supervisor) == [("serving", 0), ("serving", 1)]
    assert executor.asked == [([1], 1, "killed")]
    assert supervisor.died(1, "killed again") is True
    assert settled(supervisor) == [("serving", 0), ("serving", 2)]
    assert supervisor.failure is None
    assert supervisor.died(1, "for good") is False
    assert settled(supervisor) == [("serving", 0), ("dead", 2)]
    assert supervisor.failure is not None
    assert str(supervisor.failure) == "group 'g' rank 1 on node 0: for good; its restarts are used up (2 of 2)"
    assert supervisor.died(1, "once more") is False  # dead stays dead
    assert executor.given_up == []  # on_death's answer told the executor
    assert supervisor.status()[1].cause == "for good"


@pytest.mark.time_limit(30)
def test_scope_group_restarts_every_rank_and_counts_once_for_the_group() -> None:
    gate = threading.Event()
    executor = Executor(gate=gate)
    supervisor = supervised(hwplace.Restart(1, "group"), executor)
    assert supervisor.died(0, "killed") is True
    assert supervisor.died(1, "stopped for the restart") is True  # a rank being restarted: no second count
    gate.set()
    assert settled(supervisor) == [("serving", 1), ("serving", 1)]
    assert executor.asked == [([0, 1], 1, "killed")]
    assert supervisor.died(1, "again") is False
    assert settled(supervisor) == [("serving", 1), ("dead", 1)]


@pytest.mark.time_limit(30)
def test_a_new_process_that_dies_before_its_restart_is_seen_through_counts_as_another_death() -> None:
    """Its constructor returned, but the supervisor had not seen the restart through when the death came (a loaded
    machine): once it has, the death counts, and the rank is restarted again rather than left serving a corpse."""
    gate = threading.Event()
    executor = Executor(gate=gate)
    supervisor = supervised(hwplace.Restart(2), executor)
    assert supervisor.died(1, "killed") is True
    assert supervisor.died(1, "the new process died too") is True  # still restarting: told once it is through
    gate.set()
    assert settled(supervisor) == [("serving", 0), ("serving", 2)]
    assert [(ranks, attempt) for ranks, attempt, _ in executor.asked] == [([1], 1), ([1], 2)]
    assert executor.asked[1][2] == "the new process died too"
    assert supervisor.status()[1].cause == "the new process died too"  # the last death's cause


@pytest.mark.time_limit(30)
def test_a_failed_restart_counts_as_another_death_and_is_tried_again() -> None:
    executor = Executor(hwplace.WorkerError("the constructor raised", group="g", rank=1))
    supervisor = supervised(hwplace.Restart(3), executor)
    assert supervisor.died(1, "killed") is True
    assert settled(supervisor) == [("serving", 0), ("serving", 2)]
    assert [attempt for _, attempt, _ in executor.asked] == [1, 2]
    assert executor.asked[1][2].startswith("its restart failed: group 'g' rank 1: the constructor raised")
    assert executor.given_up == []


def given_up(executor: Executor) -> list[int]:
    """The ranks the supervisor told ``executor`` it gave up, once it told one (the test's limit bounds it)."""
    while not executor.given_up:
        threading.Event().wait(0.01)
    return executor.given_up


@pytest.mark.time_limit(30)
def test_a_failed_restart_with_none_left_leaves_the_rank_dead_and_tells_the_executor_so() -> None:
    executor = Executor(hwplace.WorkerError("on_restart raised", group="g", rank=1))
    supervisor = supervised(hwplace.Restart(1), executor)
    assert supervisor.died(1, "killed") is True
    assert settled(supervisor) == [("serving", 0), ("dead", 1)]
    assert supervisor.status()[1].cause == "its restart failed: group 'g' rank 1: on_restart raised"
    assert given_up(executor) == [1]  # the executor shows it dead to the peers: it heard of no death of it
    assert supervisor.failure is not None


@pytest.mark.time_limit(30)
def test_a_restart_that_cannot_start_leaves_the_rank_dead_naming_why() -> None:
    executor = Executor("cannot start")
    supervisor = supervised(hwplace.Restart(3), executor)
    assert supervisor.died(0, "killed") is False
    assert settled(supervisor) == [("dead", 0), ("serving", 0)]
    assert supervisor.status()[0].cause == "killed; its restart could not start: the session ended"
    assert supervisor.failure is not None
    assert str(supervisor.failure) == "group 'g' rank 0 on node 0: killed; its restart could not start: the " \
                                      "session ended"
    assert (supervisor.failure.group, supervisor.failure.rank, supervisor.failure.node_rank) == ("g", 0, 0)
    assert given_up(executor) == [0]


@pytest.mark.time_limit(30)
def test_without_restarts_a_death_leaves_the_rank_dead_and_the_group_serving() -> None:
    executor = Executor()
    supervisor = supervised(None, executor)
    assert supervisor.died(0, "killed") is False
    assert settled(supervisor) == [("dead", 0), ("serving", 0)]
    assert supervisor.failure is None  # today's rule: the others serve on
    assert executor.asked == []


@pytest.mark.time_limit(30)
def test_deaths_after_close_are_the_group_s_end_and_listeners_hear_of_a_failure_once() -> None:
    heard: list[str] = []
    remove = on_group_failure(lambda error: heard.append(str(error.rank)))
    try:
        changes: list[list[str]] = []
        gate = threading.Event()
        supervisor = Supervisor("g", PLACEMENTS, hwplace.Restart(1), Executor(gate=gate), GroupRuntime(),
                                lambda ranks: changes.append([s.state for s in ranks]))
        supervisor.start()
        assert supervisor.died(0, "killed") is True
        assert changes == [["restarting", "serving"]]  # told before the restart finished
        gate.set()
        settled(supervisor)
        assert supervisor.died(0, "again") is False
        assert supervisor.died(1, "and rank 1") is True
        settled(supervisor)
        assert heard == ["0"]  # told once, of the death that used up the restarts
        assert ["dead", "serving"] in changes
        supervisor.close()
        assert supervisor.died(1, "shut down") is False
    finally:
        remove()
    remove()  # a second removal does nothing


@pytest.mark.time_limit(30)
def test_a_closed_group_restarts_nothing_tells_nothing_and_its_deaths_are_not_failures() -> None:
    heard: list[hwplace.WorkerError] = []
    changes: list[list[str]] = []
    with swapped_session():  # a session where nothing listened before: the group's supervisor makes the list
        executor, runtime = Executor(), GroupRuntime()
        supervisor = Supervisor("g", PLACEMENTS, hwplace.Restart(3), executor, runtime,
                                lambda ranks: changes.append([s.state for s in ranks]))
        remove = on_group_failure(heard.append)
        supervisor.start()
        assert executor.runtimes == [runtime]
        assert supervisor.status() == [RankStatus(0, 0, "serving", 0, ""), RankStatus(1, 0, "serving", 0, "")]
        supervisor.close()
        assert supervisor.died(0, "shut down") is False  # restarts were left: the group's end, not a restart's cue
        assert executor.asked == []
        assert changes == []
        assert heard == []
        assert [(s.state, s.restarts) for s in supervisor.status()] == [("serving", 0), ("serving", 0)]
        remove()


@pytest.mark.time_limit(30)
def test_a_removed_failure_listener_is_not_told() -> None:
    heard: list[str] = []
    with swapped_session():
        remove = on_group_failure(lambda error: heard.append("removed one"))
        keep = on_group_failure(lambda error: heard.append("kept one"))
        remove()
        supervisor = supervised(hwplace.Restart(1), Executor("cannot start"))
        assert supervisor.died(1, "killed") is False
        assert heard == ["kept one"]
        keep()


@pytest.mark.time_limit(30)
def test_a_group_restart_that_fails_on_one_rank_counts_that_rank_s_death() -> None:
    """scope: group restarts ranks 0 and 1 together; rank 1's constructor raises: rank 1 died of it (not the first
    rank of the restart), and the group is restarted again with the runtime it was launched with."""
    runtime = GroupRuntime()
    executor = Executor(hwplace.WorkerError("the constructor raised", group="g", rank=1))
    supervisor = Supervisor("g", PLACEMENTS, hwplace.Restart(2, "group"), executor, runtime)
    supervisor.start()
    assert supervisor.died(0, "killed") is True
    assert settled(supervisor) == [("serving", 2), ("serving", 2)]
    assert [(ranks, attempt) for ranks, attempt, _ in executor.asked] == [([0, 1], 1), ([0, 1], 2)]
    assert executor.asked[1][2].startswith("its restart failed: group 'g' rank 1: the constructor raised")
    assert supervisor.status()[1].cause.startswith("its restart failed: group 'g' rank 1")
    assert supervisor.status()[0].cause == "killed"
    assert executor.runtimes == [runtime, runtime, runtime]  # watch, then both restarts


@pytest.mark.time_limit(30)
def test_a_restart_that_fails_with_a_foreign_error_counts_as_the_rank_s_death() -> None:
    executor = Executor(RuntimeError("the node is gone"))
    supervisor = supervised(hwplace.Restart(2), executor)
    assert supervisor.died(1, "killed") is True
    assert settled(supervisor) == [("serving", 0), ("serving", 2)]
    assert executor.asked[1] == ([1], 2, "its restart failed: the node is gone")


@pytest.mark.time_limit(30)
def test_a_new_process_s_early_death_that_failed_its_restart_is_not_counted_twice() -> None:
    """The new process died before its restart was seen through, and the restart failed of it: one death, so one
    more restart, not two."""
    gate = threading.Event()
    executor = Executor(hwplace.WorkerError("the new process died", group="g", rank=1), gate=gate)
    supervisor = supervised(hwplace.Restart(3), executor)
    assert supervisor.died(1, "killed") is True
    assert supervisor.died(1, "the new process died") is True  # early: told once the restart is through
    gate.set()
    assert settled(supervisor) == [("serving", 0), ("serving", 2)]
    assert [attempt for _, attempt, _ in executor.asked] == [1, 2]


def test_incarnations_count_every_replacement_and_show_the_peers_a_death_not_restarted_as_dead() -> None:
    incarnations = Incarnations(1)
    published: list[tuple[tuple[int, ...], tuple[str, ...]]] = []
    incarnations.publish(lambda current, states: published.append((current, states)))
    assert incarnations.replace(0) == 1
    assert incarnations.replace(0) == 2
    incarnations.watch(lambda rank, cause: False)  # restarts used up
    assert incarnations.died(0, 2, "killed") is False
    assert published[-1] == ((2,), ("dead",))


def test_incarnations_answer_no_restart_to_later_reports_of_a_death_whose_group_failed_to_answer() -> None:
    incarnations = Incarnations(1)

    def on_death(rank: int, cause: str) -> bool:
        raise RuntimeError("the group could not decide")

    incarnations.watch(on_death)
    with pytest.raises(RuntimeError, match="could not decide"):
        incarnations.died(0, 0, "killed")
    assert incarnations.died(0, 0, "seen again by a call") is False  # answered, not waiting forever


@pytest.mark.time_limit(30)
def test_a_registry_or_executor_that_fails_to_hear_of_a_change_stops_no_restart() -> None:
    class Deaf(Executor):
        def gave_up(self, runtime: GroupRuntime, rank: int) -> None:
            raise RuntimeError("the session ended")

    def on_change(found: list[Any]) -> None:
        raise RuntimeError("the registry did not answer")

    executor = Deaf()
    supervisor = Supervisor("g", PLACEMENTS, hwplace.Restart(1), executor, GroupRuntime(), on_change)
    supervisor.start()
    assert supervisor.died(1, "killed") is True
    assert settled(supervisor) == [("serving", 0), ("serving", 1)]
    failing = Supervisor("h", PLACEMENTS, hwplace.Restart(1), Deaf("cannot start"), GroupRuntime(), on_change)
    failing.start()
    assert failing.died(1, "killed") is False  # told the executor it gave up, which raised: the rank is dead
    assert [s.state for s in failing.status()] == ["serving", "dead"]


@pytest.mark.time_limit(30)
def test_hwplace_status_is_told_the_newest_states_last_and_group_status_is_never_ahead_of_it() -> None:
    """Two threads tell of changes: the death's (restarting) and the restart's end (serving). However their calls
    interleave, the last state hwplace status is told is the newest; and group.status() shows a state only once
    hwplace status was told it (CI once found a rank restarting in group.status() and not yet in hwplace status).
    The death's report is slow here: it lets the restart end, then waits up to a second for it to be told."""
    gate, told_serving = threading.Event(), threading.Event()
    registry: list[list[str]] = []  # what hwplace status would show, in the order the registry got it
    seen_by_status: list[list[str]] = []

    def on_change(found: list[Any]) -> None:
        states = [s.state for s in found]
        seen_by_status.append([s.state for s in supervisor.status()])  # before this one is told: the last told
        if states[1] == "restarting" and not gate.is_set():
            gate.set()  # the restart's constructors return now, while this report is still on its way
            told_serving.wait(1)
        registry.append(states)
        if states[1] == "serving":
            told_serving.set()

    executor = Executor(gate=gate)
    supervisor = Supervisor("g", PLACEMENTS, hwplace.Restart(1), executor, GroupRuntime(), on_change)
    supervisor.start()
    assert supervisor.status()[1].state == "serving"
    assert supervisor.died(1, "killed") is True
    assert settled(supervisor) == [("serving", 0), ("serving", 1)]
    assert registry[-1] == ["serving", "serving"]  # the newest told last, never the restarting told late
    assert registry == [["serving", "restarting"], ["serving", "serving"]]
    assert seen_by_status == [["serving", "serving"], ["serving", "restarting"]]  # never ahead of the registry


def test_incarnations_tell_each_death_once_and_count_a_replaced_process_as_restarted() -> None:
    told: list[tuple[int, str]] = []
    published: list[tuple[tuple[int, ...], tuple[str, ...]]] = []
    incarnations = Incarnations(2)
    assert incarnations.died(0, 0, "before any watch") is False

    def on_death(rank: int, cause: str) -> bool:
        told.append((rank, cause))
        return True  # always "will restart"

    incarnations.watch(on_death)
    incarnations.publish(lambda current, states: published.append((current, states)))
    assert incarnations.died(0, 0, "killed") is True
    assert incarnations.died(0, 0, "seen again by a call") is True
    assert told == [(0, "killed")]
    assert published[-1] == ((0, 0), ("restarting", "serving"))
    assert incarnations.replace(0) == 1
    assert published[-1] == ((1, 0), ("serving", "serving"))
    assert incarnations.replace(1) == 1
    assert incarnations.died(1, 0, "stopped for the restart") is True  # replaced: restarted, not told
    assert incarnations.died(0, 5, "not a process of this rank") is False
    assert told == [(0, "killed")]
    incarnations.gave_up(0)  # its restart failed, none left: the peers see it dead
    assert published[-1] == ((1, 1), ("dead", "serving"))
    incarnations.close()
    assert incarnations.died(0, 1, "after the shutdown") is False
