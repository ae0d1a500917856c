"""The example RL pipeline (examples/rl-pipeline) end to end on the session's two-node Ray cluster: as
configured, colocated, on two nodes, and with a worker killed mid-run. ``hwplace run`` on a fresh clone is
tests/test_fresh_clone.py's."""

from __future__ import annotations

import io
import os
import signal
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import hwplace
from hwplace.application.cli import main
from hwplace.application.job import load_entrypoint
from hwplace.pytest_plugin import LocalRay

PIPELINE = Path(__file__).resolve().parents[3] / "examples" / "rl-pipeline"
STEPS = 6
TOKENS = 1024  # per rank and step

pytestmark = pytest.mark.time_limit(240)  # a broken pipeline fails its test rather than hangs the suite


def run_variant(name: str) -> tuple[dict[str, Any], str]:
    config = hwplace.load_config(PIPELINE / name)
    config["job"].update(steps=STEPS, tokens_per_rank=TOKENS)
    out = io.StringIO()
    summary = hwplace.run_job(config, base=PIPELINE, out=out)
    return summary, out.getvalue()


def check_summary(summary: dict[str, Any], ranks: int) -> None:
    assert summary["steps"] == STEPS
    assert len(summary["rank_tokens"]) == ranks
    assert all(tokens >= STEPS * TOKENS for tokens in summary["rank_tokens"])  # get_batch gives at least TOKENS
    assert summary["tokens"] == sum(summary["rank_tokens"])
    assert summary["sources"]["rollout"] > 0
    assert summary["sources"]["robot"] > 0
    assert summary["robots"] == ["arm-left", "arm-right"]
    assert summary["imbalance"] < 1.1
    assert summary["loss_last"] < summary["loss_first"]  # the policy learns the pattern
    assert set(summary["stages"]) == {"env: make tasks", "rollout: generate", "robot: record demos",
                                      "trainer: wait for batch", "trainer: forward and backward",
                                      "trainer: all_reduce", "trainer: optimizer and check"}


def test_the_pipeline_runs_as_configured(hwplace_local_ray: LocalRay, capsys: pytest.CaptureFixture[str]) -> None:
    summary, plan = run_variant("pipeline.yaml")
    check_summary(summary, ranks=2)
    assert "trainer: 2 processes on group cluster, placement '2-3'" in plan
    assert "FAKE_ROBOTS=arm-left" in plan
    printed = capsys.readouterr()
    assert f"summary: {STEPS} training steps in " in printed.out
    assert "weights: identical on every trainer rank after each step" in printed.out
    assert f"training [{'#' * 30}] {STEPS}/{STEPS} loss " in printed.err  # the progress bar, finished


def test_the_colocated_variant_runs(hwplace_local_ray: LocalRay) -> None:
    summary, plan = run_variant("colocated.yaml")
    check_summary(summary, ranks=2)
    assert "rollout: 2 processes on group cluster, placement '0-1'" in plan
    assert "trainer: 2 processes on group cluster, placement '0-1'" in plan


def test_the_multinode_variant_trains_across_both_nodes(hwplace_local_ray: LocalRay) -> None:
    summary, plan = run_variant("multinode.yaml")
    check_summary(summary, ranks=4)
    trainer_table = plan.split("trainer: 4 processes")[1].split("\n\n")[0]
    assert [line.split()[1] for line in trainer_table.splitlines()[2:]] == ["0", "0", "1", "1"]


def test_a_worker_killed_mid_run_is_a_worker_error_not_a_hang(hwplace_local_ray: LocalRay, tmp_path: Path) -> None:
    config = hwplace.load_config(PIPELINE / "pipeline.yaml")
    config["job"].update(steps=10_000, tokens_per_rank=TOKENS)
    entry = load_entrypoint(config, PIPELINE)
    pids = tmp_path / "pids"

    def record_pid(worker: hwplace.Worker) -> None:
        with open(pids, "a") as file:
            file.write(f"{worker.rank} {os.getpid()}\n")

    # the pipeline's own rollout worker, telling the test its process id
    entry.__globals__["Rollout"] = type("Recorded", (entry.__globals__["Rollout"],), {"__init__": record_pid})
    cluster = hwplace.Cluster(config["cluster"])
    job = hwplace.Job(config, cluster, hwplace.ComponentPlacement(config, cluster))
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            entry(job)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while "trainer" not in job.groups and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # training is under way
        assert thread.is_alive(), outcome
        victim = dict(line.split() for line in pids.read_text().splitlines())["1"]
        os.kill(int(victim), signal.SIGKILL)
        thread.join(timeout=60)
        assert not thread.is_alive(), "the pipeline hung after a worker was killed"
    finally:
        job.shutdown()
    [error] = outcome
    assert isinstance(error, hwplace.WorkerError), repr(error)
    assert (error.group, error.rank, error.node_rank) == ("rollout", 1, 0)
    assert "generate() failed: the worker process has died" in str(error)
    assert job.groups == {}


def test_run_reports_a_failed_job_with_exit_code_1(hwplace_local_ray: LocalRay, tmp_path: Path) -> None:
    (tmp_path / "failing.py").write_text(textwrap.dedent("""
        import hwplace

        class Broken(hwplace.Worker):
            def work(self):
                if self.rank == 1:
                    raise ValueError(f"rank {self.rank} cannot work")

        def main(job):
            job.launch(Broken, "broken").work().wait()
        """))
    (tmp_path / "job.yaml").write_text("job: {entrypoint: failing.py:main}\n"
                                       "cluster: {num_nodes: 1, component_placement: {broken: {node_group: node, "
                                       "placement: '0:0-1'}}}\n")
    out, err = io.StringIO(), io.StringIO()
    assert main(["run", str(tmp_path / "job.yaml")], out, err) == 1
    assert "broken: 2 processes on group node" in out.getvalue()
    assert err.getvalue().startswith("hwplace: error: group 'broken' rank 1 on node 0: work() raised ValueError: "
                                     "rank 1 cannot work\n")
    assert "Remote traceback:" in err.getvalue()
    # the failed job's group was shut down: its name is free again
    assert main(["run", str(tmp_path / "job.yaml")], io.StringIO(), io.StringIO()) == 1
