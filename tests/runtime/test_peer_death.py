"""A peer SIGKILLed in the middle of sending a large message (hwplace.runtime.messaging.pair): the survivor's
``recv``, waiting with no timeout, raises a ``WorkerError`` naming the dead peer rather than wait for ever (gloo
never releases the receive it was reading into; the pair's watcher does). Two groups of child processes
(hwplace.testing.process_cluster), no Ray."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

import hwplace
from hwplace.testing import process_cluster

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.time_limit(120)  # without the watcher the survivor's recv never returns

TENSOR_BYTES = 128 * 2**20  # a payload takes long enough to be read that the kill lands inside one


class Streamer(hwplace.Worker):
    def stream_until_killed(self, group: str, rank: int) -> None:
        tensor = torch.ones(TENSOR_BYTES // 4)
        self.send(tensor, group, rank)  # the pair is up and the peer reads: the next send is killed half-way
        threading.Thread(target=self._kill_soon, daemon=True).start()
        while True:
            self.send(tensor, group, rank)

    def _kill_soon(self) -> None:
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)


class Survivor(hwplace.Worker):
    def read_until_error(self, group: str, rank: int) -> tuple[int, str, str]:
        """How many messages came before a ``recv`` (no timeout) raised, the error, and what a later one raises."""
        count = 0
        while True:
            try:
                self.recv(group, rank)
            except hwplace.WorkerError as exc:
                first = f"{exc.group} {exc.rank} {exc.node_rank}: {exc}"
                break
            count += 1
        try:
            later = f"got {self.recv(group, rank)!r}"
        except hwplace.WorkerError as exc:
            later = str(exc)
        return count, first, later


@pytest.fixture(scope="module")
def cluster() -> Iterator[hwplace.Cluster]:
    with process_cluster(1, 1, job_name="peer-death-tests") as made:
        yield made


def test_a_peer_killed_while_sending_a_large_tensor_fails_the_survivors_recv(cluster: hwplace.Cluster) -> None:
    streamer = Streamer.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="streamer")
    survivor = Survivor.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="survivor")
    try:
        reading = survivor.execute_on(0).read_until_error("streamer", 0)
        with pytest.raises(hwplace.WorkerError, match="died"):
            streamer.execute_on(0).stream_until_killed("survivor", 0).wait()
        [(count, first, later)] = reading.wait()
        assert count >= 1, first
        assert first.startswith("streamer 0 0: "), first
        assert "died or shut down" in first, first
        assert "died or shut down" in later, later
    finally:
        streamer.shutdown()
        survivor.shutdown()
