"""The GRPO example (examples/rl-grpo) end to end on the session's two-node Ray cluster: it learns an easy task,
its colocated, async and two-node variants run, and a worker killed mid-run ends the job with its WorkerError.
``hwplace run`` of the default configuration on a fresh clone is tests/test_fresh_clone.py's."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import hwplace
from hwplace.application.job import load_entrypoint
from hwplace_plugins.ray.pytest_plugin import LocalRay

GRPO = Path(__file__).resolve().parents[3] / "examples" / "rl-grpo"
SHORT = {"steps": 6, "eval_every": 3, "eval_prompts": 20}

pytestmark = pytest.mark.time_limit(300)  # a broken job fails its test rather than hangs the suite


def run_variant(name: str, **settings: Any) -> tuple[dict[str, Any], str]:
    config = hwplace.load_config(GRPO / name)
    config["job"].update(settings)
    out = io.StringIO()
    summary = hwplace.run_job(config, base=GRPO, out=out)
    return summary, out.getvalue()


def check_summary(summary: dict[str, Any], steps: int) -> None:
    assert summary["steps"] == steps
    assert len(summary["rank_tokens"]) == 2
    assert all(tokens > 0 for tokens in summary["rank_tokens"])
    assert summary["imbalance"] < 1.5
    assert summary["weight_sync"]["versions"] == steps + 1  # the initial weights, then one per step
    assert all(a["versions"] >= 1 for a in summary["weight_sync"]["applied"].values())
    assert summary["robots"] == ["arm-left", "arm-right"]
    assert summary["demos"] > 0
    assert summary["groups"] > 0
    ledger = summary["resilience"]
    assert (ledger["lost"], ledger["trained_twice"]) == (0, 0), ledger
    assert ledger["trained"] > 0
    assert {"trainer: wait for batch", "trainer: forward and backward", "trainer: all_reduce",
            "trainer: publish weights", "rollout: generate", "rollout: apply weights", "env: score answers",
            "robot: record demos"} <= set(summary["stages"])


def test_grpo_learns_an_easy_task(hwplace_local_ray: LocalRay, capsys: pytest.CaptureFixture[str]) -> None:
    """Reversing three digits: from about 0 to at least 0.9 held-out exact match, and the curve rises."""
    summary, plan = run_variant("grpo.yaml", steps=60, tasks=["reverse"], min_digits=3, max_digits=3,
                                eval_every=10, eval_prompts=100)
    check_summary(summary, steps=60)
    curve = [em for _, em in summary["eval"]]
    assert curve[0] < 0.5, curve
    assert curve[-1] >= 0.9, curve
    assert max(curve[:2]) < curve[-1], curve  # it rose
    assert summary["staleness"]["max"] == 0  # on-policy
    assert "weight sync policy: trainer rank 0 (node 0) -> rollout\n" in plan
    printed = capsys.readouterr()
    assert "summary: 60 GRPO steps in " in printed.out
    assert "learning curve (held-out exact match): 10: " in printed.out
    assert f"training [{'#' * 30}] 60/60 reward " in printed.err  # the progress bar, finished


def test_the_colocated_variant_takes_turns_and_never_overlaps(hwplace_local_ray: LocalRay) -> None:
    summary, plan = run_variant("colocated.yaml", **SHORT)
    check_summary(summary, steps=SHORT["steps"])
    assert "rollout: 2 processes on group cluster, placement '0-1'" in plan
    assert "trainer: 2 processes on group cluster, placement '0-1'" in plan
    turns = summary["turns"]
    assert turns["shared"] == [[0, 0], [1, 1]]
    assert turns["overlaps"] == 0
    assert turns["handovers"] > 0


def test_the_async_variant_runs_one_step_off_policy(hwplace_local_ray: LocalRay) -> None:
    summary, _ = run_variant("async.yaml", **SHORT)
    check_summary(summary, steps=SHORT["steps"])
    assert summary["staleness"]["max"] <= 1


def test_the_multinode_variant_syncs_across_nodes(hwplace_local_ray: LocalRay) -> None:
    summary, plan = run_variant("multinode.yaml", **SHORT)
    check_summary(summary, steps=SHORT["steps"])
    trainer_table = plan.split("trainer: 2 processes")[1].split("\n\n")[0]
    assert [line.split()[1] for line in trainer_table.splitlines()[2:]] == ["0", "1"]
    transports = {row[1]: row[3] for row in summary["weight_sync"]["plan"]}
    assert len(set(transports.values())) == 2, transports  # one rollout rank beside the source, one elsewhere


def test_a_worker_killed_mid_run_is_a_worker_error_not_a_hang(hwplace_local_ray: LocalRay, tmp_path: Path) -> None:
    """Without the config's restart: section, a dead process ends the job."""
    config = hwplace.load_config(GRPO / "grpo.yaml")
    del config["restart"]
    config["job"].update(steps=10_000, eval_every=10_000)
    entry = load_entrypoint(config, GRPO)
    pids = tmp_path / "pids"
    rollout = entry.__globals__["Rollout"]

    def record_pid(worker: hwplace.Worker, settings: dict[str, Any]) -> None:
        rollout.__init__(worker, settings)
        with open(pids, "a") as file:
            file.write(f"{worker.rank} {os.getpid()}\n")

    # the job's own rollout worker, telling the test its process id
    entry.__globals__["Rollout"] = type("Recorded", (rollout,), {"__init__": record_pid})
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
        while not pids.exists() or len(pids.read_text().splitlines()) < 2:
            assert time.monotonic() < deadline, outcome
            time.sleep(0.2)
        time.sleep(3)  # training is under way
        assert thread.is_alive(), outcome
        victim = dict(line.split() for line in pids.read_text().splitlines())["1"]
        os.kill(int(victim), signal.SIGKILL)
        thread.join(timeout=60)
        assert not thread.is_alive(), "the job hung after a worker was killed"
    finally:
        job.shutdown()
    [error] = outcome
    assert isinstance(error, hwplace.WorkerError), repr(error)
    assert (error.group, error.rank, error.node_rank) == ("rollout", 1, 0)
    assert "the worker process has died" in str(error)
    assert job.groups == {}


KILLS = [("trainer", 1), ("rollout", 1), ("trainer", 0), ("env", 0), ("robot", 1), ("trainer", 0, 1)]


def test_the_job_survives_a_kill_of_every_component(hwplace_local_ray: LocalRay, tmp_path: Path) -> None:
    """With the config's restart: section: a trainer rank (each of the two, one of them the weight sync's
    source), a rollout, an env and a robot process SIGKILLed while the job trains, one every 8 steps, and then
    both trainer ranks at once (re-seeded from the state the driver kept of the last step). The job finishes
    every step; no prompt is lost or trained on twice; the weights' versions go on."""
    config = hwplace.load_config(GRPO / "grpo.yaml")
    steps = 8 * len(KILLS) + 8
    config["job"].update(steps=steps, eval_every=steps, eval_prompts=20)
    entry = load_entrypoint(config, GRPO)
    pids = tmp_path / "pids"
    pids.mkdir()
    progress = tmp_path / "step"
    classes = {"trainer": "Trainer", "rollout": "Rollout", "env": "Env", "robot": "Robot"}

    def recording(cls: Any) -> type:
        def init(worker: Any, settings: dict[str, Any]) -> None:
            cls.__init__(worker, settings)
            (pids / f"{worker.group_name}-{worker.rank}").write_text(str(os.getpid()))

        def step(worker: Any, *args: Any) -> Any:
            result = cls.step(worker, *args)
            progress.write_text(str(result["step"]))
            return result

        return type(cls.__name__, (cls,), {"__init__": init, **({"step": step} if hasattr(cls, "step") else {})})

    for name in classes.values():
        entry.__globals__[name] = recording(entry.__globals__[name])
    cluster = hwplace.Cluster(config["cluster"])
    job = hwplace.Job(config, cluster, hwplace.ComponentPlacement(config, cluster))
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(entry(job))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        for index, (group, *ranks) in enumerate(KILLS):
            while not progress.exists() or int(progress.read_text() or 0) < 8 * index + 4:
                assert thread.is_alive(), outcome
                time.sleep(0.1)
            for rank in ranks:
                os.kill(int((pids / f"{group}-{rank}").read_text()), signal.SIGKILL)
        thread.join()  # the module's time limit reaches a hang
    finally:
        job.shutdown()
    [summary] = outcome
    assert isinstance(summary, dict), repr(summary)
    assert summary["steps"] >= steps - len(KILLS)  # a step that a death cut short is done again, not recorded
    assert summary["eval"][-1][0] == steps
    ledger = summary["resilience"]
    assert (ledger["lost"], ledger["trained_twice"]) == (0, 0), ledger
    restarted = sorted((component, rank) for component, rank, *_ in ledger["restarts"])
    assert restarted == sorted((group, rank) for group, *ranks in KILLS for rank in ranks), "\n".join(
        f"{name} rank {rank} after {seconds:.1f} s: {cause}" for name, rank, seconds, cause in ledger["restarts"])
    versions = [version for _, version in ledger["published"]]
    assert versions == sorted(versions), versions
    assert len(set(versions)) == len(versions), versions  # never reused
