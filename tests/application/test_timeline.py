"""The timeline: worker files merged into a Chrome / Perfetto trace, and ``hwplace run --trace/--profile`` on a small
colocated job of the process executor (channel waits, turns, weight publish, latest and load_into), whose spans cover
each worker's group calls; and a rank killed and restarted in place under tracing, whose new process's track has one
``restart`` span."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from traces import ORIGIN_NS, write_worker

import hwplace
from hwplace.application.cli import main
from hwplace.application.timeline import merge, recording
from hwplace.application.trace_report import TraceSummary
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.settings import TRACE_DIR
from hwplace.testing import process_cluster

STEPS = 4

CONFIG = """\
job: {entrypoint: "test_timeline:traced_job"}
cluster:
  num_nodes: 1
  executor: processes
  component_placement: {"trainer,rollout": 0-1}
resources:
  rollout: {memory: {generate: 2GiB, offloaded: 1GiB}}
"""

class Sharer(hwplace.Worker):
    """Counts its offload() and onload() calls, to compare with their spans."""

    def __init__(self) -> None:
        self.hooks = {"offload": 0, "onload": 0}

    def offload(self) -> None:
        self.hooks["offload"] += 1

    def onload(self) -> None:
        self.hooks["onload"] += 1

    def hook_calls(self) -> dict[str, int]:
        return self.hooks


class Trainer(Sharer):
    def attach(self, sync: hwplace.WeightSync) -> int:
        return sync.publish({"w": np.zeros(4, np.float32)}) if self.rank == 0 else 1

    def step(self, sync: hwplace.WeightSync, experience: hwplace.Channel, step: int) -> int:
        batch = experience.get_batch(1, timeout=60)
        with self.turn():
            if self.rank == 0:
                sync.publish({"w": np.full(4, step, np.float32)})
            time.sleep(0.02)  # work: a rollout rank may wait for its turn meanwhile
        return len(batch)


class Module:
    """What ``WeightSync.load_into`` loads into: anything with ``load_state_dict`` (no torch needed)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state


class Rollout(Sharer):
    def load(self, sync: hwplace.WeightSync) -> list[int]:
        """Rank r loads the newest weights r + 1 times: the versions loaded."""
        return [sync.load_into(Module(), min_version=STEPS, timeout=60) for _ in range(self.rank + 1)]

    def generate(self, sync: hwplace.WeightSync, experience: hwplace.Channel, steps: int) -> int:
        for version in range(1, steps + 1):
            weights = sync.latest(min_version=version, timeout=60)
            with self.turn():
                experience.put(float(weights.tensors["w"][0]), weight=1)
                time.sleep(0.02)
        return steps


def traced_job(job: hwplace.Job) -> dict[str, Any]:
    """The job the run test traces: two trainer and two rollout ranks taking turns on two accelerators; returns how
    often each rank's offload() and onload() ran, and the versions each rollout rank loaded (load_into) at the end."""
    experience = hwplace.Channel.create("experience", maxsize=4)
    trainer = job.launch(Trainer, "trainer")
    rollout = job.launch(Rollout, "rollout")
    sync = hwplace.WeightSync.create("policy", source="trainer", targets=("rollout",))
    trainer.attach(sync).wait(timeout=60)
    producing = rollout.generate(sync, experience, STEPS)
    for step in range(1, STEPS + 1):
        trainer.step(sync, experience, step).wait(timeout=60)
    producing.wait(timeout=60)
    return {"trainer": trainer.hook_calls().wait(timeout=60), "rollout": rollout.hook_calls().wait(timeout=60),
            "loaded": rollout.load(sync).wait(timeout=60)}


def test_merge_names_a_process_per_node_and_a_track_per_worker_thread(tmp_path: Path) -> None:
    write_worker(tmp_path, "trainer", 1, [("step", "call", 5, 10)], node=1, devices=["fake-accelerator 0"], pid=7)
    path = write_worker(tmp_path, "trainer", 0, [("step", "call", 2, 10), ("get", "wait", 3, 4, {"channel": "c"})],
                        pid=8)
    with path.open("a") as file:  # a process that died mid-line, and a second thread of it
        file.write(f'{{"thread": 9, "name": "loader"}}\n{{"n": "get", "c": "wait", "ts": {ORIGIN_NS + 3 * 10**6}, '
                   '"d": 5, "t": 9}\n{"n": "g')
    trace = merge(tmp_path)
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert names == {(1, 7): "trainer rank 1", (0, 8): "trainer rank 0", (0, 9): "trainer rank 0: loader"}
    assert {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"} == {0: "node 0", 1: "node 1"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["pid"], e["tid"], e["ts"], e["dur"]) for e in spans] == [
        ("step", 0, 8, 0.0, 8000.0), ("get", 0, 8, 1000.0, 1000.0), ("get", 0, 9, 1000.0, 0.005),
        ("step", 1, 7, 3000.0, 5000.0)]
    assert spans[1]["args"] == {"channel": "c"}
    assert spans[1]["cat"] == "wait"
    tracks = trace["otherData"]["hwplace"]["tracks"]
    assert tracks["1:7"]["devices"] == ["fake-accelerator 0"]
    assert tracks["0:9"]["main"] is False
    assert trace["otherData"]["hwplace"]["origin_ns"] == ORIGIN_NS + 2 * 10**6


def test_recording_gives_workers_a_folder_and_writes_the_files_even_when_the_run_fails(tmp_path: Path) -> None:
    trace_file, profile_file = tmp_path / "t.json", tmp_path / "p.json"
    before = os.environ.get(TRACE_DIR)
    folders, records = [], []

    def failing_run() -> None:
        with recording(str(trace_file), str(profile_file)) as recorded:
            records.append(recorded)
            folders.append(Path(os.environ[TRACE_DIR]))
            write_worker(folders[0], "trainer", 0, [("step", "call", 0, 1)])
            raise RuntimeError("the job failed")

    with pytest.raises(RuntimeError, match="the job failed"):
        failing_run()
    folder = folders[0]
    assert os.environ.get(TRACE_DIR) == before
    assert not folder.exists()
    assert [e["name"] for e in json.loads(trace_file.read_text())["traceEvents"] if e["ph"] == "X"] == ["step"]
    assert list(json.loads(profile_file.read_text())["components"]["trainer"]["points"][0]["stages"]) == ["step"]
    assert records[0].profile == json.loads(profile_file.read_text())  # what was written, for the caller
    with recording(None, None) as recorded:
        assert recorded.profile is None
        assert os.environ.get(TRACE_DIR) == before
    with pytest.raises(ConfigError, match="--profile: names a file in a folder that does not exist"), \
            recording(None, str(tmp_path / "nowhere" / "p.json")):
        pass


@pytest.mark.time_limit(240)
def test_a_traced_run_has_a_span_for_every_call_wait_turn_and_weight_version(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(CONFIG)
    trace_file, profile_file = tmp_path / "trace.json", tmp_path / "profile.json"
    out, err = io.StringIO(), io.StringIO()
    with process_cluster(1, 2):
        code = main(["run", str(tmp_path / "job.yaml"), "--trace", str(trace_file), "--profile", str(profile_file),
                     "--summary", str(tmp_path / "summary.json")], out, err)
    assert code == 0, err.getvalue()
    assert f"trace: {trace_file}\nprofile: {profile_file}\n" in out.getvalue()
    trace = json.loads(trace_file.read_text())
    tracks = trace["otherData"]["hwplace"]["tracks"]
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 and f"{e['pid']}:{e['tid']}" in tracks for e in spans)
    by_worker: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
    for e in spans:
        track = tracks[f"{e['pid']}:{e['tid']}"]
        by_worker[track["group"], track["rank"]][f"{e['cat']}:{e['name']}"] += 1
    assert set(by_worker) == {("trainer", 0), ("trainer", 1), ("rollout", 0), ("rollout", 1)}
    for rank in (0, 1):
        trainer, rollout = by_worker["trainer", rank], by_worker["rollout", rank]
        assert (trainer["call:__init__"], trainer["call:attach"], trainer["call:step"]) == (1, 1, STEPS)
        assert trainer["wait:get_batch"] == STEPS
        assert trainer["turn:turn"] == STEPS
        assert trainer["wait:turn.wait"] == STEPS
        assert (rollout["call:generate"], rollout["wait:weights.latest"], rollout["turn:turn"]) == (1, STEPS, STEPS)
        assert rollout["wait:put"] == STEPS
    hooks = json.loads((tmp_path / "summary.json").read_text())
    for group in ("trainer", "rollout"):
        for rank in (0, 1):
            for hook in ("offload", "onload"):
                assert by_worker[group, rank][f"memory:{hook}"] == hooks[group][rank][hook]
    assert by_worker["trainer", 0]["sync:weights.publish"] == STEPS + 1
    assert by_worker["trainer", 1]["sync:weights.publish"] == 0
    newest = STEPS + 1  # attach published version 1, each step one more
    assert hooks["loaded"] == [[newest], [newest, newest]]  # rank r loaded r + 1 times: a span for each load_into
    assert [by_worker["rollout", rank]["sync:weights.load_into"] for rank in (0, 1)] == [1, 2]
    assert [by_worker["trainer", rank]["sync:weights.load_into"] for rank in (0, 1)] == [0, 0]
    assert all(e["args"] == {"sync": "policy"} for e in spans if e["name"] == "weights.load_into")
    for (group, rank), _counts in by_worker.items():  # every span but the time between calls lies inside a group call
        calls = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["cat"] == "call"
                 and tracks[f"{e['pid']}:{e['tid']}"]["group"] == group
                 and tracks[f"{e['pid']}:{e['tid']}"]["rank"] == rank]
        for e in spans:
            track = tracks[f"{e['pid']}:{e['tid']}"]
            if (track["group"], track["rank"]) == (group, rank) and e["cat"] != "idle":
                assert any(start - 1 <= e["ts"] and e["ts"] + e["dur"] <= end + 1 for start, end in calls), e
    summary = TraceSummary(trace)
    assert set(summary.devices) == {(0, "fake-accelerator 0"), (0, "fake-accelerator 1")}
    assert summary.devices[0, "fake-accelerator 0"]
    coverage = summary.coverage()  # calls, and the time between them, join: the spans cover all of it
    assert set(coverage) == {"trainer rank 0", "trainer rank 1", "rollout rank 0", "rollout rank 1"}
    assert all(share >= 0.999 for share in coverage.values()), coverage
    assert by_worker["trainer", 0]["idle:between calls"] >= STEPS + 1  # after the constructor, attach and each step
    profile: dict[str, Any] = json.loads(profile_file.read_text())
    assert profile["weight_sync"] == {"policy": {"bytes": 16}}  # four float32
    (trainer_point,) = profile["components"]["trainer"]["points"]
    (rollout_point,) = profile["components"]["rollout"]["points"]
    assert [trainer_point[key] for key in ("processes", "devices_per_process", "placement")] == [2, 1, "0-1"]
    assert list(trainer_point["stages"]) == ["step"]  # not attach nor hook_calls: called once
    assert list(rollout_point["stages"]) == ["generate"]  # called once, but it runs through the run
    assert rollout_point["memory"] == {"generate": 2 << 30, "offloaded": 1 << 30}  # declared: fakes report none
    for point, group in ((trainer_point, "trainer"), (rollout_point, "rollout")):
        assert ("offload" in point) == any(hooks[group][rank]["offload"] for rank in (0, 1))


class Restartable(hwplace.Worker):
    """A worker without ``on_restart``: a restarted rank's ``restart`` span is recorded all the same."""

    def pid(self) -> int:
        return os.getpid()

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.time_limit(240)
def test_a_rank_killed_and_restarted_has_one_restart_span_naming_its_cause_and_attempt(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    with process_cluster(1, 2, cluster_cfg={"component_placement": {"svc": "0-1"}}) as cluster, \
            recording(str(trace_file), None):
        strategy = hwplace.ComponentPlacement(cluster.config, cluster).get_strategy("svc")
        group = Restartable.create_group().launch(cluster, strategy, name="svc", restart=hwplace.Restart(1))
        try:
            before = group.pid().wait(timeout=60)
            with pytest.raises(hwplace.WorkerError, match="it is being restarted"):
                group.execute_on(1).die().wait(timeout=60)
            while group.status()[1].state != "serving":  # the module's limit bounds the wait
                time.sleep(0.05)
            after = group.pid().wait(timeout=60)  # a call that reaches the new process: it serves
            cause = group.status()[1].cause
        finally:
            group.shutdown()
    assert after[0] == before[0]
    assert after[1] != before[1]
    trace = json.loads(trace_file.read_text())
    tracks = trace["otherData"]["hwplace"]["tracks"]
    restarts = [(tracks[f"{e['pid']}:{e['tid']}"], e) for e in trace["traceEvents"]
                if e["ph"] == "X" and e["name"] == "restart"]
    assert len(restarts) == 1, restarts  # none on rank 0, nor on rank 1's first process
    track, span = restarts[0]
    assert (track["group"], track["rank"], track["os_pid"]) == ("svc", 1, after[1])  # the new process's track
    assert span["cat"] == "restart"
    assert span["args"] == {"attempt": 1, "cause": cause}
    assert "the worker process died" in cause
    new_calls = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == span["pid"]
                 and e["tid"] == span["tid"] and e["cat"] == "call"]
    constructor = next(e for e in new_calls if e["name"] == "__init__")
    assert "on_restart" not in {e["name"] for e in new_calls}  # the class defines none
    end = span["ts"] + span["dur"]  # the restart covers the constructor, and ends before the first call (in µs)
    assert span["ts"] <= constructor["ts"] + 0.001
    assert constructor["ts"] + constructor["dur"] <= end + 0.001
    assert end <= min(e["ts"] for e in new_calls if e["name"] != "__init__") + 0.001
