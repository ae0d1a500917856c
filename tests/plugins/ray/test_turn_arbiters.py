"""Ray's turn arbiters are found by their own job's workers only, through a file in the Ray session's folder: an
arbiter of a job that has ended is never taken for the next job's, an arbiter lives as long as its job (not as
long as the executor object that started it), and nothing is left in the machine's temp folder."""

from __future__ import annotations

import gc
import json
import os
import socket
import tempfile
import time

import pytest
from drivers import run_driver

import hwplace
from hwplace.testing import Session, swapped_session
from hwplace_plugins.ray.pytest_plugin import LocalRay
from hwplace_plugins.ray.turns import address_file

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.time_limit(240)

SHARING_JOB = """
import json, sys
import hwplace

class Taker(hwplace.Worker):
    def take(self):
        with self.turn(timeout=60):
            return "had a turn"

cluster = hwplace.Cluster({"num_nodes": 2, "address": sys.argv[1]})
# two groups share accelerator 0 of node 1 (resource 4): the driver starts node 1's arbiter for this job
one = Taker.create_group().launch(cluster, hwplace.PackedPlacementStrategy(4, 4), name="first")
two = Taker.create_group().launch(cluster, hwplace.PackedPlacementStrategy(4, 4), name="second")
print(json.dumps({"turns": one.take().wait(timeout=60) + two.take().wait(timeout=60)}))
"""  # the job ends with its driver: its arbiter goes with it


class Solo(hwplace.Worker):
    def take(self) -> str:
        with self.turn(timeout=60):
            return "had a turn"


def test_an_arbiter_of_a_job_that_ended_is_not_the_next_job_s(hwplace_local_ray: LocalRay) -> None:
    found = run_driver(SHARING_JOB, hwplace_local_ray.address, timeout=180)
    assert found == {"turns": ["had a turn", "had a turn"]}
    cluster = hwplace.Cluster({"num_nodes": 2})
    solo = Solo.create_group().launch(cluster, hwplace.PackedPlacementStrategy(4, 4), name="solo-after-a-job")
    try:  # this job has no arbiter on node 1: a turn costs nothing, whatever the ended job left
        assert solo.take().wait(timeout=60) == ["had a turn"]
    finally:
        solo.shutdown()


def listening(path: str) -> bool:
    """Whether something listens at the address an arbiter wrote to ``path``."""
    with open(path, encoding="utf-8") as found:
        data = json.load(found)
    try:
        socket.create_connection((data["host"], data["port"]), timeout=5).close()
    except OSError:
        return False
    return True


def test_an_arbiter_outlives_the_executor_that_started_it(hwplace_local_ray: LocalRay) -> None:
    # A second executor object in this process (a fresh plugin manager's; tests/runtime's process clusters
    # register a plugin, which makes the process's manager collect its executors anew) starts node 1's arbiter.
    with swapped_session(Session(plugin_manager=hwplace.PluginManager())):
        other = hwplace.Cluster({"num_nodes": 2})
        strategy = hwplace.PackedPlacementStrategy(4, 4)  # accelerator 0 of node 1
        first = Solo.create_group().launch(other, strategy, name="sharing-first")
        second = Solo.create_group().launch(other, strategy, name="sharing-second")
        try:
            assert first.take().wait(timeout=60) + second.take().wait(timeout=60) == ["had a turn"] * 2
        finally:
            first.shutdown()
            second.shutdown()
        context = ray.get_runtime_context()
        path = address_file(os.path.join(context.get_temp_dir(), context.get_session_name()),
                            context.get_job_id(), other.nodes[1].node_id)
    del other, first, second
    gc.collect()  # that executor object is gone; Ray stops an actor none of its creator's handles reach
    deadline = time.monotonic() + 5  # a stopped arbiter is gone within a second: give it time to go
    while time.monotonic() < deadline and listening(path):
        time.sleep(0.1)
    assert listening(path)  # the arbiter of node 1 lives as long as the job, whoever started it
    cluster = hwplace.Cluster({"num_nodes": 2})
    solo = Solo.create_group().launch(cluster, hwplace.PackedPlacementStrategy(4, 4), name="solo-after-them")
    try:  # the job's arbiter of node 1 is there and grants the turn at once: nobody else is on its accelerator
        assert solo.take().wait(timeout=60) == ["had a turn"]
    finally:
        solo.shutdown()


class Sharer(Solo):
    def arbiter_file(self) -> str:
        from hwplace_plugins.ray.turns import _own_address_file

        return _own_address_file(str(ray.get_runtime_context().get_node_id()))


def test_the_address_file_lies_in_the_ray_session_s_folder_not_the_machine_s_temp_folder(
        hwplace_local_ray: LocalRay) -> None:
    temp = os.path.join(tempfile.gettempdir(), "hwplace-turns")
    before = set(os.listdir(temp)) if os.path.isdir(temp) else set()  # other processes' (old versions') files
    cluster = hwplace.Cluster({"num_nodes": 2})
    one = Sharer.create_group().launch(cluster, hwplace.PackedPlacementStrategy(5, 5), name="share-one")
    two = Sharer.create_group().launch(cluster, hwplace.PackedPlacementStrategy(5, 5), name="share-two")
    try:
        assert one.take().wait(timeout=60) + two.take().wait(timeout=60) == ["had a turn"] * 2
        [path] = one.arbiter_file().wait(timeout=60)
        session = ray.get_runtime_context()
        assert path.startswith(os.path.join(session.get_temp_dir(), session.get_session_name()) + os.sep)
        assert ray.get_runtime_context().get_job_id() in os.path.basename(path)
        assert os.path.exists(path)
    finally:
        one.shutdown()
        two.shutdown()
    after = set(os.listdir(temp)) if os.path.isdir(temp) else set()
    assert after <= before
