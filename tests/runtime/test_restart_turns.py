"""Restart in place meets turns (SPEC §12, §9), on both executors: trainer rank i and rollout rank i share fake
accelerator i of node 0; the trainer restarts. A rank killed inside its turn, or inside ``offload()`` while
handing the turn over, releases it: the other group gets the turn, and the restarted rank queues again."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

import hwplace

pytestmark = pytest.mark.time_limit(240)  # a turn never granted fails its test rather than hangs

CLUSTER = {"num_nodes": 1, "component_placement": {"rollout,trainer": "0-1"}}


class Sharer(hwplace.Worker):
    def __init__(self, log: hwplace.Channel) -> None:
        self.log = log
        self.die_in_offload = False
        self.attempt = 0

    def on_restart(self, info: Any) -> None:
        self.attempt = info.attempt

    def arm(self) -> None:
        self.die_in_offload = True

    def offload(self) -> None:
        if self.die_in_offload:
            os.kill(os.getpid(), signal.SIGKILL)

    def die_in_turn(self) -> None:
        with self.turn(timeout=120):
            self.log.put("holding", queue_name="dying")
            os.kill(os.getpid(), signal.SIGKILL)

    def hold_until_told(self) -> None:
        with self.turn(timeout=120):
            self.log.put("holding", queue_name="held")
            self.log.get(queue_name="go", timeout=120)

    def ask_for_turn(self) -> tuple[str, int]:
        with self.turn(timeout=120):
            return "had a turn", self.attempt


@pytest.fixture
def groups(cluster: hwplace.Cluster) -> Any:
    log = hwplace.Channel.create(f"restart-turns-log-{os.urandom(4).hex()}")
    plan = hwplace.ComponentPlacement({"cluster": CLUSTER}, cluster)
    trainer = Sharer.create_group(log).launch(cluster, plan.get_strategy("trainer"), name="rt-trainer",
                                              restart=hwplace.Restart(max_restarts=2))
    rollout = Sharer.create_group(log).launch(cluster, plan.get_strategy("rollout"), name="rt-rollout")
    yield trainer, rollout, log
    rollout.shutdown()
    trainer.shutdown()
    log.close()


def restarted(group: hwplace.WorkerGroup, rank: int, restarts: int) -> None:
    while group.status()[rank].restarts < restarts or group.status()[rank].state != "serving":
        time.sleep(0.05)


def test_a_rank_killed_inside_its_turn_releases_it_and_queues_again_once_restarted(groups: Any) -> None:
    trainer, rollout, log = groups
    dying = trainer.execute_on(0).die_in_turn()
    assert log.get(queue_name="dying") == "holding"
    with pytest.raises(hwplace.WorkerError, match="it is being restarted") as caught:
        dying.wait()
    assert caught.value.restarted is True
    assert rollout.execute_on(0).ask_for_turn().wait() == [("had a turn", 0)]  # the turn was released
    restarted(trainer, 0, 1)
    assert trainer.execute_on(0).ask_for_turn().wait() == [("had a turn", 1)]  # the new process takes turns


def test_a_rank_killed_inside_offload_hands_the_turn_over_all_the_same(groups: Any) -> None:
    trainer, rollout, log = groups
    trainer.execute_on(1).arm().wait()
    holding = trainer.execute_on(1).hold_until_told()
    assert log.get(queue_name="held") == "holding"
    asking = rollout.execute_on(1).ask_for_turn()  # waits: its leave will ask the trainer to offload
    time.sleep(0.5)  # (no assertion on time: only gives the request a moment to reach the arbiter first)
    log.put("go", queue_name="go")
    with pytest.raises(hwplace.WorkerError, match="it is being restarted"):
        holding.wait()  # killed inside offload()
    assert asking.wait() == [("had a turn", 0)]
    restarted(trainer, 1, 1)
    assert trainer.execute_on(1).ask_for_turn().wait() == [("had a turn", 1)]
