"""A node whose raylet dies under a group and a channel: callers get hwplace errors, nothing hangs or lingers.

One throwaway two-node cluster, in a subprocess (the session's cluster keeps its nodes); node 1's raylet is
killed with SIGKILL, as the OOM killer would.
"""

from __future__ import annotations

import pytest
from drivers import run_driver

pytest.importorskip("ray")

DRIVER = r"""
import json, os, signal, threading, time, warnings
import ray
import hwplace
from hwplace.testing import local_ray_cluster

class Probe(hwplace.Worker):
    def pids(self):
        return os.getpid(), os.getppid()

def outcome(call):
    try:
        return f"ok: {call()!r}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"

def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split()[2] == "Z"

found = {}
fast = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "2"}  # Ray sees the death soon
with local_ray_cluster(2, env_vars=fast):
    config = {"num_nodes": 2, "component_placement": {"p": {"node_group": "node", "placement": "1"}}}
    cluster = hwplace.Cluster(config)
    strategy = hwplace.ComponentPlacement({"cluster": config}, cluster).get_strategy("p")
    group = Probe.create_group().launch(cluster, strategy, name="probe")
    channel = hwplace.Channel.create("doomed", group_affinity="probe")
    worker, raylet = group.pids().wait(timeout=60)[0]
    waiting = {}
    getter = threading.Thread(target=lambda: waiting.update(get=outcome(lambda: channel.get(timeout=120))))
    getter.start()
    time.sleep(0.5)
    os.kill(raylet, signal.SIGKILL)
    getter.join(timeout=60)
    found["blocked get"] = waiting.get("get", "still waiting")
    found["put"] = outcome(lambda: channel.put(1, timeout=5))
    for _ in range(120):  # until Ray marks the node dead
        if not [n for n in ray.nodes() if n["NodeID"] == cluster.nodes[1].node_id and n["Alive"]]:
            break
        time.sleep(0.5)
    found["connect"] = outcome(lambda: hwplace.Channel.connect("doomed").put(1, timeout=5))
    found["create again"] = outcome(lambda: hwplace.Channel.create("doomed").where)
    found["channel on the dead node"] = outcome(lambda: hwplace.Channel.create("there", group_affinity="probe"))
    found["call"] = outcome(lambda: group.pids().wait(timeout=60))
    found["launch there"] = outcome(lambda: Probe.create_group().launch(cluster, strategy, name="again"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        group.shutdown()
    found["shutdown says"] = [str(w.message) for w in caught]
    for _ in range(60):
        if not alive(worker):
            break
        time.sleep(0.5)
    found["worker alive"] = alive(worker)
print(json.dumps(found))
"""


@pytest.mark.time_limit(280)
def test_a_dead_raylet_is_a_hwplace_error_everywhere_and_leaves_no_process() -> None:
    found = run_driver(DRIVER, timeout=250)
    assert found["blocked get"].startswith("ChannelLost: channel 'doomed'"), found
    assert found["put"].startswith("ChannelLost: channel 'doomed'"), found
    assert found["connect"].startswith("ChannelLost: channel 'doomed'"), found  # an error naming it
    assert found["create again"].startswith("ok: "), found
    assert found["channel on the dead node"].startswith("ChannelLost: channel 'there': its host cannot start, "
                                                        "its node is gone"), found
    assert found["call"].startswith("WorkerError: group 'probe' rank 0 on node 1: pids() failed: the worker "
                                    "process has died"), found
    assert found["launch there"].startswith("PlacementError: node 1 ("), found
    assert "its node may be gone" in found["launch there"] or "the node may be gone" in found["launch there"]
    assert [m for m in found["shutdown says"] if "Ray could not stop rank(s) 0 (node 1, " in m], found
    assert found["worker alive"] is False


RESTART_DRIVER = r"""
import json, os, signal, time
import ray
import hwplace
from hwplace.testing import local_ray_cluster

class Probe(hwplace.Worker):
    def pids(self):
        return os.getpid(), os.getppid()

found = {}
fast = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "2"}
with local_ray_cluster(2, env_vars=fast):
    config = {"num_nodes": 2, "component_placement": {"p": {"node_group": "node", "placement": "1"}}}
    cluster = hwplace.Cluster(config)
    strategy = hwplace.ComponentPlacement({"cluster": config}, cluster).get_strategy("p")
    group = Probe.create_group().launch(cluster, strategy, name="probe", restart=hwplace.Restart(max_restarts=2))
    worker, raylet = group.pids().wait(timeout=60)[0]
    os.kill(raylet, signal.SIGKILL)
    for _ in range(240):  # its restarts are tried, and fail: nothing can start on a node that is gone
        status = group.status()[0]
        if status.state == "dead":
            break
        time.sleep(0.5)
    found["state"], found["restarts"], found["cause"] = status.state, status.restarts, status.cause
    try:
        group.pids().wait(timeout=60)
        found["call"] = "answered"
    except hwplace.WorkerError as exc:
        found["call"] = str(exc)
    group.shutdown()
print(json.dumps(found))
"""


@pytest.mark.time_limit(280)
def test_a_restartable_rank_whose_node_is_gone_ends_dead_with_a_cause_naming_the_node() -> None:
    found = run_driver(RESTART_DRIVER, timeout=250)
    assert found["state"] == "dead", found
    assert "node 1" in found["cause"], found
    assert "gone" in found["cause"] or "died" in found["cause"], found
    assert found["call"].startswith("group 'probe' rank 0 on node 1: cannot call 'pids': "), found
    assert "restarts are used up" in found["call"], found
