"""Turns on shared accelerators, on two nodes of each executor (tests/runtime_clusters.py): trainer rank i and rollout
rank i share fake accelerator i of node 0 (``rollout,trainer: 0-1``); ``solo`` has accelerator 0 of node 1 to itself.

Each worker records what happens in its turns into a channel queue per accelerator. Records are put inside
the turn, so a queue's order is the order of the turns on that accelerator.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

import hwplace

pytestmark = pytest.mark.time_limit(240)  # a turn that is never granted fails its test rather than hangs

CONFIG = {"cluster": {"num_nodes": 2, "component_placement": {"rollout,trainer": "0-1", "solo": "4"}}}
CLUSTER = CONFIG["cluster"]


class Taker(hwplace.Worker):
    def __init__(self, log: hwplace.Channel) -> None:
        self.log = log

    def record(self, what: str) -> None:
        self.log.put((what, self.group_name), weight=1, queue_name=f"acc{self.rank}")

    def onload(self) -> None:
        self.record("onload")

    def offload(self) -> None:
        self.record("offload")

    def turns(self, count: int, hold: float) -> int:
        for _ in range(count):
            with self.turn(timeout=120):
                self.record("enter")
                time.sleep(hold)
                self.record("leave")
        return count

    def hold_until_told(self) -> None:
        """One turn held until the driver says go, then another turn at once."""
        with self.turn(timeout=120):
            self.record("enter")
            self.log.get(queue_name="go", timeout=120)
            self.record("leave")
        with self.turn(timeout=120):
            self.record("enter")
            self.record("leave")

    def ask_for_turn(self, timeout: float | None = 120) -> str:
        self.log.put(self.group_name, weight=1, queue_name="asking")
        try:
            with self.turn(timeout=timeout):
                self.record("enter")
                self.record("leave")
        except TimeoutError as exc:
            return f"TimeoutError: {exc}"
        return "had a turn"

    async def nested(self) -> str:
        async with self.turn(timeout=60):
            with self.turn(timeout=60), self.turn():
                return "nested"

    def hold_once(self) -> None:
        """One turn, held until the driver says go."""
        with self.turn(timeout=120):
            self.record("enter")
            self.log.get(queue_name="go", timeout=120)
            self.record("leave")

    async def _one_turn(self, timeout: float, hold: float = 0.0) -> str:
        try:
            async with self.turn(timeout=timeout):
                await asyncio.sleep(hold)
        except TimeoutError as exc:
            return f"TimeoutError: {exc}"
        return "had a turn"

    async def two_waiters(self) -> list[str]:
        """A coroutine waits for the turn; a second one, with a timeout of 1 s, must not wait for the first."""
        first = asyncio.ensure_future(self._one_turn(120))
        await asyncio.sleep(0.5)  # the first one's request is at the arbiter
        second = await self._one_turn(1)
        self.log.put(second, weight=1, queue_name="second")
        return [await first, second]

    async def many_at_once(self, coroutines: int, rounds: int) -> list[str]:
        """Coroutines of this worker taking turns all at once, each several times."""
        async def taking() -> str:
            for _ in range(rounds):
                outcome = await self._one_turn(60, 0.001)
                if outcome != "had a turn":
                    return outcome
            return "had a turn"

        return sorted(set(await asyncio.gather(*(taking() for _ in range(coroutines)), return_exceptions=False)))

    async def wait_for_turn(self) -> str:
        self.log.put(self.group_name, weight=1, queue_name="asking")
        return await self._one_turn(120)

    def die_in_turn(self) -> None:
        with self.turn(timeout=120):
            self.log.put("holding", weight=1, queue_name="dying")
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def log(cluster: hwplace.Cluster):
    channel = hwplace.Channel.create("turns-log")
    yield channel
    channel.close()


@pytest.fixture(scope="module")
def groups(cluster: hwplace.Cluster, log: hwplace.Channel):
    plan = hwplace.ComponentPlacement(CONFIG, cluster)
    launched = {name: Taker.create_group(log).launch(cluster, plan.get_strategy(name), name=f"turns-{name}")
                for name in ("trainer", "rollout", "solo")}
    yield launched
    for group in launched.values():
        group.shutdown()


def drain(log: hwplace.Channel, queue_name: str) -> list[Any]:
    got = []
    while log.qsize(queue_name):
        got.append(log.get_nowait(queue_name))
    return got


def entered(log: hwplace.Channel, accelerator: str, group: str) -> None:
    """Until ``group``'s worker records that it entered its turn on ``accelerator``: it holds the turn now. Records
    before it are passed over: this turn's onload, or one of an earlier call's (``nested()`` onloads after the other
    group's turns, and records nothing else), which says nothing of this turn."""
    while log.get(queue_name=accelerator, timeout=60) != ("enter", group):
        pass


def runs(events: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The events split into maximal runs of one group: ``[(group, [what, ...]), ...]``."""
    split: list[tuple[str, list[str]]] = []
    for what, group in events:
        if not split or split[-1][0] != group:
            split.append((group, []))
        split[-1][1].append(what)
    return split


def test_turns_of_two_groups_on_one_accelerator_never_overlap(groups: dict[str, hwplace.WorkerGroup],
                                                              log: hwplace.Channel) -> None:
    trainer, rollout = groups["trainer"].turns(6, 0.02), groups["rollout"].turns(6, 0.02)
    assert trainer.wait(timeout=180) == [6, 6]
    assert rollout.wait(timeout=180) == [6, 6]
    for accelerator in ("acc0", "acc1"):
        split = runs(drain(log, accelerator))
        assert {group for group, _ in split} == {"turns-trainer", "turns-rollout"}
        offloaded = {"turns-trainer": False, "turns-rollout": False}
        for index, (group, events) in enumerate(split):
            body = [e for e in events if e not in ("onload", "offload")]
            assert body == ["enter", "leave"] * (len(body) // 2), f"turns overlap on {accelerator}: {split}"
            # onload exactly when the worker comes back after it offloaded; offload only when another group
            # takes over (never at the end, when nobody waits)
            assert (events[0] == "onload") == offloaded[group], split
            assert events.count("onload") <= 1
            assert events.count("offload") <= 1
            offloaded[group] = events[-1] == "offload"
            if offloaded[group]:
                assert index < len(split) - 1, split


def test_a_waiting_group_goes_first_and_hooks_run_only_for_a_handover(groups: dict[str, hwplace.WorkerGroup],
                                                                      log: hwplace.Channel) -> None:
    trainer, rollout = groups["trainer"].execute_on(0), groups["rollout"].execute_on(0)
    assert rollout.turns(1, 0).wait(timeout=60) == [1]  # one turn each, with nobody waiting: both onloaded
    assert trainer.turns(1, 0).wait(timeout=60) == [1]
    drain(log, "acc0")
    holding = trainer.hold_until_told()
    assert log.get(queue_name="acc0", timeout=60) == ("enter", "turns-trainer")  # the trainer's turn again: no onload
    asking = rollout.ask_for_turn()  # only now: asked at once, the rollout could come before the trainer
    assert log.get(queue_name="asking", timeout=60) == "turns-rollout"
    time.sleep(1.0)  # the rollout's request reaches the arbiter while the trainer holds its turn
    log.put("go", queue_name="go")
    holding.wait(timeout=60)
    assert asking.wait(timeout=60) == ["had a turn"]
    events = drain(log, "acc0")
    # the rollout offloads too if the trainer's second request came before it left (it nearly always does)
    assert [e for e in events if e != ("offload", "turns-rollout")] == [
        ("leave", "turns-trainer"),
        ("offload", "turns-trainer"),  # left while the rollout waits
        ("enter", "turns-rollout"), ("leave", "turns-rollout"),  # the rollout asked first (it was onloaded)
        ("onload", "turns-trainer"), ("enter", "turns-trainer"), ("leave", "turns-trainer"),  # before the trainer
    ]


def test_turns_are_reentrant_and_a_timeout_names_the_holder(groups: dict[str, hwplace.WorkerGroup],
                                                            log: hwplace.Channel) -> None:
    assert groups["trainer"].nested().wait(timeout=60) == ["nested", "nested"]
    holding = groups["trainer"].execute_on(1).hold_until_told()
    entered(log, "acc1", "turns-trainer")
    [message] = groups["rollout"].execute_on(1).ask_for_turn(0.5).wait(timeout=60)
    assert message == ("TimeoutError: turns-rollout rank 1: no turn on fake-accelerator 1 within 0.5 s "
                       "(held by turns-trainer rank 1)")
    log.put("go", queue_name="go")
    holding.wait(timeout=60)
    drain(log, "acc1")
    drain(log, "asking")


def test_a_group_sharing_nothing_takes_turns_freely(groups: dict[str, hwplace.WorkerGroup],
                                                    log: hwplace.Channel) -> None:
    assert groups["solo"].turns(3, 0).wait(timeout=60) == [3]
    assert [what for what, _ in drain(log, "acc0")] == ["enter", "leave"] * 3  # no hooks: nobody shares
    assert groups["solo"].nested().wait(timeout=60) == ["nested"]


def test_a_holder_killed_in_its_turn_releases_it(groups: dict[str, hwplace.WorkerGroup],
                                                 log: hwplace.Channel) -> None:
    dying = groups["trainer"].execute_on(1).die_in_turn()
    assert log.get(queue_name="dying", timeout=60) == "holding"
    with pytest.raises(hwplace.WorkerError, match=r"rank 1 on node 0: die_in_turn\(\) failed: the worker process "
                                                  r"has died"):
        dying.wait(timeout=60)
    assert groups["rollout"].execute_on(1).ask_for_turn(60).wait(timeout=90) == ["had a turn"]


def test_a_timeout_holds_while_another_coroutine_of_the_worker_waits(groups: dict[str, hwplace.WorkerGroup],
                                                                     log: hwplace.Channel) -> None:
    holding = groups["trainer"].execute_on(0).hold_once()
    entered(log, "acc0", "turns-trainer")
    waiting = groups["rollout"].execute_on(0).two_waiters()
    second = log.get(queue_name="second", timeout=30)  # without the fix: it waits for the first one's turn
    assert second == ("TimeoutError: turns-rollout rank 0: no turn on fake-accelerator 0 within 1 s (another call "
                      "of this worker was still entering or leaving its turn)")
    log.put("go", queue_name="go")
    holding.wait(timeout=60)
    assert waiting.wait(timeout=60) == [["had a turn", second]]
    drain(log, "acc0")


def test_coroutines_of_one_worker_take_turns_at_once(groups: dict[str, hwplace.WorkerGroup],
                                                     log: hwplace.Channel) -> None:
    rivals = groups["trainer"].execute_on(0).turns(20, 0.005)  # another group on the accelerator: real handovers
    assert groups["rollout"].execute_on(0).many_at_once(8, 10).wait(timeout=120) == [["had a turn"]]
    assert rivals.wait(timeout=120) == [20]
    drain(log, "acc0")


def test_a_cancelled_wait_for_a_turn_leaves_no_turn_held(groups: dict[str, hwplace.WorkerGroup],
                                                         log: hwplace.Channel) -> None:
    holding = groups["trainer"].execute_on(0).hold_once()
    entered(log, "acc0", "turns-trainer")
    waiting = groups["rollout"].execute_on(0).wait_for_turn()
    assert log.get(queue_name="asking", timeout=60) == "turns-rollout"
    time.sleep(0.5)  # its request reaches the arbiter
    assert waiting.cancel() is True
    with pytest.raises(hwplace.CallCancelled, match=r"wait_for_turn\(\) was cancelled"):
        waiting.wait(timeout=60)
    log.put("go", queue_name="go")
    holding.wait(timeout=60)
    # the cancelled request is granted after the trainer's turn, and given back at once: the trainer gets a turn
    assert groups["trainer"].execute_on(0).ask_for_turn(30).wait(timeout=60) == ["had a turn"]
    drain(log, "acc0")
    drain(log, "asking")
