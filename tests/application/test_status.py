"""``hwplace status``: the jobs, groups, device leases and channels on a running cluster, as tables and JSON."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import hwplace
from hwplace.application.cli import main
from hwplace.application.status import print_status
from hwplace_plugins.ray.pytest_plugin import LocalRay

STATE: dict[str, Any] = {
    "cluster": {"address": "10.0.0.1:6379", "nodes": [{"node_id": "a" * 56, "address": "10.0.0.1", "alive": True},
                                                       {"node_id": "b" * 56, "address": "10.0.0.2", "alive": False}]},
    "jobs": [{"id": "01000000", "name": "pipeline", "pid": 42, "host": "vm", "since": 0.0, "groups": 1}],
    "groups": [{"job": "01000000", "group": "rollout", "worker_class": "pipeline.Rollout", "workers": [
        {"rank": r, "node_rank": r // 2, "node_id": "a", "address": "10.0.0.1", "hardware": f"fake-accelerator {r % 2}"}
        for r in range(4)]}],
    "leases": [{"hardware_type": "fake-accelerator", "index": 1, "node_rank": 0, "address": "10.0.0.1",
                "job": "01000000", "group": "rollout", "ranks": [1]}],
    "channels": [{"name": "items", "job": "01000000", "where": "10.0.0.1 (Ray node aaaaaaaaaaaa)"}],
}


def test_the_tables_name_each_job_group_lease_and_channel() -> None:
    out = io.StringIO()
    print_status(STATE, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "cluster 10.0.0.1:6379: 2 nodes, 1 alive"
    assert lines[lines.index("groups") + 1:lines.index("groups") + 3] == [
        "  job       group    worker class      ranks  nodes  state      devices",
        "  pipeline  rollout  pipeline.Rollout  0-3    0-1    4 serving  "
        "node 0: fake-accelerator 0,1; node 1: fake-accelerator 0,1"]
    assert lines[lines.index("leases") + 2] == "  fake-accelerator 1  0 (10.0.0.1)  pipeline  rollout  1"
    assert lines[-1] == "  items    pipeline  10.0.0.1 (Ray node aaaaaaaaaaaa)"
    assert lines[lines.index("jobs") + 2].startswith("  pipeline  01000000  pid 42 on vm  ")


def test_an_empty_cluster_says_so() -> None:
    out = io.StringIO()
    print_status({**STATE, "jobs": [], "groups": [], "leases": [], "channels": []}, out)
    assert out.getvalue().endswith("\nno hwplace job has launched a group or made a channel here\n")


class Idle(hwplace.Worker):
    pass


@pytest.fixture(scope="module")
def launched(hwplace_local_ray: LocalRay) -> Iterator[hwplace.WorkerGroup]:
    section = {"num_nodes": 2, "component_placement": {"watched": "4-5"}}
    cluster = hwplace.Cluster(section, job_name="status-test")
    group = Idle.create_group().launch(cluster, hwplace.ComponentPlacement({"cluster": section}, cluster)
                                       .get_strategy("watched"), name="watched")
    channel = hwplace.Channel.create("status-items")
    yield group
    channel.close()
    group.shutdown()


@pytest.mark.time_limit(120)
def test_status_of_the_connected_cluster_as_a_table_and_as_json(launched: hwplace.WorkerGroup) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["status"], out, err) == 0, err.getvalue()
    text = re.sub(" +", " ", out.getvalue())  # columns widen with the other rows
    row = r"\n status-test watched \S*test_status\.Idle 0-1 1 2 serving node 1: fake-accelerator 0,1\n"
    assert re.search(row, text), text
    assert " fake-accelerator 0 1 (" in text
    assert " status-items status-test " in text
    out = io.StringIO()
    assert main(["status", "--json"], out, err) == 0
    state = json.loads(out.getvalue())
    mine = [g for g in state["groups"] if g["group"] == "watched"]
    assert [(w["rank"], w["node_rank"], w["hardware"]) for w in mine[0]["workers"]] == [
        (0, 1, "fake-accelerator 0"), (1, 1, "fake-accelerator 1")]
    assert {(lease["index"], lease["group"], lease["job_name"]) for lease in state["leases"]} >= {
        (0, "watched", "status-test"), (1, "watched", "status-test")}


@pytest.mark.time_limit(120)
def test_status_from_another_process_by_address(hwplace_local_ray: LocalRay, launched: hwplace.WorkerGroup) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "hwplace", "status", "--address", hwplace_local_ray.address,
                           "--json"], capture_output=True, text=True, env=env, timeout=90)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout)
    assert state["cluster"]["address"] == hwplace_local_ray.address
    assert [g["job_name"] for g in state["groups"] if g["group"] == "watched"] == ["status-test"]
    assert [c["name"] for c in state["channels"] if c["name"] == "status-items"] == ["status-items"]


@pytest.mark.time_limit(120)
def test_a_closed_channel_leaves_the_status(launched: hwplace.WorkerGroup) -> None:
    channel = hwplace.Channel.create("status-closed")
    assert "status-closed" in [c["name"] for c in _status()["channels"]]
    channel.close()  # over the channel's own connection, not through the executor
    for _ in range(300):  # the host tells the registry without waiting for it: a few moments at most
        if "status-closed" not in [c["name"] for c in _status()["channels"]]:
            return
        time.sleep(0.1)
    raise AssertionError(f"a closed channel is still listed: {_status()['channels']}")


def _status() -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    assert main(["status", "--json"], out, err) == 0, err.getvalue()
    return json.loads(out.getvalue())  # type: ignore[no-any-return]
