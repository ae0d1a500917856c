"""The turn arbiter's rules (hwplace.runtime.turns.arbiter.TurnTable), without a transport: who enters, in what order,
with which hooks, and what a timeout or a dead worker releases."""

from __future__ import annotations

from typing import Any

import pytest

import hwplace
from hwplace.runtime.turns.arbiter import TurnTable
from hwplace.runtime.turns.client import Turn

A0, A1 = ("fake-accelerator", 0), ("fake-accelerator", 1)


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, bool, bool]] = []

    def reply(self, who: str) -> Any:
        return lambda granted, onload: self.events.append((who, granted, onload))


def test_one_group_at_a_time_first_come_first_served() -> None:
    table, log = TurnTable(), Log()
    assert table.acquire("t0", "trainer", [A0], log.reply("t0"), "trainer rank 0") is None
    waiting_r = table.acquire("r0", "rollout", [A0], log.reply("r0"), "rollout rank 0")
    waiting_e = table.acquire("e0", "eval", [A0], log.reply("e0"))
    assert waiting_r is not None
    assert waiting_e is not None
    assert log.events == [("t0", True, False)]
    assert table.holders([A0]) == ["trainer rank 0"]
    assert table.wanted("t0")
    table.release("t0")
    assert log.events[-1] == ("r0", True, True)  # after another group's turn: onload
    table.release("r0")
    assert log.events[-1] == ("e0", True, True)
    table.release("e0")
    assert not table.wanted("e0")


def test_a_later_request_of_the_holding_group_does_not_jump_a_waiting_group() -> None:
    table, log = TurnTable(), Log()
    table.acquire("t0", "trainer", [A0], log.reply("t0"))
    table.acquire("r0", "rollout", [A0], log.reply("r0"))
    assert table.acquire("t1", "trainer", [A0], log.reply("t1")) is not None  # behind the rollout
    table.release("t0")
    assert [who for who, _, _ in log.events] == ["t0", "r0"]
    table.release("r0")
    assert [who for who, _, _ in log.events] == ["t0", "r0", "t1"]


def test_workers_of_one_group_share_a_turn_and_other_units_are_free() -> None:
    table, log = TurnTable(), Log()
    table.acquire("t0", "trainer", [A0], log.reply("t0"))
    table.acquire("t1", "trainer", [A0, A1], log.reply("t1"))
    table.acquire("r1", "rollout", [A1], log.reply("r1"))
    assert [who for who, _, _ in log.events] == ["t0", "t1"]
    table.release("t1")
    assert log.events[-1] == ("r1", True, True)  # A1 is free although the trainer still holds A0; it held A1 last
    table.release("t0")


def test_the_same_group_again_gets_no_onload() -> None:
    table, log = TurnTable(), Log()
    for _ in range(2):
        table.acquire("t0", "trainer", [A0], log.reply("t0"))
        table.release("t0")
    assert log.events == [("t0", True, False)] * 2


def test_a_timed_out_request_replies_false_and_lets_later_ones_in() -> None:
    table, log = TurnTable(), Log()
    table.acquire("t0", "trainer", [A0, A1], log.reply("t0"))
    request = table.acquire("r0", "rollout", [A0], log.reply("r0"))
    assert request is not None
    table.release("t0")
    table.acquire("t0", "trainer", [A1], log.reply("t0 again"))  # A1 is not wanted by the waiter
    assert log.events[-1] == ("t0 again", True, False)
    table.acquire("t0b", "trainer", [A0], log.reply("t0b"))  # A0 is granted to r0 already
    assert log.events[-2] == ("r0", True, True)
    table.cancel(request)  # granted already: nothing happens
    table.release("r0")
    assert log.events[-1] == ("t0b", True, True)
    waiting = table.acquire("r0", "rollout", [A0], log.reply("r0 late"))
    assert waiting is not None
    table.cancel(waiting)
    assert log.events[-1] == ("r0 late", False, False)


def test_a_dead_owner_releases_its_turn_and_withdraws_its_waits() -> None:
    table, log = TurnTable(), Log()
    table.acquire("t0", "trainer", [A0], log.reply("t0"))
    table.acquire("r0", "rollout", [A0], log.reply("r0"))
    table.acquire("e0", "eval", [A0], log.reply("e0"))
    table.drop("r0")  # died waiting: never answered
    table.drop("t0")  # died holding
    assert log.events == [("t0", True, False), ("e0", True, True)]


def test_holding_twice_is_refused() -> None:
    table, log = TurnTable(), Log()
    table.acquire("t0", "trainer", [A0], log.reply("t0"), "trainer rank 0")
    with pytest.raises(ValueError, match="trainer rank 0 already holds a turn"):
        table.acquire("t0", "trainer", [A0], log.reply("t0"), "trainer rank 0")


@pytest.mark.parametrize("timeout", [-1, float("nan"), "5", True])
def test_a_turn_refuses_a_bad_timeout(timeout: Any) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^timeout: .*allowed: None or float\('inf'\) \(no limit\)"):
        Turn(None, timeout)  # type: ignore[arg-type]


def test_an_infinite_turn_timeout_is_no_limit() -> None:
    assert Turn(None, float("inf"))._timeout is None  # type: ignore[arg-type]
