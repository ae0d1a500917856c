"""Device leases: two jobs (drivers) on one Ray cluster never hold one device; a dead driver's leases end."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest

import hwplace
from hwplace.executor import DeviceLease, GroupRecord, LeaseBook, Leases, WorkerRecord, require
from hwplace_plugins.ray.pytest_plugin import LocalRay

# -- the book, without Ray ------------------------------------------------------------------------------------


def record(group: str, *indices: int, node: str = "n0") -> GroupRecord:
    leases = tuple(DeviceLease("gpu", i, f"uuid=G{i}", node, 0, "10.0.0.1", (r,)) for r, i in enumerate(indices))
    workers = tuple(WorkerRecord(r, 0, node, "10.0.0.1", f"gpu {i}") for r, i in enumerate(indices))
    return GroupRecord("job", group, "m.W", workers, leases)


class Drivers:
    """Which jobs' drivers are alive, as Ray's job table would say; counts the questions."""

    def __init__(self) -> None:
        self.dead: set[str] = set()
        self.asked = 0

    def __call__(self, job_ids: Collection[str]) -> set[str]:
        self.asked += 1
        return {j for j in job_ids if j not in self.dead}


def job(job_id: str, name: str | None = "a") -> dict[str, Any]:
    return {"id": job_id, "name": name, "pid": 1, "host": "h"}


def test_groups_of_one_job_share_devices_and_another_job_is_refused_naming_the_holder() -> None:
    book = LeaseBook(Drivers())
    assert book.register_group(job("01"), record("rollout", 0, 1)) == []
    assert book.register_group(job("01"), record("trainer", 0, 1)) == []  # colocated: one job
    conflicts = book.register_group(job("02", "b"), record("other", 1, 2))
    assert [c.describe() for c in conflicts] == [
        "gpu 1 (uuid=G1) of node 0 (10.0.0.1) is held by job 'a' (id 01, pid 1 on h), group 'rollout'"]
    assert ("02", "other") not in book.groups  # nothing recorded for a refused group
    assert book.register_group(job("02", "b"), record("other", 1, node="n1")) == []  # another node's gpu 1


def test_a_dead_driver_s_leases_end_and_the_job_table_is_read_only_when_it_matters() -> None:
    drivers = Drivers()
    book = LeaseBook(drivers)
    book.register_group(job("01"), record("rollout", 0))
    book.register_channel(job("01"), "items", "10.0.0.1")
    assert book.register_group(job("02", "b"), record("free", 3)) == []
    assert drivers.asked == 0
    drivers.dead.add("01")
    assert book.register_group(job("02", "b"), record("mine", 0)) == []
    assert drivers.asked == 1
    assert [j["id"] for j in book.snapshot()["jobs"]] == ["02"]
    assert book.snapshot()["channels"] == []


def test_deregistering_ends_the_leases_and_a_worker_s_nameless_job_takes_its_driver_s_name() -> None:
    book = LeaseBook(Drivers())
    book.register_channel(job("01", None), "items", "there")
    book.register_group(job("01", "pipeline"), record("rollout", 0))
    book.deregister_group("01", "rollout")
    assert book.register_group(job("02", "b"), record("mine", 0)) == []
    shown = book.snapshot()
    assert [(j["id"], j["name"], j["groups"]) for j in shown["jobs"]] == [("01", "pipeline", 0), ("02", "b", 1)]
    assert [(lease["device"], lease["job_name"], lease["group"]) for lease in shown["leases"]] == [
        ("gpu 0 (uuid=G0) of node 0 (10.0.0.1)", "b", "mine")]


def test_a_driver_that_names_its_job_again_renames_it_and_a_nameless_call_keeps_the_name() -> None:
    book = LeaseBook(Drivers())
    book.register_group(job("01", "pytest"), record("first", 0))
    book.register_group(job("01", "status-test"), record("second", 1))
    book.register_channel(job("01", None), "items", "there")  # a worker's channel: no name, no rename
    shown = book.snapshot()
    assert [(j["id"], j["name"], j["groups"]) for j in shown["jobs"]] == [("01", "status-test", 2)]
    assert {g["job_name"] for g in shown["groups"]} == {"status-test"}


# -- two drivers on the session's Ray cluster -----------------------------------------------------------------

HOLDER = """
import sys, ray, hwplace
ray.init(address=sys.argv[1])
section = {"num_nodes": 2, "component_placement": {"holder": "6-7"}}   # node 1's accelerators 2 and 3
cluster = hwplace.Cluster(section, job_name="holder-job")

class Idle(hwplace.Worker):
    pass

Idle.create_group().launch(cluster, hwplace.ComponentPlacement({"cluster": section}, cluster).get_strategy("holder"),
                           name="holder")
print("holding", flush=True)
sys.stdin.read()
"""

SECTION = {"num_nodes": 2, "component_placement": {"rollout": "7", "trainer": "7"}}


class Idle(hwplace.Worker):
    def rank_here(self) -> int:
        return self.rank


@pytest.fixture
def holder(hwplace_local_ray: LocalRay, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another driver on the session's cluster, holding node 1's accelerators 2-3 until it is killed."""
    with open(tmp_path / "stderr", "w") as err:
        process = subprocess.Popen([sys.executable, "-c", HOLDER, hwplace_local_ray.address], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "holding\n", (tmp_path / "stderr").read_text()[-3000:]
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.time_limit(240)
def test_a_device_another_job_holds_is_refused_until_its_driver_is_killed(holder: subprocess.Popen[str]) -> None:
    cluster = hwplace.Cluster(SECTION, job_name="second-job")
    placement = hwplace.ComponentPlacement({"cluster": SECTION}, cluster)
    with pytest.raises(hwplace.PlacementError, match=r"^group 'rollout' cannot start: fake-accelerator 3 "
                       r"\(uuid=\S+\) of node 1 \(\S+\) is held by job 'holder-job' \(id \w+, pid "
                       rf"{holder.pid} on \S+\), group 'holder'; a device is leased to one job at a time"):
        Idle.create_group().launch(cluster, placement.get_strategy("rollout"), name="rollout")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    for _attempt in range(120):  # Ray's job table marks the driver dead once its raylet sees it go: seconds
        try:
            rollout = Idle.create_group().launch(cluster, placement.get_strategy("rollout"), name="rollout")
            break
        except hwplace.PlacementError:
            time.sleep(0.5)
    else:
        pytest.fail("the killed driver's lease never ended")
    trainer = Idle.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer")  # colocated
    try:
        assert rollout.rank_here().wait() == trainer.rank_here().wait() == [0]
        leases = require(cluster.executor(), Leases).cluster_status(None)["leases"]
        assert sorted(lease["group"] for lease in leases if lease["index"] == 3) == ["rollout", "trainer"]
    finally:
        rollout.shutdown()
        trainer.shutdown()
    status = require(cluster.executor(), Leases).cluster_status(None)
    assert not [lease for lease in status["leases"] if lease["index"] == 3]
