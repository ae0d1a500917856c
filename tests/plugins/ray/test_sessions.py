"""A group outlived by its Ray session: ``ray.shutdown()`` under a running group, then a new ``ray.init``.

The driver is a subprocess with a throwaway cluster of its own (the test's session cluster is not shut down).
"""

from __future__ import annotations

import pytest
from drivers import run_driver

pytest.importorskip("ray")

DRIVER = """
import json, time
import ray
import hwplace
from hwplace.testing import local_ray_cluster

class Sleeper(hwplace.Worker):
    def nap(self, seconds):
        time.sleep(seconds)
        return seconds

found = {}
config = {"num_nodes": 1, "component_placement": {"s": {"node_group": "node", "placement": "0"}}}
with local_ray_cluster(1) as address:
    cluster = hwplace.Cluster(config)
    strategy = hwplace.ComponentPlacement({"cluster": config}, cluster).get_strategy("s")
    group = Sleeper.create_group().launch(cluster, strategy, name="napper")
    pending = group.nap(60)
    ray.shutdown()
    for what, call in (("wait", lambda: pending.wait(timeout=5)), ("call", lambda: group.nap(0))):
        try:
            call()
            found[what] = "no error"
        except Exception as exc:
            found[what] = f"{type(exc).__name__}: {exc}"
    for what, call in (("create", lambda: hwplace.Channel.create("late")),
                       ("connect", lambda: hwplace.Channel.connect("late"))):
        try:
            call()
            found[what] = "no error"
        except Exception as exc:
            found[what] = f"{type(exc).__name__}: {exc}"
    found["connected after"] = ray.is_initialized()  # a pending wait() must not start or join another Ray
    group.shutdown()
    ray.init(address=address)
    cluster = hwplace.Cluster(config)
    again = Sleeper.create_group().launch(cluster, strategy, name="napper")  # the old name ended with its session
    found["again"] = again.nap(0).wait(timeout=60)
    again.shutdown()
print(json.dumps(found))
"""


@pytest.mark.time_limit(240)
def test_a_group_whose_ray_session_ended_says_so_and_its_name_ends_with_it() -> None:
    # and a channel created or connected to after ray.shutdown() is refused naming the cluster that is gone
    found = run_driver(DRIVER, timeout=200)
    for what, method in (("wait", "nap"), ("call", "nap")):
        assert found[what].startswith(f"WorkerError: group 'napper': {method}(): "), found[what]
        assert "the Ray session the group ran in has ended" in found[what]
    for what in ("create", "connect"):  # not Ray's RuntimeError "Node ID is not available ..."
        assert found[what].startswith(f"ConfigError: cluster: Channel.{what}: the Ray cluster this process was "
                                      "connected to is gone (ray.shutdown() was called)"), found[what]
    assert found["connected after"] is False
    assert found["again"] == [0]
