"""hwplace.testing.ProcessExecutor: workers as child processes on simulated nodes of this machine, no Ray.

What is this executor's own, on a two-node process cluster with four fake accelerators per node: groups, rank
order, failures and dead workers, handles, large channel items through its hub, pickling into workers, leases
and status, and no process left behind. Cancellation, channels between workers, weight sync, messaging and turns
run on it, as on Ray, in the runtime's tests (tests/runtime_clusters.py).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from pids import running

import hwplace
from hwplace.executor import Leases, Rendezvous, current_executor, require
from hwplace.testing import ProcessExecutor, process_cluster

pytestmark = pytest.mark.time_limit(240)  # a call that never answers fails its test rather than hangs

# trainer rank 0 holds accelerator 0 of node 0; rollout 0 shares it, rollout 1 is on node 0, rollout 2 on node 1;
# left and right share accelerators 5 and 6 (node 1), and take turns on them
CLUSTER = {"component_placement": {"trainer": "0", "rollout": "0,2,4", "left,right": "5-6"}}
CONFIG = {"cluster": {"num_nodes": 2, **CLUSTER}}


class Echo(hwplace.Worker):
    def __init__(self, fail: bool = False) -> None:
        if fail:
            raise ValueError("constructor refused")
        self.seen: list[int] = []

    def run(self, x: int) -> int:
        return x + self.rank

    def where(self) -> tuple[str | None, str | None, int]:
        return os.environ.get("HWPLACE_NODE_RANK"), os.environ.get("HWPLACE_FAKE_ACCELERATORS"), self.node_rank

    def note(self, value: int) -> None:
        time.sleep(0.01 * (3 - value % 3))  # later calls would overtake earlier ones if they ran at once
        self.seen.append(value)

    def noted(self) -> list[int]:
        return self.seen

    def explode(self) -> None:
        raise KeyError("no such thing")

    def pid(self) -> int:
        return os.getpid()

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slept"

    async def double(self, x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    def unpicklable(self) -> Any:
        return lambda: None

    def executor_here(self) -> tuple[str, str, list[int]]:
        executor = current_executor()
        entry = executor.find_group(self.group_name)
        assert entry is not None
        require(executor, Rendezvous).kv_put(f"from-{self.rank}", b"hello")
        return executor.name, executor.where(), [p.rank for p in entry.placements]

    def lease(self, record: Any) -> str:
        """Register a group as a second job would (this process's own), and say what the lease book answered."""
        try:
            require(current_executor(), Leases).register_group(record)
        except hwplace.PlacementError as exc:
            return f"PlacementError: {exc}"
        return "leased"


class Peer(hwplace.Worker):
    def create(self, name: str, group: str | None = None, rank: int | None = None) -> str:
        return self.create_channel(name, group_affinity=group, group_rank_affinity=rank).where

    def produce(self, channel: hwplace.Channel, count: int) -> int:
        for i in range(count):
            channel.put((self.group_name, self.rank, i), weight=1)
        return count

    def produce_by_name(self, name: str, big: int) -> int:
        self.connect_channel(name).put(np.full(big, self.rank, dtype=np.float32))  # large: stashed by reference
        return big

    def consume(self, channel: hwplace.Channel, count: int) -> list[Any]:
        return [channel.get(timeout=60) for _ in range(count)]


def torch_module() -> Any:
    """torch, imported when a test needs it: a worker process imports this module, and starts sooner without."""
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cluster() -> Iterator[hwplace.Cluster]:
    with process_cluster(2, 4, cluster_cfg=CLUSTER, job_name="process-tests") as made:
        yield made


@pytest.fixture
def group(cluster: hwplace.Cluster, request: pytest.FixtureRequest) -> Iterator[hwplace.WorkerGroup]:
    """An Echo worker on each node."""
    launched = Echo.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 1]), name=request.node.name[:60])
    yield launched
    launched.shutdown()


def test_nodes_are_simulated_with_their_own_rank_and_accelerators(cluster: hwplace.Cluster) -> None:
    assert [n.address for n in cluster.nodes] == ["127.0.0.1", "127.0.0.1"]
    assert len({n.node_id for n in cluster.nodes}) == 2
    assert [len(n.devices(hwplace.testing.FAKE_ACCELERATOR)) for n in cluster.nodes] == [4, 4]
    assert cluster.executor().name == "processes"
    assert cluster.executor().where().startswith("process cluster at 127.0.0.1:")


def test_methods_answer_in_rank_order_each_worker_on_its_node(group: hwplace.WorkerGroup) -> None:
    assert group.run(10).wait() == [10, 11]
    assert group.execute_on(1, 0).run(5).wait() == [6, 5]
    assert group.where().wait() == [("0", "4", 0), ("1", "4", 1)]
    handles = [group.note(i) for i in range(9)]
    for handle in handles:
        handle.wait()
    assert group.noted().wait() == [list(range(9))] * 2  # plain methods run one at a time, in call order
    assert group.double(4).wait() == [8, 8]


def test_handles_time_out_without_stopping_the_call_and_can_be_awaited(group: hwplace.WorkerGroup) -> None:
    started = group.sleep(1.0)
    with pytest.raises(TimeoutError, match=r"sleep\(\) did not finish within 0.01 s on ranks \[0, 1\]; it goes on"):
        started.wait(timeout=0.01)
    assert started.wait() == ["slept", "slept"]
    assert started.done()
    assert started.num_done == 2

    async def both() -> list[Any]:
        return await group.run(1)

    assert asyncio.run(both()) == [1, 2]


def test_a_bad_wait_timeout_is_a_config_error(group: hwplace.WorkerGroup) -> None:
    handle = group.sleep(0.2)  # -1 used to be read as 0 and nan as no limit
    for timeout in [float("nan"), -1, "1", True]:
        with pytest.raises(hwplace.ConfigError, match=r"^timeout: .*allowed: None or float\('inf'\) \(no limit"):
            handle.wait(timeout=timeout)  # type: ignore[arg-type]
    assert handle.wait(timeout=float("inf")) == ["slept", "slept"]  # no limit


def test_a_raising_method_is_a_worker_error_with_its_traceback(group: hwplace.WorkerGroup) -> None:
    with pytest.raises(hwplace.WorkerError, match=r"rank 1 on node 1: explode\(\) raised KeyError") as caught:
        group.execute_on(1).explode().wait()
    assert (caught.value.group, caught.value.rank, caught.value.node_rank) == (group.name, 1, 1)
    assert 'raise KeyError("no such thing")' in (caught.value.remote_traceback or "")
    with pytest.raises(hwplace.WorkerError, match=r"unpicklable\(\) returned a value that cannot be pickled"):
        group.unpicklable().wait()
    with pytest.raises(hwplace.WorkerError, match=r"run\(\) was not sent to ranks 0, 1: argument 0, a "
                                                  r"_thread.lock, cannot be pickled"):
        group.run(__import__("threading").Lock())
    assert group.run(0).wait() == [0, 1]  # the workers live on


def test_a_failing_constructor_fails_the_launch(cluster: hwplace.Cluster) -> None:
    with pytest.raises(hwplace.WorkerError, match=r"rank 0 on node 1: the constructor raised ValueError: "
                                                  r"constructor refused"):
        Echo.create_group(fail=True).launch(cluster, hwplace.NodePlacementStrategy([1]), name="refused")
    survivor = Echo.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name="refused")
    survivor.shutdown()  # the name was freed


def test_a_killed_worker_is_a_worker_error_naming_its_node(group: hwplace.WorkerGroup) -> None:
    dying = group.execute_on(1).die()
    pending = group.execute_on(1).sleep(120)  # queued behind die(): plain methods run one at a time
    for handle in (dying, pending, group.execute_on(1).run(0)):  # pending, and later, calls: errors, no hang
        with pytest.raises(hwplace.WorkerError, match=r"rank 1 on node 1: \w+\(\) failed: the worker process has "
                                                      r"died \(node 1 is 127.0.0.1, .*killed by signal 9") as caught:
            handle.wait()
        assert (caught.value.rank, caught.value.node_rank) == (1, 1)
    assert group.execute_on(0).run(0).wait() == [0]  # the other rank lives on


def test_channels_carry_items_between_groups_and_large_ones_by_reference(cluster: hwplace.Cluster) -> None:
    producers = Peer.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 1]), name="producers")
    consumers = Peer.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name="consumers")
    try:
        [where] = producers.execute_on(0).create("items", "consumers", 0).wait()
        assert where == "127.0.0.1 (simulated node 1, served by the driver)"
        channel = hwplace.Channel.connect("items")
        got = consumers.consume(channel, 6)
        assert producers.produce(channel, 3).wait() == [3, 3]
        assert sorted(got.wait()[0]) == sorted((g, r, i) for g in ["producers"] for r in (0, 1) for i in range(3))
        assert producers.produce_by_name("items", 300_000).wait() == [300_000] * 2
        arrays = [channel.get(timeout=60), channel.get(timeout=60)]
        assert sorted(float(a[0]) for a in arrays) == [0.0, 1.0]
        assert all(a.shape == (300_000,) for a in arrays)
        with pytest.raises(hwplace.ConfigError, match="a channel named 'items' exists"):
            hwplace.Channel.create("items")
        with pytest.raises(hwplace.ConfigError, match="there is no channel named 'itmes'"):
            hwplace.Channel.connect("itmes")
        assert [c["name"] for c in require(cluster.executor(), Leases).cluster_status(None)["channels"]] == ["items"]
        channel.close()
        with pytest.raises(hwplace.ChannelClosed, match="the channel is closed"):
            channel.get(timeout=1)
    finally:
        producers.shutdown()
        consumers.shutdown()


def drain(log: hwplace.Channel, queue_name: str) -> list[Any]:
    got = []
    while log.qsize(queue_name):
        got.append(log.get_nowait(queue_name))
    return got


def test_the_executor_pickles_into_workers_and_works_there(group: hwplace.WorkerGroup,
                                                           cluster: hwplace.Cluster) -> None:
    answers = group.executor_here().wait()
    assert [a[0] for a in answers] == ["processes"] * 2
    assert {a[1] for a in answers} == {cluster.executor().where()}
    assert [a[2] for a in answers] == [[0, 1]] * 2
    assert require(cluster.executor(), Rendezvous).kv_wait("from-1", 60) == b"hello"
    with pytest.raises(TimeoutError, match=r"no process published 'nobody' within 0\.01 s"):
        require(cluster.executor(), Rendezvous).kv_wait("nobody", 0.01)
    assert pickle.loads(pickle.dumps(cluster.executor())).find_group(group.name) is not None


def test_leases_and_status(group: hwplace.WorkerGroup, cluster: hwplace.Cluster) -> None:
    executor = cluster.executor()
    plan = hwplace.ComponentPlacement(CONFIG, cluster)
    trainer = Echo.create_group().launch(cluster, plan.get_strategy("trainer"), name="leaser")
    try:
        status = require(executor, Leases).cluster_status(None)
        assert set(status) == {"cluster", "jobs", "groups", "leases", "channels"}
        assert [n["alive"] for n in status["cluster"]["nodes"]] == [True, True]
        assert [j["name"] for j in status["jobs"]] == ["process-tests"]
        assert {g["group"] for g in status["groups"]} >= {"leaser", group.name}
        [lease] = [lease for lease in status["leases"] if lease["group"] == "leaser"]
        assert (lease["hardware_type"], lease["index"], lease["node_rank"]) == ("fake-accelerator", 0, 0)
        # another job (a worker's process, registering as a driver would) cannot take the device
        record = hwplace.executor.GroupRecord("intruder", "other", "x.Y", (), tuple(
            hwplace.executor.DeviceLease(**{k: v for k, v in lease.items() if k in (
                "hardware_type", "index", "identity", "node_id", "node_rank", "address")}, ranks=(0,))
            for _ in [0]))
        [answer] = group.execute_on(0).lease(record).wait()
        assert answer.startswith("PlacementError: group 'other' cannot start:"), answer
        assert "'process-tests'" in answer
        assert "leaser" in answer
        with pytest.raises(hwplace.ConfigError, match="a worker group named 'leaser' is running"):
            Echo.create_group().launch(cluster, plan.get_strategy("trainer"), name="leaser")
        with pytest.raises(hwplace.ConfigError, match="is not this process cluster"):
            require(executor, Leases).cluster_status("10.0.0.1:6379")
    finally:
        trainer.shutdown()
    assert "leaser" not in {g["group"] for g in require(executor, Leases).cluster_status(None)["groups"]}


def test_no_process_or_server_outlives_the_cluster() -> None:
    with process_cluster(2, 2) as cluster:
        group = Echo.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 1, 1]), name="short")
        pids = group.pid().wait()
        group.execute_on(2).sleep(120)  # a plain method still running when the block ends
        channel = hwplace.Channel.create("short-lived")
        port = int(cluster.executor().where().split(":")[1].split()[0])
        assert all(running(pid) for pid in pids)
    assert not any(running(pid) for pid in pids)
    with pytest.raises(ConnectionRefusedError, match="refused"):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # the hub is gone
    with pytest.raises(hwplace.ChannelLost, match="short-lived"):
        channel.put(1, timeout=5)


def test_one_node_with_this_machine_s_own_environment() -> None:
    with process_cluster(inherit_env=True) as cluster:
        [node] = cluster.nodes
        assert node.rank == 0
        assert os.environ.get("HWPLACE_FAKE_ACCELERATORS") or not node.devices(hwplace.testing.FAKE_ACCELERATOR)
        group = Echo.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="here")
        assert group.run(1).wait() == [1]


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(hwplace.ConfigError, match="num_nodes"):
        ProcessExecutor(0)
    with pytest.raises(hwplace.ConfigError, match="inherit_env"):
        ProcessExecutor(2, inherit_env=True)
    with pytest.raises(hwplace.ConfigError, match="node_envs"):
        ProcessExecutor(node_envs={"A": "1"})  # type: ignore[arg-type]
    with pytest.raises(hwplace.ConfigError, match="asks for 3 nodes but this process cluster simulates 2"), \
            process_cluster(2, 1, cluster_cfg={"num_nodes": 3}):
        pass
