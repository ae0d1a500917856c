"""The GRPO example under fire (SPEC §12): processes and the driver SIGKILLed while it trains, against an
undisturbed run of the same job back to back on the same machine.

1. Worker kills: the default job (``examples/rl-grpo/grpo.yaml``, its ``restart:`` section) runs in this process
   on a 2-node local Ray cluster; every ``--every`` seconds (uniformly 0.5x to 1.5x) a random rank of a random
   component (env, rollout, robot, trainer) that is serving is SIGKILLed. Measured: kills, seconds from each kill
   to the rank serving again (``group.status()``: its new process constructed, ``on_restart`` done), and the
   job's ledger (its summary's ``resilience``): prompts lost, trained twice, and rollout processes whose first
   batch after a restart used weights older than the newest published before the restart had finished.
2. Driver kills: ``hwplace run ... --snapshots DIR`` is SIGKILLed at ``--driver-kills`` random instants while it
   trains, and ``--resume DIR`` continues it each time; the final run's history must hold every prompt once.
3. Both final held-out exact matches against an undisturbed run (goal: within 0.05).

Run: python benchmarks/chaos.py [--steps 300] [--every 5] [--kills 20] [--driver-kills 10]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import hwplace
from hwplace.application.job import load_entrypoint

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rl-grpo"
CLASSES = {"env": "Env", "rollout": "Rollout", "robot": "Robot", "trainer": "Trainer"}


def recording(cls: type, folder: Path) -> type:
    """``cls``, telling ``folder`` each process's id as it starts (``<group>-<rank>``, rewritten on a restart)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, *args, **kwargs)
        (folder / f"{self.group_name}-{self.rank}").write_text(str(os.getpid()))

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__})


def worker_kills(settings: dict[str, Any], every: float, kills: int, seed: int) -> dict[str, Any]:
    config = hwplace.load_config(EXAMPLE / "grpo.yaml")
    config["job"].update(settings)
    entry = load_entrypoint(config, EXAMPLE)
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as folder, hwplace.testing.local_ray_cluster(2, 4):
        pids = Path(folder)
        for cls in CLASSES.values():
            entry.__globals__[cls] = recording(entry.__globals__[cls], pids)
        cluster = hwplace.Cluster(config["cluster"])
        job = hwplace.Job(config, cluster, hwplace.ComponentPlacement(config, cluster))
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append(entry(job))
            except BaseException as exc:  # the benchmark reports it
                outcome.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        done: list[dict[str, Any]] = []
        try:
            while thread.is_alive() and len(list(pids.iterdir())) < 8:  # env, robot, trainer, rollout: 2 each
                time.sleep(0.5)
            time.sleep(every)  # training is under way
            watchers = []
            while thread.is_alive() and len(done) < kills:
                serving = [(name, status.rank) for name, group in list(job.groups.items()) if name in CLASSES
                           for status in group.status() if status.state == "serving"]
                if not serving:
                    time.sleep(0.2)
                    continue
                name, rank = rng.choice(serving)
                kill = {"component": name, "rank": rank, "attempt": job.groups[name].status()[rank].restarts + 1}
                os.kill(int((pids / f"{name}-{rank}").read_text()), signal.SIGKILL)
                kill["killed"] = time.monotonic()
                done.append(kill)
                print(f"chaos: kill {len(done)}: {name} rank {rank} (its restart {kill['attempt']})", file=sys.stderr,
                      flush=True)
                watchers.append(threading.Thread(target=until_serving, args=(job, kill, thread), daemon=True))
                watchers[-1].start()
                time.sleep(every * rng.uniform(0.5, 1.5))  # the next kill does not wait for this one's restart
            for watcher in watchers:
                watcher.join()
            thread.join()
        finally:
            job.shutdown()
    [summary] = outcome
    if isinstance(summary, BaseException):
        raise summary
    return {"kills": done, "summary": summary}


def until_serving(job: hwplace.Job, kill: dict[str, Any], training: threading.Thread) -> None:
    """Note in ``kill`` the seconds until its rank serves again: a new process, constructed (while the job
    trains)."""
    group = job.groups[kill["component"]]
    while training.is_alive():
        status = group.status()[kill["rank"]]
        if status.restarts >= kill["attempt"] and status.state == "serving":
            kill["serving"] = time.monotonic() - kill["killed"]
            return
        time.sleep(0.02)


def stale_after_restart(kills: list[dict[str, Any]], summary: dict[str, Any]) -> int:
    """Rollout processes whose first batch used weights older than the newest published before their restart
    was done (the restarted target must get the newest version before its first ``latest()`` returns)."""
    published = sorted(tuple(row) for row in summary["resilience"]["published"])
    times = [at for at, _ in published]
    firsts = {(rollout, attempt): (made, version) for rollout, attempt, made, version in
              summary["resilience"]["firsts"]}
    stale = 0
    for kill in kills:
        first = firsts.get((kill["rank"], kill["attempt"])) if kill["component"] == "rollout" else None
        if first is None or "serving" not in kill:
            continue
        index = bisect.bisect_right(times, kill["killed"] + kill["serving"])
        newest = published[index - 1][1] if index else 0
        stale += first[1] < newest
    return stale


def restarts_without_a_kill(kills: list[dict[str, Any]], restarts: list[list[Any]]) -> int:
    """Restarts in the job's ledger that no kill explains, per component and rank: a process restarted that was
    not dead (each should be 0; a restart the ledger missed near the end counts for nothing here)."""
    killed = collections.Counter((k["component"], k["rank"]) for k in kills)
    restarted = collections.Counter((component, rank) for component, rank, *_ in restarts)
    return sum(max(count - killed[key], 0) for key, count in restarted.items())


def driver_kills(settings: dict[str, Any], kills: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    overrides = [f"job.{key}={json.dumps(value)}" for key, value in settings.items()]
    with tempfile.TemporaryDirectory() as folder:
        snapshots = Path(folder) / "snapshots"
        summary = Path(folder) / "summary.json"
        command = [sys.executable, "-m", "hwplace", "run", str(EXAMPLE / "grpo.yaml"), "--nodes", "1x4",
                   "--summary", str(summary), *overrides]
        instants = []
        for attempt in range(kills + 1):
            flag = ["--resume" if attempt else "--snapshots", str(snapshots)]
            env = {**os.environ, "RAY_ADDRESS": "local"}
            with subprocess.Popen([*command, *flag], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env=env) as driver:
                if attempt == kills:
                    _, err = driver.communicate()
                    if driver.returncode:
                        raise RuntimeError(f"the last resumed run failed:\n{err[-3000:]}")
                    break
                started = time.monotonic()
                assert driver.stderr is not None
                for line in driver.stderr:  # kill it while it trains: after its first step, at a random instant
                    if line.startswith("training ["):
                        break
                delay = rng.uniform(0.0, 8.0)
                time.sleep(delay)
                driver.send_signal(signal.SIGKILL)
                driver.wait()
                instants.append(round(time.monotonic() - started, 1))
        result = json.loads(summary.read_text())
    return {"instants": instants, "summary": result}


def undisturbed(settings: dict[str, Any]) -> dict[str, Any]:
    config = hwplace.load_config(EXAMPLE / "grpo.yaml")
    config["job"].update(settings)
    with hwplace.testing.local_ray_cluster(2, 4):
        return hwplace.run_job(config, base=EXAMPLE, out=open(os.devnull, "w"))


def final(summary: dict[str, Any]) -> float:
    return float(summary["eval"][-1][1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between worker kills, on average")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--driver-kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parts", default="workers,driver,undisturbed")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    settings = {"steps": args.steps}
    parts = set(args.parts.split(","))
    figures: dict[str, Any] = {}
    if "workers" in parts:
        run = worker_kills(settings, args.every, args.kills, args.seed)
        kills, summary = run["kills"], run["summary"]
        ledger = summary["resilience"]
        seconds = [k["serving"] for k in kills if "serving" in k]
        figures["workers"] = {
            "kills": len(kills), "by_component": {c: sum(k["component"] == c for k in kills) for c in CLASSES},
            "restarted_before_the_end": len(seconds),
            "restarts_without_a_kill": restarts_without_a_kill(kills, ledger["restarts"]),
            "kill_to_serving_median": statistics.median(seconds) if seconds else None,
            "kill_to_serving_max": max(seconds, default=None),
            "lost": ledger["lost"], "trained_twice": ledger["trained_twice"],
            "stale_after_restart": stale_after_restart(kills, summary), "trained": ledger["trained"],
            "redelivered": ledger["redelivered"], "final_exact_match": final(summary),
            "training_seconds": summary["training_seconds"]}
        print("worker kills:", json.dumps(figures["workers"]), flush=True)
    if "driver" in parts:
        run = driver_kills(settings, args.driver_kills, args.seed)
        ledger = run["summary"]["resilience"]
        figures["driver"] = {"kills": len(run["instants"]), "killed_after_seconds": run["instants"],
                             "resumes": ledger["resumes"], "trained": ledger["trained"],
                             "trained_twice": ledger["trained_twice"], "lost": ledger["lost"],
                             "final_exact_match": final(run["summary"])}
        print("driver kills:", json.dumps(figures["driver"]), flush=True)
    if "undisturbed" in parts:
        summary = undisturbed(settings)
        figures["undisturbed"] = {"final_exact_match": final(summary), "training_seconds": summary["training_seconds"]}
        print("undisturbed:", json.dumps(figures["undisturbed"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
