"""The Ray executor on a real two-node Ray cluster (one per test session): discovery, groups, errors."""

from __future__ import annotations

import asyncio
import ctypes
import io
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import hwplace
from hwplace_plugins.ray.pytest_plugin import LocalRay

ray = pytest.importorskip("ray")

CONFIG = {"cluster": {
    "num_nodes": 2,
    "node_groups": [{
        "label": "gpus",
        "node_ranks": "0-1",
        "env_configs": [{"node_ranks": 1, "env_vars": {"HWPLACE_TEST_GREETING": "hello from 1"}}],
    }],
    "component_placement": {
        "actor": "0-7",
        "pair": {"node_group": "node", "placement": "0-1"},
        "trainer": {"node_group": "gpus", "placement": "0-3:0-1,4-7:2-3"},
    },
}}


class Probe(hwplace.Worker):
    """Reports what a worker sees."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def add(self, x: int) -> int:
        return x + self.rank + self.offset

    def where(self) -> dict[str, object]:
        names = ("FAKE_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "HWPLACE_TEST_GREETING", "HWPLACE_VIA_WRAPPER")
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                **{name: os.environ.get(name) for name in names}}

    def visible(self, *names: str) -> list[str | None]:
        return [os.environ.get(name) for name in names]

    def fail(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} refuses")
        return self.rank

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def exit_hard(self) -> None:
        os._exit(7)

    def segfault(self) -> None:
        ctypes.string_at(0)

    async def double_later(self, x: int) -> int:
        await asyncio.sleep(0.05)
        return 2 * x

    def all_reduce(self) -> list[float]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            tensor = torch.tensor([float(self.rank + 1)])
            dist.all_reduce(tensor)
            return [float(v) for v in tensor.tolist()]
        finally:
            dist.destroy_process_group()


class BrokenOnRankOne(hwplace.Worker):
    def __init__(self) -> None:
        if self.rank == 1:
            raise RuntimeError("no device for rank 1")


@pytest.fixture(scope="module")
def cluster(hwplace_local_ray: LocalRay) -> hwplace.Cluster:
    return hwplace.Cluster(CONFIG["cluster"])


@pytest.fixture(scope="module")
def placement(cluster: hwplace.Cluster) -> hwplace.ComponentPlacement:
    return hwplace.ComponentPlacement(CONFIG, cluster)


@pytest.fixture(scope="module")
def actor(cluster: hwplace.Cluster, placement: hwplace.ComponentPlacement):
    group = Probe.create_group(100).launch(cluster, placement.get_strategy("actor"), name="actor")
    yield group
    group.shutdown()


# -- discovery --------------------------------------------------------------------------------------


def test_nodes_get_their_ranks_ids_and_addresses_from_ray(cluster: hwplace.Cluster) -> None:
    alive = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    assert [n.rank for n in cluster.nodes] == [0, 1]
    assert {n.node_id for n in cluster.nodes} == set(alive)
    for node in cluster.nodes:
        assert node.address == alive[node.node_id]["NodeManagerAddress"]
        assert len(node.devices("fake-accelerator")) == 4
        assert node.problems == {}
    # HWPLACE_NODE_RANK=i is set on node i by local_ray_cluster: ask each node which it is.
    probe = ray.remote(num_cpus=0)(lambda: os.environ["HWPLACE_NODE_RANK"])
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    seen = ray.get([probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)).remote()
                    for n in cluster.nodes])
    assert seen == ["0", "1"]


def test_more_nodes_than_alive_fails_fast_with_a_table(hwplace_local_ray: LocalRay) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"(?s)cluster\.num_nodes: asks for 3 nodes but Ray has 2 alive.*"
                       r"nodes found:.*rank\s+node id.*0 \(env\).*4 fake-accelerator.*1 \(env\)"):
        hwplace.Cluster({"num_nodes": 3})


def test_fewer_nodes_than_alive_takes_the_first_ranks(hwplace_local_ray: LocalRay) -> None:
    cluster = hwplace.Cluster({"num_nodes": 1})
    assert [n.rank for n in cluster.nodes] == [0]


def test_declared_devices_are_detected_on_their_node(hwplace_local_ray: LocalRay) -> None:
    cfg = {"num_nodes": 2, "node_groups": [{"label": "robots", "node_ranks": 1, "hardware": {
        "type": "fake-robot", "configs": [{"node_rank": 1, "name": "left"}, {"node_rank": 1, "name": "right"}]}}]}
    cluster = hwplace.Cluster(cfg)
    assert cluster.nodes[0].devices("fake-robot") == ()
    assert [d.properties["name"] for d in cluster.nodes[1].devices("fake-robot")] == ["left", "right"]


def test_an_offline_cluster_cannot_launch(placement: hwplace.ComponentPlacement) -> None:
    offline = hwplace.testing.fake_cluster(CONFIG["cluster"], accelerators_per_node=4)
    with pytest.raises(hwplace.ConfigError, match=r"built from a given inventory.*can plan but not run workers"):
        Probe.create_group().launch(offline, placement.get_strategy("actor"), name="offline")


# -- groups ------------------------------------------------------------------------------------------


def test_each_worker_runs_on_its_placement_node_and_sees_its_own_accelerator(actor, cluster) -> None:
    seen = actor.where().wait()
    assert [s["node_id"] for s in seen] == [p.node_id for p in actor.placements]
    assert [s["FAKE_VISIBLE_DEVICES"] for s in seen] == ["0", "1", "2", "3"] * 2
    assert [s["RANK"] for s in seen] == [str(r) for r in range(8)]
    assert {s["WORLD_SIZE"] for s in seen} == {"8"}
    assert {s["LOCAL_RANK"] for s in seen} == {"0"}  # isolated: its own device is device 0
    assert {s["LOCAL_WORLD_SIZE"] for s in seen} == {"4"}
    assert [s["NODE_RANK"] for s in seen] == ["0"] * 4 + ["1"] * 4
    assert {s["MASTER_ADDR"] for s in seen} == {cluster.nodes[0].address}
    assert len({s["MASTER_PORT"] for s in seen}) == 1
    assert int(seen[0]["MASTER_PORT"]) > 0
    assert len({s["pid"] for s in seen}) == 8


def test_results_come_back_in_rank_order_and_constructor_args_arrive(actor) -> None:
    assert actor.add(1).wait() == [101 + r for r in range(8)]
    assert actor.execute_on(5, 2).add(0).wait() == [105, 102]
    assert actor.world_size == 8


def test_async_methods_and_awaiting_handles(actor) -> None:
    assert actor.double_later(21).wait() == [42] * 8

    async def main() -> list[int]:
        results: list[int] = await actor.execute_on(0).double_later(4)
        return results

    assert asyncio.run(main()) == [8]


def test_a_handle_reports_done(actor) -> None:
    handle = actor.execute_on(0).sleep(0.3)
    assert not handle.done()
    assert handle.wait() == [0.3]
    assert handle.done()


def test_an_elapsed_timeout_leaves_the_call_running(actor) -> None:
    handle = actor.execute_on(3).sleep(0.5)
    with pytest.raises(TimeoutError, match=r"group 'actor': sleep\(\) did not finish within 0.05 s on ranks \[3\]"):
        handle.wait(timeout=0.05)
    assert handle.wait(timeout=30) == [0.5]


@pytest.mark.parametrize("timeout", [float("nan"), -1, "1", True])
def test_a_bad_wait_timeout_is_a_config_error(actor, timeout: Any) -> None:
    handle = actor.execute_on(0).sleep(0.2)  # nan used to reach ray.wait: its bare ValueError
    with pytest.raises(hwplace.ConfigError, match=r"^timeout: .*allowed: None or float\('inf'\) \(no limit\)"):
        handle.wait(timeout=timeout)
    assert handle.wait(timeout=float("inf")) == [0.2]  # no limit


def test_without_isolation_workers_see_every_accelerator_of_their_node(cluster, placement) -> None:
    group = Probe.create_group().launch(cluster, placement.get_strategy("pair"), name="pair",
                                        isolate_accelerator=False)
    try:
        seen = group.where().wait()
    finally:
        group.shutdown()
    assert [s["node_id"] for s in seen] == [cluster.nodes[0].node_id, cluster.nodes[1].node_id]
    assert [s["NODE_RANK"] for s in seen] == ["0", "1"]


def test_env_configs_apply_per_node_and_two_groups_run_at_once(actor, cluster, placement) -> None:
    trainer = Probe.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer")
    try:
        seen = trainer.where().wait()
        assert actor.add(0).wait()[0] == 100  # the other group is unaffected
    finally:
        trainer.shutdown()
    assert [s["HWPLACE_TEST_GREETING"] for s in seen] == [None, None, "hello from 1", "hello from 1"]
    assert [s["FAKE_VISIBLE_DEVICES"] for s in seen] == ["0,1", "2,3", "0,1", "2,3"]


def test_ray_never_overwrites_the_variables_hwplace_sets(cluster) -> None:
    # Ray's legacy switch makes it blank CUDA_VISIBLE_DEVICES in every process that got no GPU from Ray.
    legacy = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1", "CUDA_VISIBLE_DEVICES": "2,3"}
    cuda_env = {"label": "cuda-env", "node_ranks": "0-1", "env_configs": [{"node_ranks": "0-1", "env_vars": legacy}]}
    cfg = {"cluster": {"num_nodes": 2, "node_groups": [cuda_env],
                       "component_placement": {"w": {"node_group": "cuda-env", "placement": "0-1"}}}}
    group = Probe.create_group().launch(cluster, hwplace.ComponentPlacement(cfg, cluster).get_strategy("w"), name="w")
    try:
        seen = group.visible("CUDA_VISIBLE_DEVICES", "FAKE_VISIBLE_DEVICES").wait()
    finally:
        group.shutdown()
    assert seen == [["2,3", "0"], ["2,3", "1"]]


def test_a_group_interpreter_starts_the_workers(hwplace_local_ray: LocalRay, tmp_path: Path) -> None:
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f"#!/bin/sh\nexport HWPLACE_VIA_WRAPPER=yes\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    wrapped = {"label": "wrapped", "node_ranks": "0-1", "ignore_hardware": True,
               "env_configs": [{"node_ranks": 1, "python_interpreter_path": str(wrapper)}]}
    cfg = {"cluster": {"num_nodes": 2, "node_groups": [wrapped],
                       "component_placement": {"w": {"node_group": "wrapped", "placement": "0-1"}}}}
    cluster = hwplace.Cluster(cfg["cluster"])
    group = Probe.create_group().launch(cluster, hwplace.ComponentPlacement(cfg, cluster).get_strategy("w"), name="w")
    try:
        assert [s["HWPLACE_VIA_WRAPPER"] for s in group.where().wait()] == [None, "yes"]
    finally:
        group.shutdown()


def test_a_name_in_use_is_an_error_until_shut_down(actor, cluster, placement) -> None:
    with pytest.raises(hwplace.ConfigError, match="name: a worker group named 'actor' is running; shut it down"):
        Probe.create_group().launch(cluster, placement.get_strategy("pair"), name="actor")
    first = Probe.create_group().launch(cluster, placement.get_strategy("pair"), name="again")
    first.shutdown()
    first.shutdown()
    with pytest.raises(hwplace.WorkerError, match="cannot call 'add': the group was shut down"):
        first.add(1)
    second = Probe.create_group().launch(cluster, placement.get_strategy("pair"), name="again")
    try:
        assert second.add(1).wait() == [1, 2]
    finally:
        second.shutdown()


def test_launch_shows_progress_on_a_terminal(cluster, placement, monkeypatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    group = Probe.create_group().launch(cluster, placement.get_strategy("actor"), name="progress")
    group.shutdown()
    assert "hwplace: launched group 'progress': 8/8 workers ready" in terminal.getvalue()


# -- errors ------------------------------------------------------------------------------------------


def test_a_raising_method_names_group_rank_node_and_the_remote_traceback(actor) -> None:
    with pytest.raises(hwplace.WorkerError, match=r"group 'actor' rank 6 on node 1: fail\(\) raised ValueError: "
                       r"rank 6 refuses") as info:
        actor.fail(6).wait()
    error = info.value
    assert (error.group, error.rank, error.node_rank) == ("actor", 6, 1)
    assert error.remote_traceback is not None
    assert "in fail" in error.remote_traceback
    assert 'raise ValueError(f"rank {rank} refuses")' in error.remote_traceback
    assert isinstance(error.__cause__, ValueError)
    assert actor.execute_on(0, 7).fail(6).wait() == [0, 7]  # the other ranks live on


def test_a_constructor_failure_surfaces_from_launch_with_its_rank(cluster, placement) -> None:
    with pytest.raises(hwplace.WorkerError, match=r"group 'broken' rank 1 on node 0: the constructor raised "
                       r"RuntimeError: no device for rank 1") as info:
        BrokenOnRankOne.create_group().launch(cluster, placement.get_strategy("actor"), name="broken")
    assert "no device for rank 1" in str(info.value.remote_traceback)
    group = Probe.create_group().launch(cluster, placement.get_strategy("pair"), name="broken")  # name is free
    group.shutdown()


@pytest.mark.parametrize("how", ["exit_hard", "segfault", "killed"])
@pytest.mark.parametrize("timeout", [None, 60])
def test_a_dead_worker_is_reported_and_never_hangs(cluster, placement, how: str, timeout: float | None) -> None:
    group = Probe.create_group().launch(cluster, placement.get_strategy("pair"), name=f"doomed-{how}")
    try:
        if how == "killed":
            pid = group.execute_on(1).where().wait()[0]["pid"]
            handle = group.execute_on(1).sleep(60)
            os.kill(int(pid), signal.SIGKILL)
        else:
            handle = getattr(group.execute_on(1), how)()
        with pytest.raises(hwplace.WorkerError, match=r"group 'doomed-\w+' rank 1 on node 1: \w+\(\) failed: the "
                           r"worker process has died \(node 1 is [\d.]+, Ray node \w+\)"):
            handle.wait(timeout=timeout)
        assert group.execute_on(0).add(1).wait() == [1]  # its partner lives on
        with pytest.raises(hwplace.WorkerError, match=r"rank 1 on node 1: add\(\) failed: the worker process has"):
            group.add(1).wait()
    finally:
        group.shutdown()


# -- torch.distributed -------------------------------------------------------------------------------


def test_gloo_all_reduce_across_two_nodes_with_only_the_environment_hwplace_set(cluster, placement) -> None:
    pytest.importorskip("torch")
    group = Probe.create_group().launch(cluster, placement.get_strategy("pair"), name="gloo")
    try:
        assert group.all_reduce().wait(timeout=120) == [[3.0], [3.0]]
        assert [p.node_rank for p in group.placements] == [0, 1]
    finally:
        group.shutdown()
