"""Snapshot and resume (SPEC §12) on the process executor: ``job.snapshot`` records the driver's state, each
group's ``state_dict()`` and the job's channels (held items as not taken); ``hwplace run --resume DIR`` puts
them back; files are written atomically; and a driver SIGKILLed at random instants, resumed each time, trains
on every input its data cursor hands out exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from drivers import run_job, write_job

import hwplace
from hwplace.application.snapshots import SnapshotFolder, load_states
from hwplace.errors import ConfigError
from hwplace.testing import process_cluster

pytestmark = pytest.mark.time_limit(280)

CONFIG = """\
job: {entrypoint: pipeline.py:main, steps: 4, per_step: 3, total: 30, stop_after: -1, pause: 0.0, marker: ''}
cluster:
  num_nodes: 1
  executor: processes
  component_placement: {loader: 0, stage: 1, trainer: 2}
"""


class Loader(hwplace.Worker):
    """The job's data cursor: hands out inputs 0, 1, 2, ... into queue "raw"."""

    def __init__(self, channel):
        self.channel, self.cursor = channel, 0

    def feed(self, n, limit):
        for _ in range(n):
            if self.cursor < limit:
                self.channel.put(self.cursor, weight=1, queue_name="raw")
                self.cursor += 1
        return self.cursor

    def state_dict(self):
        return {"cursor": self.cursor}

    def load_state_dict(self, state):
        self.cursor = state["cursor"]


class Stage(hwplace.Worker):
    """Takes from "raw" with ack=False and keeps what it took held until its next call: at every step boundary
    some items are in flight, held; it puts them into "scored" acknowledging them, in one step."""

    def __init__(self, channel):
        self.channel, self.pending = channel, None

    def move(self, n):
        if self.pending:
            self.channel.put(list(self.pending), weight=len(self.pending), queue_name="scored", ack=self.pending)
        self.pending = None
        size = self.channel.qsize("raw")
        if size:
            self.pending = self.channel.get_batch(min(n, size), queue_name="raw", ack=False, timeout=30)


class Trainer(hwplace.Worker):
    """Trains on what reaches "scored": its history is the model's."""

    def __init__(self, channel):
        self.channel, self.history = channel, []

    def train(self):
        while self.channel.qsize("scored"):
            batch = self.channel.get(queue_name="scored", ack=False, timeout=30)
            self.history.extend(batch)
            self.channel.ack(batch)

    def state_dict(self):
        return {"history": list(self.history)}

    def load_state_dict(self, state):
        self.history = list(state["history"])

    def trained(self):
        return self.history



PIPELINE = '''\
import time
from pathlib import Path

from test_snapshots import Loader, Stage, Trainer


def main(job):
    s = job.settings(steps=4, per_step=3, total=30, stop_after=-1, pause=0.0, marker="")
    if s.marker:
        Path(s.marker).touch()
    channel = job.channel("items")
    loader = job.launch(Loader, "loader", channel)
    stage = job.launch(Stage, "stage", channel)
    trainer = job.launch(Trainer, "trainer", channel)
    first = job.resumed.step + 1 if job.resumed else 0
    for step in range(first, s.steps):
        loader.feed(s.per_step, s.total).wait()
        stage.move(2).wait()
        trainer.train().wait()
        job.snapshot(step, {"step": step, "resumed": job.resumed.step if job.resumed else None})
        if step == s.stop_after:
            return {"stopped": step}
        time.sleep(s.pause)
    loader.feed(s.total, s.total).wait()  # the rest, all the way through
    stage.move(s.total).wait()
    stage.move(s.total).wait()
    trainer.train().wait()
    return {"history": trainer.trained().wait()[0], "resumed": job.resumed.step if job.resumed else None}
'''


def job_on(cluster: hwplace.Cluster, **options: Any) -> hwplace.Job:
    """A job on ``cluster`` with the cluster's own config, its placement as the test gave it."""
    config = {"cluster": cluster.config}
    return hwplace.Job(config, cluster, hwplace.ComponentPlacement(config, cluster), **options)


def test_a_snapshot_holds_a_consistent_cut_and_a_resumed_run_finishes_it(tmp_path: Path) -> None:
    config = write_job(tmp_path, "pipeline.yaml", CONFIG, pipeline=PIPELINE)
    snapshots, summary = tmp_path / "snapshots", tmp_path / "summary.json"
    with process_cluster(1, 4):
        code, out, err = run_job(str(config), "job.stop_after=2", "--snapshots", str(snapshots))
        assert code == 0, err
        assert [step for step, _ in SnapshotFolder(snapshots).steps()] == [1, 2]  # the newest two are kept
        found = SnapshotFolder(snapshots).newest()
        assert found is not None
        record, _ = found
        assert (record["step"], record["state"]) == (2, {"step": 2, "resumed": None})
        assert record["groups"]["loader"] == [{"cursor": 9}]
        history = record["groups"]["trainer"][0]["history"]
        assert "stage" not in record["groups"]  # no state_dict: nothing kept
        contents = record["channels"]["items"]
        raw, scored = contents.items("raw"), contents.items("scored")
        # fed 3 a step, moved 2 a step: the stage still holds 4 and 5 (taken at step 2 with ack=False), which
        # lead "raw" as not taken; the trainer trained on what the stage put before
        assert (history, raw, scored) == ([0, 1, 2, 3], [4, 5, 6, 7, 8], [])
        assert contents.sizes() == {"raw": 5}

    with process_cluster(1, 4):  # a cluster of its own: the first run's channel names stay taken on that one
        code, out, err = run_job(str(config), "--resume", str(snapshots), "--summary", str(summary))
        assert code == 0, err
    assert f"resuming from {snapshots / 'snapshot-000000000002.pkl'} (step 2)" in out
    result = json.loads(summary.read_text())
    assert result["resumed"] == 2
    assert sorted(result["history"]) == list(range(30))  # every input once: none lost, none twice


def test_folders_are_checked_and_snapshot_without_one_says_so_once(tmp_path: Path, capsys) -> None:
    config, snapshots = write_job(tmp_path, "pipeline.yaml", CONFIG, pipeline=PIPELINE), tmp_path / "snapshots"
    with process_cluster(1, 4):  # one cluster a run: a job's channel names stay taken on its cluster
        assert run_job(str(config), "job.steps=2", "job.total=6")[0] == 0
    assert capsys.readouterr().err.count("keeps nothing: run with --snapshots DIR") == 1
    with process_cluster(1, 4):
        assert run_job(str(config), "job.steps=2", "job.total=6", "--snapshots", str(snapshots))[0] == 0
    code, _, err = run_job(str(config), "--snapshots", str(snapshots))  # refused before any cluster is asked
    assert code == 2
    assert f"--snapshots: {snapshots} holds snapshots of an earlier run (the newest of step 1); continue that " \
           f"run with --resume {snapshots}, or name another folder" in err
    code, _, err = run_job(str(config), "--resume", str(tmp_path / "missing"))
    assert (code, err.splitlines()[0]) == (2, f"hwplace: error: --resume: there is no such folder (got "
                                              f"'{tmp_path / 'missing'}'); the folder an earlier run kept its "
                                              "snapshots in (hwplace run --snapshots DIR)")
    code, _, err = run_job(str(config), "--snapshots", str(tmp_path / "no" / "such"))
    assert "--snapshots: names a folder whose parent does not exist" in err
    (tmp_path / "empty").mkdir()
    with process_cluster(1, 4):
        code, out, err = run_job(str(config), "job.steps=1", "job.total=3", "--resume", str(tmp_path / "empty"))
    assert code == 0, err
    assert f"resume: {tmp_path / 'empty'} holds no snapshot yet; starting from the beginning" in out
    assert [step for step, _ in SnapshotFolder(tmp_path / "empty").steps()] == [0]


class Forgetful(hwplace.Worker):
    def state_dict(self):
        return {}


def test_snapshot_refuses_what_could_not_be_resumed_and_keeps_the_channels_it_is_given(tmp_path: Path) -> None:
    placement_cfg = {"component_placement": {"loader": "0", "forgetful": "1"}}
    folder = SnapshotFolder(tmp_path / "s")
    with process_cluster(1, 4, cluster_cfg=placement_cfg) as cluster:
        job = job_on(cluster, snapshots=folder)
        made = hwplace.Channel.create("made-elsewhere", cluster=cluster)  # by a worker, say: not job.channel's
        try:
            loader = job.launch(Loader, "loader", made)
            loader.feed(3, 3).wait()
            path = job.snapshot(5, "state", channels=[made])
            assert path == tmp_path / "s" / "snapshot-000000000005.pkl"
            with pytest.raises(ConfigError, match=r"step: is before that of the newest snapshot in .* \(5\) "
                                                  r"\(got 4\); steps that grow from one snapshot to the next"):
                job.snapshot(4)
            job.launch(Forgetful, "forgetful")
            with pytest.raises(ConfigError, match="group 'forgetful': Forgetful defines state_dict\\(\\) but not "
                                                  "load_state_dict\\(state\\), so a resumed job could not put the "
                                                  "state back; define both, or neither"):
                job.snapshot(6)
        finally:
            job.shutdown()
    with process_cluster(1, 4, cluster_cfg=placement_cfg) as cluster:
        found = folder.newest()
        assert found is not None
        job = job_on(cluster, resume_from=found)
        try:
            assert (job.resumed.step, job.resumed.state) == (5, "state")  # type: ignore[union-attr]
            again = hwplace.Channel.create("made-elsewhere", cluster=cluster)  # refilled as it is made
            assert job.refill(again)  # the snapshot held it: put back once, not twice
            assert again.qsize("raw") == 3
            assert [again.get(queue_name="raw", timeout=10) for _ in range(3)] == [0, 1, 2]
            loader = job.launch(Loader, "loader", again)
            assert loader.feed(1, 10).wait() == [4]  # its cursor came back: 3, then one more
            assert not job.refill(hwplace.Channel.create("not-in-it", cluster=cluster))
        finally:
            job.shutdown()


class Publisher(hwplace.Worker):
    def publish(self, sync, value):
        return sync.publish({"w": np.full(4, value, dtype=np.float32)})


class Reader(hwplace.Worker):
    def latest(self, sync, min_version):
        weights = sync.latest(min_version=min_version, timeout=120)
        return weights.version, float(weights.tensors["w"][0])


def test_a_resumed_job_s_weight_sync_goes_on_from_the_version_its_snapshot_recorded(tmp_path: Path) -> None:
    placement_cfg = {"component_placement": {"trainer": "0", "rollout": "1-2"}}
    folder = SnapshotFolder(tmp_path / "s")
    with process_cluster(1, 4, cluster_cfg=placement_cfg) as cluster:
        job = job_on(cluster, snapshots=folder)
        try:
            trainer, rollout = job.launch(Publisher, "trainer"), job.launch(Reader, "rollout")
            sync = job.weight_sync("policy", "trainer", ("rollout",))
            assert [trainer.publish(sync, v).wait()[0] for v in (1.0, 2.0, 3.0)] == [1, 2, 3]
            assert rollout.latest(sync, 3).wait() == [(3, 3.0)] * 2
            job.snapshot(7)
        finally:
            job.shutdown()
    with process_cluster(1, 4, cluster_cfg=placement_cfg) as cluster:  # the driver and its cluster are new
        job = job_on(cluster, resume_from=folder.newest())
        try:
            trainer, rollout = job.launch(Publisher, "trainer"), job.launch(Reader, "rollout")
            sync = job.weight_sync("policy", "trainer", ("rollout",))
            assert trainer.publish(sync, 4.0).wait() == [4]  # not 1: a target's min_version of 3 still means newer
            assert rollout.latest(sync, 4).wait() == [(4, 4.0)] * 2
            other = job.weight_sync("other", "trainer", ("rollout",))  # not in the snapshot: from the beginning
            assert trainer.publish(other, 1.0).wait() == [1]
        finally:
            job.shutdown()


def test_what_the_driver_makes_without_the_job_is_in_its_snapshots_and_comes_back_when_resumed(
        tmp_path: Path) -> None:
    """SPEC §12: a snapshot records every channel's items and the newest version of each weight sync. Those the
    entry point makes with hwplace.Channel.create and hwplace.WeightSync.create count too."""
    placement_cfg = {"component_placement": {"trainer": "0", "rollout": "1-2"}}
    folder = SnapshotFolder(tmp_path / "s")
    with process_cluster(1, 4, cluster_cfg=placement_cfg) as cluster:
        job = job_on(cluster, snapshots=folder)
        try:
            trainer, rollout = job.launch(Publisher, "trainer"), job.launch(Reader, "rollout")
            sync = hwplace.WeightSync.create("direct", "trainer", ("rollout",), cluster=cluster)
            assert [trainer.publish(sync, v).wait()[0] for v in (1.0, 2.0)] == [1, 2]
            work = hwplace.Channel.create("driver-made", cluster=cluster)
            for item in ("a", "b", "c"):
                work.put(item, weight=1, version=2)
            assert work.get(timeout=10) == "a"  # taken before the snapshot: not in it
            hwplace.Channel.create("closed-before", cluster=cluster).close()  # nothing to keep: left out
            job.snapshot(3)  # no channels named: every one this driver made
        finally:
            job.shutdown()
    with process_cluster(1, 4, cluster_cfg=placement_cfg) as cluster:  # the driver and its cluster are new
        job = job_on(cluster, resume_from=folder.newest())
        try:
            trainer, rollout = job.launch(Publisher, "trainer"), job.launch(Reader, "rollout")
            sync = hwplace.WeightSync.create("direct", "trainer", ("rollout",), cluster=cluster)
            assert trainer.publish(sync, 3.0).wait() == [3]  # goes on from the version the snapshot recorded
            assert rollout.latest(sync, 3).wait() == [(3, 3.0)] * 2
            work = hwplace.Channel.create("driver-made", cluster=cluster)
            assert work.qsize() == 2
            assert [work.get(timeout=10), work.get(timeout=10)] == ["b", "c"]
            assert work.stats().stale == 0
            assert hwplace.Channel.create("new-here", cluster=cluster).qsize() == 0
            assert not job.refill(hwplace.Channel.create("closed-before", cluster=cluster))
        finally:
            job.shutdown()


def test_a_group_resumed_with_another_rank_count_or_without_load_state_dict_is_named() -> None:
    group = SimpleNamespace(name="trainer", world_size=2, worker_class=Trainer)
    with pytest.raises(ConfigError, match="group 'trainer': has 2 ranks, but the snapshot resumed from holds the "
                                          "state of 1; resume with the placement the snapshot was taken with"):
        load_states(group, [{"history": []}])  # type: ignore[arg-type]
    group = SimpleNamespace(name="stage", world_size=1, worker_class=Stage)
    with pytest.raises(ConfigError, match="group 'stage': Stage has no load_state_dict"):
        load_states(group, [{}])  # type: ignore[arg-type]


# -- atomic writes --------------------------------------------------------------------------------------------

def test_snapshots_keep_the_newest_and_pass_over_a_torn_file(tmp_path: Path) -> None:
    said: list[str] = []
    folder = SnapshotFolder(tmp_path / "s", keep=2, say=said.append)
    for step in (1, 2, 3):
        folder.write(step, {"format": "hwplace snapshot 1", "step": step, "state": step})
    assert [step for step, _ in folder.steps()] == [2, 3]
    whole = (tmp_path / "s" / "snapshot-000000000003.pkl").read_bytes()
    (tmp_path / "s" / "snapshot-000000000004.pkl").write_bytes(whole[:20])  # torn: never written so by hwplace
    found = folder.newest()
    assert found is not None
    assert found[0]["state"] == 3
    assert said == [f"snapshot {tmp_path / 's' / 'snapshot-000000000004.pkl'} cannot be read (UnpicklingError: "
                    "pickle data was truncated); trying the one before it"]
    with pytest.raises(ConfigError, match="--keep-snapshots: is how many snapshots to keep"):
        SnapshotFolder(tmp_path, keep=0)


WRITER = """\
import os, sys, time
from hwplace.application.snapshots import SnapshotFolder, load_states


class Slow:
    def __reduce__(self):  # pickled halfway through the file: the writer is killed here
        open(sys.argv[2], "w").close()
        time.sleep(600)
        return (Slow, ())


folder = SnapshotFolder(sys.argv[1])
folder.write(1, {"format": "hwplace snapshot 1", "step": 1, "state": "whole"})
folder.write(2, {"format": "hwplace snapshot 1", "step": 2, "state": ["x" * 100_000, Slow()]})
"""


def test_a_writer_killed_while_writing_leaves_the_previous_snapshot_usable(tmp_path: Path) -> None:
    marker = tmp_path / "writing"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "s"), str(marker)])
    try:
        while not marker.exists():
            assert child.poll() is None, "the writer ended before it was killed"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    leftovers = [entry.name for entry in (tmp_path / "s").iterdir()]
    assert len(leftovers) == 2
    assert "snapshot-000000000001.pkl" in leftovers
    folder = SnapshotFolder(tmp_path / "s")
    found = folder.newest()
    assert found is not None
    assert (found[0]["step"], found[0]["state"]) == (1, "whole")
    folder.write(2, {"format": "hwplace snapshot 1", "step": 2, "state": "again"})
    assert sorted(entry.name for entry in (tmp_path / "s").iterdir()) == ["snapshot-000000000001.pkl",
                                                                          "snapshot-000000000002.pkl"]


# -- the invariant in miniature --------------------------------------------------------------------------------

DRIVER = """\
import sys
from hwplace.application.cli import main
from hwplace.testing import process_cluster

with process_cluster(1, 4):
    sys.exit(main(["run", *sys.argv[1:]]))
"""


# the job's module imports this one, which imports tests/drivers.py
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1]),
                                                    os.environ.get("PYTHONPATH", "")])}


def newest_step(folder: Path) -> int:
    steps = SnapshotFolder(folder).steps()
    return steps[-1][0] if steps else -1


def test_a_driver_killed_at_random_instants_and_resumed_trains_on_every_input_exactly_once(tmp_path: Path) -> None:
    config = write_job(tmp_path, "pipeline.yaml", CONFIG, pipeline=PIPELINE)
    snapshots, summary = tmp_path / "snapshots", tmp_path / "summary.json"
    snapshots.mkdir()
    marker = tmp_path / "started"
    # 60 steps of at least 0.05 s: six kills, each at most 0.6 s past the start or 0.3 s past a new snapshot,
    # cannot reach the end, so every attempt is killed
    settings = ["job.steps=60", "job.per_step=3", "job.total=180", "job.pause=0.05", f"job.marker={marker}"]
    command = [sys.executable, "-c", DRIVER, str(config), *settings, "--resume", str(snapshots), "--summary",
               str(summary)]
    rng = random.Random(23)
    killed_at: list[int] = []  # the newest snapshot's step when each kill landed
    for attempt in range(6):
        marker.unlink(missing_ok=True)
        before = newest_step(snapshots)
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        try:
            while not marker.exists() and child.poll() is None:  # the entry point runs
                time.sleep(0.01)
            # every other kill waits for a new snapshot first, so that the job makes progress between kills;
            # then anywhere: launching groups, inside a step, while a snapshot is written
            while attempt % 2 and newest_step(snapshots) == before and child.poll() is None:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.3 if attempt % 2 else 0.6))
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                killed_at.append(newest_step(snapshots))
        finally:
            child.kill()
            child.wait()
        if summary.exists():
            break
    print(f"killed at the newest snapshot steps {killed_at}")
    assert len(killed_at) >= 3, killed_at
    assert len(set(killed_at)) >= 2, killed_at  # resumed from more than one point
    if not summary.exists():  # the last run, undisturbed
        finished = subprocess.run(command, capture_output=True, text=True, timeout=200, env=ENV)
        assert finished.returncode == 0, finished.stderr
    result = json.loads(summary.read_text())
    assert result["resumed"] is not None
    assert sorted(result["history"]) == list(range(180))  # every input the cursor handed out, once
