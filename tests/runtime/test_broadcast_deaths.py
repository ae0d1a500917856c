"""A broadcast set with a member that dies (hwplace.runtime.messaging.broadcast), on both executors
(tests/runtime_clusters.py): a member killed before a broadcast, one that dies while the others wait to connect,
a source killed while the others wait in a broadcast of a set connected earlier, and a member killed while the others
wait for a live source (gloo never ends that wait): every survivor's broadcast raises a ``WorkerError`` naming the
dead member (group, rank, node) rather than wait; a later broadcast over the set raises it again. A member restarted
in place (``hwplace.Restart``): the broadcast it ended says ``restarted``, and the next one over the set, which every
member calls, the restarted one too, builds the set anew and the value arrives. The survivors' broadcasts have no
timeout of their own and the test waits for them without one: the module's time limit stands behind a hang."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

import hwplace

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.time_limit(240)

SPREAD = hwplace.NodePlacementStrategy([0, 1])  # rank 0 on node 0, rank 1 on node 1
ON_NODE_1 = hwplace.NodePlacementStrategy([1])


class Member(hwplace.Worker):
    def share(self, value: Any, src: tuple[str, int], groups: tuple[str, ...], times: int = 1) -> list[str]:
        """What each of ``times`` broadcasts returned (its ``repr``), or the ``WorkerError`` it raised."""
        said = []
        for _ in range(times):
            try:
                said.append(repr(self.broadcast(value, src=tuple(src), groups=tuple(groups))))  # type: ignore[arg-type]
            except hwplace.WorkerError as exc:
                said.append(f"WorkerError group={exc.group} rank={exc.rank} node={exc.node_rank} "
                            f"restarted={exc.restarted}: {exc}")
        return said

    def die_in(self, seconds: float) -> bool:
        """SIGKILL this process ``seconds`` from now (the call returns at once)."""
        def kill() -> None:
            time.sleep(seconds)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()
        return True

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def launch(cluster: hwplace.Cluster, name: str, strategy: hwplace.NodePlacementStrategy = SPREAD,
           restart: hwplace.Restart | None = None) -> hwplace.WorkerGroup:
    return Member.create_group().launch(cluster, strategy, name=name, restart=restart)


def kill(group: hwplace.WorkerGroup, rank: int) -> None:
    with pytest.raises(hwplace.WorkerError, match="died"):
        group.execute_on(rank).die().wait()


def test_a_member_killed_before_a_broadcast_fails_the_others_naming_it(cluster: hwplace.Cluster) -> None:
    trainer, victim = launch(cluster, "bt1"), launch(cluster, "bv1", ON_NODE_1)
    try:
        kill(victim, 0)
        [first, again] = trainer.share(7, ("bt1", 0), ("bt1", "bv1"), times=2).wait()  # no timeout: see the module
        for said in first + again:
            assert said.startswith("WorkerError group=bv1 rank=0 node=1 restarted=False"), said
            assert "died" in said, said
    finally:
        trainer.shutdown()
        victim.shutdown()


def test_a_member_that_dies_while_the_others_wait_to_connect_is_named(cluster: hwplace.Cluster) -> None:
    trainer, victim = launch(cluster, "bt2"), launch(cluster, "bv2", ON_NODE_1)
    try:
        waiting = trainer.share(7, ("bt2", 0), ("bt2", "bv2"))  # the victim never calls broadcast
        assert victim.die_in(0.5).wait() == [True]
        for [said] in waiting.wait():
            assert said.startswith("WorkerError group=bv2 rank=0 node=1 restarted=False"), said
    finally:
        trainer.shutdown()
        victim.shutdown()


def test_a_source_killed_after_an_earlier_broadcast_fails_the_next_one(cluster: hwplace.Cluster) -> None:
    trainer, victim = launch(cluster, "bt3"), launch(cluster, "bv3", ON_NODE_1)
    groups = ("bt3", "bv3")
    try:
        shared = [trainer.share("one", ("bv3", 0), groups), victim.share("one", ("bv3", 0), groups)]
        assert [said for handle in shared for said in handle.wait()] == [["'one'"]] * 3
        waiting = trainer.share(None, ("bv3", 0), groups)  # the set is connected: they wait in the broadcast
        assert victim.die_in(0.5).wait() == [True]
        for [said] in waiting.wait():
            assert said.startswith("WorkerError group=bv3 rank=0 node=1 restarted=False"), said
        for [said] in trainer.share(None, ("bt3", 0), groups).wait():  # and every later broadcast over the set
            assert said.startswith("WorkerError group=bv3 rank=0 node=1 restarted=False"), said
    finally:
        trainer.shutdown()
        victim.shutdown()


def test_a_member_killed_while_the_others_wait_in_a_broadcast_is_named(cluster: hwplace.Cluster) -> None:
    trainer, victim = launch(cluster, "bt5"), launch(cluster, "bv5", ON_NODE_1)
    groups = ("bt5", "bv5")
    try:
        shared = [trainer.share("one", ("bt5", 0), groups), victim.share("one", ("bt5", 0), groups)]
        assert [said for handle in shared for said in handle.wait()] == [["'one'"]] * 3
        # trainer 1 waits for its source, trainer 0, which is alive and has not called yet: gloo sees nothing end
        waiting = trainer.execute_on(1).share(None, ("bt5", 0), groups)
        assert victim.die_in(0.5).wait() == [True]
        [[said]] = waiting.wait()
        assert said.startswith("WorkerError group=bv5 rank=0 node=1 restarted=False"), said
        [[said]] = trainer.execute_on(0).share("two", ("bt5", 0), groups).wait()  # the source, later: at once
        assert said.startswith("WorkerError group=bv5 rank=0 node=1 restarted=False"), said
    finally:
        trainer.shutdown()
        victim.shutdown()


def test_a_restarted_member_rejoins_the_set_on_the_next_broadcast(cluster: hwplace.Cluster) -> None:
    trainer, rollout = launch(cluster, "bt4"), launch(cluster, "br4", restart=hwplace.Restart(max_restarts=1))
    groups = ("bt4", "br4")
    try:
        shared = [trainer.share("one", ("bt4", 0), groups), rollout.share("one", ("bt4", 0), groups)]
        assert [said for handle in shared for said in handle.wait()] == [["'one'"]] * 4
        # the others wait for rollout 1, the source, which is killed: its group restarts it, and the error says so
        waiting = [trainer.share(None, ("br4", 1), groups), rollout.execute_on(0).share(None, ("br4", 1), groups)]
        assert rollout.execute_on(1).die_in(1.0).wait() == [True]  # a second for the others to start waiting
        for said in [said for handle in waiting for [said] in handle.wait()]:
            assert said.startswith("WorkerError group=br4 rank=1 node=1 restarted=True"), said
        while rollout.status()[1].restarts != 1 or rollout.status()[1].state != "serving":
            time.sleep(0.05)
        value = torch.arange(5.0)
        shared = [trainer.share(value, ("bt4", 1), groups), rollout.share(value, ("bt4", 1), groups)]
        assert [said for handle in shared for said in handle.wait()] == [[repr(value)]] * 4
        shared = [trainer.share("three", ("br4", 1), groups), rollout.share("three", ("br4", 1), groups)]
        assert [said for handle in shared for said in handle.wait()] == [["'three'"]] * 4  # from the new process
    finally:
        trainer.shutdown()
        rollout.shutdown()


def test_a_group_restarted_whole_forms_its_collective_anew(cluster: hwplace.Cluster) -> None:
    group = launch(cluster, "bg3", restart=hwplace.Restart(max_restarts=1, scope="group"))
    groups = ("bg3",)
    try:
        assert group.share("one", ("bg3", 0), groups).wait() == [["'one'"]] * 2
        # rank 1 dies while rank 0 waits in a broadcast from it: the group's restart stops rank 0 too
        waiting = group.execute_on(0).share(None, ("bg3", 1), groups)
        assert group.execute_on(1).die_in(1.0).wait() == [True]
        try:  # its broadcast fails naming a member the group's restart took (rank 1, or rank 0 itself once the
            # restart marked it too), unless the restart stopped rank 0 first
            said = waiting.wait()[0][0]
        except hwplace.WorkerError as exc:
            said = f"stopped restarted={exc.restarted}"
        assert said.startswith(("WorkerError group=bg3 rank=1 node=1 restarted=True",
                                "WorkerError group=bg3 rank=0 node=0 restarted=True", "stopped restarted=True")), said
        while [(s.restarts, s.state) for s in group.status()] != [(1, "serving")] * 2:
            time.sleep(0.05)
        value = torch.arange(4.0)
        for src in (0, 1):  # both new processes form the set anew, each end a source
            assert group.share(value, ("bg3", src), groups, 2).wait() == [[repr(value)] * 2] * 2
    finally:
        group.shutdown()
