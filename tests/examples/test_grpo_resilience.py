"""The GRPO example's driver side of trainer restarts (examples/rl-grpo/resilience.py, ``Trainers``) against a
group of this file whose statuses and call outcomes each test sets: when the collective is formed anew, and
which failures end the job. tests/plugins/ray/test_grpo.py kills the real trainers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

import hwplace

pytestmark = pytest.mark.time_limit(60)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rl-grpo" / "resilience.py"
spec = importlib.util.spec_from_file_location("grpo_resilience", EXAMPLE)
assert spec is not None
assert spec.loader is not None
resilience = importlib.util.module_from_spec(spec)
sys.modules["grpo_resilience"] = resilience
spec.loader.exec_module(resilience)


class Done(hwplace.Handle):
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    def wait(self, timeout: float | None = None) -> list[Any]:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return [self.outcome]


class Group:
    """Two trainer ranks: ``restarts`` per rank as ``status()`` says, and a log of the calls made."""

    name = "trainer"
    world_size = 2

    def __init__(self, restarts: list[int]) -> None:
        self.restarts = restarts
        self.calls: list[tuple[str, int]] = []
        self.step_outcomes: list[list[Any]] = []  # per step call, each rank's outcome (then success)

    def status(self) -> list[hwplace.RankStatus]:
        return [hwplace.RankStatus(rank, 0, "serving", used, "") for rank, used in enumerate(self.restarts)]

    def execute_on(self, rank: int) -> tuple[Group, int]:
        return self, rank


def step(target: tuple[Group, int]) -> hwplace.Handle:
    group, rank = target
    group.calls.append(("step", rank))
    outcomes = group.step_outcomes[0] if group.step_outcomes else [{"state": {"v": 1}}, {}]
    if rank == group.world_size - 1 and group.step_outcomes:
        group.step_outcomes.pop(0)
    return Done(outcomes[rank])


def reform(target: tuple[Group, int], generation: int, kept: Any) -> hwplace.Handle:
    group, rank = target
    group.calls.append((f"reform {generation}", rank))
    return Done(None)


def test_a_rank_restarted_between_two_steps_is_formed_in_before_the_next_step() -> None:
    group = Group([0, 1])  # rank 1 died after its last step and is serving again: its process is new
    trainers = resilience.Trainers(group)
    trainers.step(resilience.Producers(), step, reform)
    assert group.calls == [("reform 1", 0), ("reform 1", 1), ("step", 0), ("step", 1)]
    assert [(component, rank) for component, rank, *_ in trainers.restarts] == [("trainer", 1)]
    group.calls.clear()
    trainers.step(resilience.Producers(), step, reform)
    assert group.calls == [("step", 0), ("step", 1)]  # formed: the next step goes straight ahead


def test_a_step_broken_by_a_peer_s_restart_is_formed_anew_though_no_failure_says_restarted() -> None:
    group = Group([0, 0])
    group.step_outcomes = [[hwplace.WorkerError("step() raised RuntimeError: [gloo] Connection closed by peer",
                                                 group="trainer", rank=0), {}]]
    trainers = resilience.Trainers(group)

    def restarted_meanwhile(target: tuple[Group, int]) -> hwplace.Handle:
        handle = step(target)
        group.restarts = [0, 1]  # rank 1 died after its call ended, and came back
        return handle

    trainers.step(resilience.Producers(), restarted_meanwhile, reform)
    assert group.calls == [("step", 0), ("step", 1), ("reform 1", 0), ("reform 1", 1), ("step", 0), ("step", 1)]


def test_a_failure_that_no_restart_explains_ends_the_job() -> None:
    group = Group([0, 0])
    error = hwplace.WorkerError("step() raised ValueError: a bug", group="trainer", rank=0)
    group.step_outcomes = [[error, {}]]
    with pytest.raises(hwplace.WorkerError, match="a bug"):
        resilience.Trainers(group).step(resilience.Producers(), step, reform)
