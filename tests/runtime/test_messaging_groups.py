"""Messaging between workers of two groups on two nodes of each executor (tests/runtime_clusters.py; CPU tensors, gloo):
order per pair, pickled values, dtypes and shapes, broadcast over two groups, timeouts, a peer killed during a recv
(with and without a timeout), a recv cancelled through its call's handle, a first use from two threads at once, a
message the receiver cannot read."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import numpy as np
import pytest

import hwplace

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.time_limit(120)


class Talker(hwplace.Worker):
    def send_all(self, items: list[Any], group: str, rank: int, async_op: bool = False) -> int:
        handles = [self.send(item, group, rank, async_op=async_op) for item in items]
        for handle in handles:
            if async_op:
                assert handle.wait(timeout=30) is None
        return len(items)

    def recv_all(self, count: int, group: str, rank: int, async_op: bool = False) -> list[Any]:
        if async_op:
            handles = [self.recv(group, rank, async_op=True) for _ in range(count)]
            return [handle.wait(timeout=30) for handle in handles]
        return [self.recv(group, rank, timeout=30) for _ in range(count)]

    def recv_with_timeout(self, group: str, rank: int, timeout: float) -> str:
        try:
            return f"got {self.recv(group, rank, timeout=timeout)!r}"
        except TimeoutError as exc:
            return f"TimeoutError: {exc}"

    def recv_error(self, group: str, rank: int) -> str:
        try:
            return f"got {self.recv(group, rank, timeout=60)!r}"
        except hwplace.WorkerError as exc:
            return f"WorkerError group={exc.group} rank={exc.rank} node={exc.node_rank}: {exc}"

    def share(self, value: Any, src: tuple[str, int]) -> Any:
        return self.broadcast(value if (self.group_name, self.rank) == tuple(src) else None, src=src,
                              groups=("trainer", "rollout"))

    def recv_forever(self, group: str, rank: int) -> str:
        try:
            return f"got {self.recv(group, rank)!r}"  # no timeout: only the peer's death may end it
        except hwplace.WorkerError as exc:
            return f"WorkerError group={exc.group} rank={exc.rank} node={exc.node_rank}: {exc}"

    def send_from_threads(self, threads: int, count: int, group: str, rank: int) -> bool:
        """This worker's first messaging use, from ``threads`` threads at once, ``count`` messages each."""
        start = threading.Barrier(threads)

        def send() -> None:
            start.wait()
            for i in range(count):
                self.send(i, group, rank)

        workers = [threading.Thread(target=send) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        return not any(worker.is_alive() for worker in workers)

    def send_unreadable(self, group: str, rank: int) -> bool:
        self.send(Unreadable(), group, rank)
        self.send("readable", group, rank)
        return isinstance(self.send("async", group, rank, async_op=True), hwplace.Pending)

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class Unreadable:
    def __reduce__(self) -> tuple[Any, ...]:
        return int, ("not a number",)  # pickles; loading it raises ValueError


class AsyncTalker(Talker):
    async def recv_async(self, group: str, rank: int) -> Any:
        return await self.recv(group, rank, async_op=True)


@pytest.fixture(scope="module")
def groups(cluster: hwplace.Cluster):
    trainer = Talker.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 1]), name="trainer")
    rollout = Talker.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 1]), name="rollout")
    yield cluster, trainer, rollout
    trainer.shutdown()
    rollout.shutdown()


def test_messages_keep_their_order_types_dtypes_and_shapes_across_nodes(groups) -> None:
    _, trainer, rollout = groups
    items: list[Any] = [torch.arange(6, dtype=torch.float16).reshape(2, 3), {"step": 3, "text": "hi"},
                        torch.ones(2, 2, dtype=torch.bfloat16), torch.tensor(7), torch.zeros(0, 4, dtype=torch.int64),
                        np.arange(5, dtype=np.int32), None, *range(40)]
    got = rollout.execute_on(1).recv_all(len(items), "trainer", 0)  # trainer 0 is on node 0, rollout 1 on node 1
    assert trainer.execute_on(0).send_all(items, "rollout", 1).wait(timeout=60) == [len(items)]
    received = got.wait(timeout=60)[0]
    for sent, came in zip(items, received, strict=True):
        if isinstance(sent, torch.Tensor):
            assert (came.dtype, came.shape) == (sent.dtype, sent.shape)
            assert torch.equal(came, sent)
        elif isinstance(sent, np.ndarray):
            assert came.dtype == sent.dtype
            assert (came == sent).all()
        else:
            assert came == sent


def test_async_handles_and_both_directions_on_one_node(groups) -> None:
    _, trainer, rollout = groups
    got = trainer.execute_on(0).recv_all(20, "rollout", 0, async_op=True)
    assert rollout.execute_on(0).send_all(list(range(20)), "trainer", 0, async_op=True).wait(timeout=60) == [20]
    assert got.wait(timeout=60) == [list(range(20))]


def test_broadcast_over_two_groups_and_two_nodes(groups) -> None:
    _, trainer, rollout = groups
    payload = torch.arange(1000, dtype=torch.float64)
    src = ("rollout", 1)
    handles = [trainer.share(payload, src), rollout.share(payload, src)]
    results = [r for h in handles for r in h.wait(timeout=60)]
    assert len(results) == 4
    assert all(torch.equal(r, payload) for r in results)
    # and again, with a pickled value from a trainer: the communicator is reused
    handles = [trainer.share({"v": 2}, ("trainer", 0)), rollout.share({"v": 2}, ("trainer", 0))]
    assert [r for h in handles for r in h.wait(timeout=60)] == [{"v": 2}] * 4


def test_recv_times_out_and_loses_nothing(groups) -> None:
    _, trainer, rollout = groups
    [answer] = rollout.execute_on(0).recv_with_timeout("trainer", 1, 0.5).wait(timeout=60)
    assert answer.startswith("TimeoutError")
    assert "'trainer' rank 1" in answer
    trainer.execute_on(1).send_all(["late"], "rollout", 0).wait(timeout=60)
    assert rollout.execute_on(0).recv_with_timeout("trainer", 1, 30).wait(timeout=60) == ["got 'late'"]


def test_bad_peers_are_errors_naming_them(groups) -> None:
    _, trainer, _ = groups
    for args, expected in ((("rollout", 5), "ranks 0-1"), (("nobody", 0), "no running worker group named 'nobody'"),
                           (("trainer", 0), "is this worker")):
        with pytest.raises(hwplace.WorkerError, match=expected):
            trainer.execute_on(0).recv_with_timeout(*args, 1).wait(timeout=60)


def test_a_peer_killed_during_a_recv_is_a_worker_error_naming_it(groups) -> None:
    cluster, _, rollout = groups
    victim = Talker.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name="victim")
    try:
        waiting = rollout.execute_on(0).recv_all(1, "victim", 0)
        victim.send_all(["hello"], "rollout", 0).wait(timeout=60)  # the pair is connected
        assert waiting.wait(timeout=60) == [["hello"]]
        waiting = rollout.execute_on(0).recv_error("victim", 0)
        victim.die()
        [answer] = waiting.wait(timeout=60)
        assert answer.startswith("WorkerError group=victim rank=0 node=1"), answer
        assert "died" in answer
    finally:
        victim.shutdown()


def test_a_peer_on_another_node_killed_during_a_recv_without_a_timeout_is_a_worker_error(groups) -> None:
    cluster, _, rollout = groups
    victim = Talker.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name="victim2")
    try:
        waiting = rollout.execute_on(0).recv_all(1, "victim2", 0)
        victim.send_all(["hello"], "rollout", 0).wait(timeout=60)  # the pair is connected
        assert waiting.wait(timeout=60) == [["hello"]]
        waiting = rollout.execute_on(0).recv_forever("victim2", 0)
        victim.die()
        [answer] = waiting.wait(timeout=90)  # the module's time limit stands behind a hang
        assert answer.startswith("WorkerError group=victim2 rank=0 node=1"), answer
    finally:
        victim.shutdown()


def test_an_async_recv_cancelled_through_its_handle_loses_no_message(groups) -> None:
    cluster, trainer, _ = groups
    waiter = AsyncTalker.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name="waiter")
    try:
        handle = waiter.recv_async("trainer", 0)
        assert isinstance(handle, hwplace.Pending)
        with pytest.raises(TimeoutError, match="did not finish within 2 s"):
            handle.wait(timeout=2)  # its recv waits
        assert handle.cancel()
        with pytest.raises(hwplace.CallCancelled, match="recv_async"):
            handle.wait(timeout=60)
        trainer.execute_on(0).send_all(["one", "two"], "waiter", 0).wait(timeout=60)
        assert waiter.recv_all(2, "trainer", 0).wait(timeout=60) == [["one", "two"]]
    finally:
        waiter.shutdown()


def test_a_first_use_from_two_threads_at_once_makes_one_pair(groups) -> None:
    cluster, _, _ = groups
    two = hwplace.NodePlacementStrategy([0])
    left = Talker.create_group().launch(cluster, two, name="left")
    right = Talker.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name="right")
    try:
        got = right.recv_all(30, "left", 0)
        assert left.send_from_threads(2, 15, "right", 0).wait(timeout=60) == [True]
        [received] = got.wait(timeout=60)
        assert sorted(received) == sorted(list(range(15)) * 2)
    finally:
        left.shutdown()
        right.shutdown()


def test_a_message_the_receiver_cannot_read_fails_that_recv_only(groups) -> None:
    _, trainer, rollout = groups
    waiting = rollout.execute_on(1).recv_error("trainer", 1)  # the pair's first use: both ends meet
    assert trainer.execute_on(1).send_unreadable("rollout", 1).wait(timeout=60) == [True]
    [answer] = waiting.wait(timeout=60)
    assert answer.startswith("WorkerError group=trainer rank=1 node=1"), answer
    assert "cannot read" in answer
    assert "ValueError" in answer
    assert rollout.execute_on(1).recv_all(2, "trainer", 1).wait(timeout=60) == [["readable", "async"]]
