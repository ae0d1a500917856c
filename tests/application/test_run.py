"""``hwplace run`` on the process executor (no Ray): what the job is named, its devices leased before any of
its groups launches, a plan whose memory does not fit its devices refused before the entry point runs, and what the
entry point returns."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from drivers import run_job, write_job

import hwplace
from hwplace.executor import current_executor
from hwplace.runtime.group import group_record
from hwplace.testing import process_cluster

pytestmark = pytest.mark.time_limit(240)  # a call that never answers fails its test rather than hangs

CONFIG = """\
job: {entrypoint: entry.py:main}
cluster:
  num_nodes: 1
  executor: processes
  component_placement: {first: 0-1, second: 2-3}
"""

ENTRY = """\
from pathlib import Path


def main(job):
    Path(__file__).with_name("called").touch()
    return sorted({j["name"] for j in job.cluster.executor().cluster_status(None)["jobs"]})


def unwritable(job):
    return {"steps": 3, "stats": [1.5, object()]}
"""


class Holder(hwplace.Worker):
    def hold(self, record: Any) -> str:
        """Lease ``record``'s devices as another job would: this worker's process is a job of its own."""
        current_executor().register_group(record)  # type: ignore[attr-defined]
        return "held"


def test_a_job_is_named_after_its_config_file_unless_job_name_says(tmp_path: Path) -> None:
    config = write_job(tmp_path, "grpo.yaml", CONFIG, entry=ENTRY)
    summary = str(tmp_path / "summary.json")
    with process_cluster(1, 4):
        assert run_job(str(config), "--summary", summary)[0] == 0
        assert json.loads(Path(summary).read_text()) == ["grpo"]  # not 'hwplace', the command's name
        assert run_job(str(config), "job.name=nightly", "--summary", summary)[0] == 0
        assert json.loads(Path(summary).read_text()) == ["nightly"]
        code, _, err = run_job(str(config), "job.name=''")
        assert (code, err.splitlines()[0]) == (2, "hwplace: error: job.name: is not a usable job name (got ''); "
                                                  "1 to 100 printable characters (leave it out to name the job "
                                                  "after its config file)")


def test_every_device_of_the_plan_is_leased_before_any_group_launches(tmp_path: Path) -> None:
    config = write_job(tmp_path, "clash.yaml", CONFIG, entry=ENTRY)
    with process_cluster(1, 4, cluster_cfg={"component_placement": {"holder": "0"}}, job_name="other-job") as cluster:
        holder = Holder.create_group().launch(
            cluster, hwplace.ComponentPlacement({"cluster": cluster.config}, cluster).get_strategy("holder"),
            name="holder")
        try:
            wanted = hwplace.FlexiblePlacementStrategy([[2]]).get_placement(cluster)  # what 'second' needs
            assert holder.hold(group_record(cluster, "held", Holder, wanted)).wait(timeout=60) == ["held"]
            code, _, err = run_job(str(config))
        finally:
            holder.shutdown()
    assert code == 2
    assert err.startswith("hwplace: error: job 'clash', before launching anything: group 'second' cannot start: "
                          "fake-accelerator 2 (uuid="), err
    assert "is held by job 'other-job'" in err
    assert not (tmp_path / "called").exists()  # refused before the entry point ran (and launched 'first')


def test_the_result_is_printed_and_a_summary_refuses_what_json_cannot_hold(tmp_path: Path) -> None:
    config = write_job(tmp_path, "results.yaml", CONFIG, entry=ENTRY)
    summary = tmp_path / "summary.json"
    with process_cluster(1, 4):
        code, out, _ = run_job(str(config))  # the result used to be dropped without --summary
        assert (code, out.splitlines()[-1]) == (0, "result: ['results']")
        code, out, err = run_job(str(config), "job.entrypoint=entry.py:unwritable", "--summary", str(summary))
    assert out.splitlines()[-1].startswith("result: {'stats': [1.5, <object object at 0x")
    assert code == 2  # it was written as "<object object at 0x...>", with exit 0
    assert err.startswith("hwplace: error: --summary: result['stats'][1] is an object (<object object at 0x"), err
    assert not summary.exists()


DOOMED = """\
job: {entrypoint: doomed.py:main}
cluster:
  num_nodes: 1
  executor: processes
  component_placement: {doomed: 0-1}
restart:
  doomed: {max_restarts: 2}
"""

class Doomed(hwplace.Worker):
    def __init__(self) -> None:
        if self.rank == 1:  # every process of rank 1 dies soon after it starts
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()


DOOMED_ENTRY = """\
import threading
from pathlib import Path
from test_run import Doomed


def main(job):
    job.launch(Doomed, "doomed")
    Path(__file__).with_name("waiting").touch()
    threading.Event().wait()  # never set: only the group's end can stop this wait
"""


@pytest.mark.parametrize("sigint", [signal.default_int_handler, signal.SIG_IGN],
                         ids=["from-a-terminal", "in-the-background"])  # `hwplace run job.yaml &` ignores SIGINT
def test_a_group_that_uses_up_its_restarts_ends_the_job_with_its_last_cause(tmp_path: Path, sigint: Any) -> None:
    config = write_job(tmp_path, "doomed.yaml", DOOMED, doomed=DOOMED_ENTRY)
    previous = signal.signal(signal.SIGINT, sigint)
    try:
        with process_cluster(1, 4):
            code, out, err = run_job(str(config))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (tmp_path / "waiting").exists()
    assert code == 1, err
    assert "restarts in place: 2 restarts per rank" in out
    assert "group 'doomed' rank 1 on node 0: the worker process died" in err, err
    assert "its restarts are used up (2 of 2)" in err, err


OVERSIZED = CONFIG + """\
resources:
  first: {memory: {train: 50GiB}}
"""


@pytest.mark.parametrize("simulated", [False, True], ids=["live-cluster", "nodes-option"])
def test_a_plan_whose_memory_does_not_fit_exits_2_naming_it_and_never_calls_the_entry_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, simulated: bool) -> None:
    config = write_job(tmp_path, "big.yaml", OVERSIZED, entry=ENTRY)
    if simulated:  # an offline inventory reads the variable here
        monkeypatch.setenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", "48GiB")
        code, out, err = run_job(str(config), "--nodes", "1x4")
    else:  # the live cluster's nodes detect their devices with it
        with process_cluster(1, 4, env_vars={"HWPLACE_FAKE_ACCELERATOR_MEMORY": "48GiB"}):
            code, out, err = run_job(str(config))
    assert code == 2, err
    assert err == ("hwplace: error: fake-accelerator 0 of node 0 does not hold its peak: 50 GiB (53687091200 bytes) "
                   "when first is in phase 'train' (first train 50 GiB), but the device has 48 GiB (51539607552 "
                   "bytes); 1 more device does not fit either; lower the figures of resources:, give a component "
                   "offloaded: or idle: and take turns, or place the components on other devices\n")
    assert not (tmp_path / "called").exists()  # the entry point never ran
    assert "first" not in out  # nor was a plan printed as if it would run
