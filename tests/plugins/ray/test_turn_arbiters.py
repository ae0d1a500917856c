"""Ray's turn arbiters are found by their own job's workers only, through a file in the Ray session's folder: an
arbiter of a job that has ended is never taken for the next job's, and nothing is left in the machine's temp
folder."""

from __future__ import annotations

import os
import tempfile

import pytest
from drivers import run_driver

import hwplace
from hwplace_plugins.ray.pytest_plugin import LocalRay

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


def test_no_address_file_is_left_in_the_machine_s_temp_folder(hwplace_local_ray: LocalRay) -> None:
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), "hwplace-turns"))
