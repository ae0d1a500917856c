"""The placement search on the GRPO example (SPEC §13, issue "The resource model" point 5): profile the job colocated
and apart, search, run the chosen plan, and print predicted against measured (goal: within 15%).

Every run is ``hwplace run CONFIG --nodes 1x4 job.steps=N`` in a fresh process (its own throwaway Ray cluster),
one step off-policy (``job.max_staleness=1``, as ``examples/rl-grpo/async.yaml``: the cost model's apart cells
pipeline) and with a fixed global batch: each trainer rank takes ``--tokens`` over the trainer ranks
(``job.tokens_per_rank``), so that a step is the same work whatever the placement.

1. colocated: trainer and rollout on accelerators 0-3 (4 processes each, taking turns), ``--profile``;
2. apart: rollout on 0-1 and trainer on 2-3 (2 processes each, ``examples/rl-grpo/grpo.yaml``), ``--profile``;
3. ``hwplace plan --search`` on 4 accelerators from both profiles (printed), the apart one without the components
   both runs placed alike (env and robot: a point measured twice is refused);
4. the chosen ``component_placement:`` pasted into the config and run.

Every run has ``--trace`` too (``--keep`` keeps them: ``hwplace report`` says where a run's time went).

A run's measured step is its training time (the driver's clock, from the first step's call to the last step's
result) over its steps; the predicted step of each run's plan is ``hwplace plan --profile`` of that plan from both
profiles, and from the run's own profile (the cost model alone, without the change of load from one run to the
next: on a shared machine the same plan can measure twice as slow an hour later). Each run's trainer step is
also split, from its trace, into what it spent: work, collectives, waits on other components, hand-overs, sync,
and the driver's time between two steps. ``--png FILE`` draws one step of the chosen run
(``benchmarks/timeline_png.py``, needs Pillow).

Run: python benchmarks/grpo_search.py [--steps 40] [--tokens 1400] [--png docs/grpo-step.png] [--keep FOLDER]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from hwplace.application.trace_report import length, on_another, recorded_by_hwplace, subtract, union

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "rl-grpo"
NODES = "1x4"
GOAL = 0.15


def hwplace(*argv: str, check: bool = True) -> str:
    done = subprocess.run([sys.executable, "-m", "hwplace", *argv], capture_output=True, text=True, timeout=900)
    if check and done.returncode != 0:
        raise SystemExit(f"hwplace {' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def config(folder: Path, name: str, placement: dict[str, Any]) -> Path:
    """The example's config with the cluster's components placed by ``placement`` (the others kept)."""
    raw = yaml.safe_load((EXAMPLE / "grpo.yaml").read_text())
    kept = {k: v for k, v in raw["cluster"]["component_placement"].items() if isinstance(v, dict)}
    raw["cluster"]["component_placement"] = {**placement, **kept}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def trainer_ranks(placement: dict[str, Any]) -> int:
    """How many trainer processes a plain placement string of consecutive accelerators gives."""
    for key, value in placement.items():
        if "trainer" in key.split(","):
            first, _, last = str(value).partition("-")
            return int(last or first) - int(first) + 1
    raise SystemExit(f"no trainer in {placement}")


def run(path: Path, placement: dict[str, Any], args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One run: its summary, its profile and trace, and the measured step."""
    name = path.stem
    tokens = args.tokens // trainer_ranks(placement)
    argv = [str(path), "--nodes", NODES, f"job.steps={args.steps}", f"job.eval_every={args.steps}",
            "job.max_staleness=1", f"job.tokens_per_rank={tokens}", "--summary", str(folder / f"{name}.summary.json"),
            "--profile", str(folder / f"{name}.profile.json"), "--trace", str(folder / f"{name}.trace.json")]
    started = time.perf_counter()
    hwplace("run", *argv)
    summary = json.loads((folder / f"{name}.summary.json").read_text())
    print(f"  ran {name}: {summary['steps']} steps, {tokens} tokens per trainer rank, "
          f"{time.perf_counter() - started:.0f} s in all", flush=True)
    return {"summary": summary, "profile": folder / f"{name}.profile.json",
            "step": summary["training_seconds"] / summary["steps"]}


PARTS = ("work", "collectives", "waits on others", "offload+onload", "weight sync", "between steps")


def decompose(trace: dict[str, Any]) -> dict[str, float]:
    """A trainer step as the trace has it, in seconds per step (the median rank; its steps after the first): the
    work (with the channel operations that wait for no other component: ``ack``), the collectives' waits (job
    spans), the waits on other components (batch, turn), offload and onload, weight sync, and the driver's time
    between two steps. They add up to the step's period on that rank."""
    tracks = trace["otherData"]["hwplace"]["tracks"]
    ranks: dict[int, list[dict[str, Any]]] = {}
    for e in trace["traceEvents"]:
        track = tracks.get(f"{e.get('pid')}:{e.get('tid')}")
        if e.get("ph") == "X" and track and track["group"] == "trainer" and track.get("main", True):
            ranks.setdefault(track["rank"], []).append(e)
    parts: dict[str, list[float]] = {}
    for spans in ranks.values():
        steps = sorted((e for e in spans if e["cat"] == "call" and e["name"] == "step"), key=lambda e: e["ts"])[1:]
        total: dict[str, float] = dict.fromkeys(PARTS, 0.0)
        for call in steps:
            low, high = call["ts"], call["ts"] + call["dur"]
            inside = [e for e in spans if low <= e["ts"] and e["ts"] + e["dur"] <= high and e is not call]
            kinds = {"collectives": [e for e in inside if e["cat"] == "wait" and not recorded_by_hwplace(e)],
                     "waits on others": [e for e in inside if e["cat"] == "wait" and on_another(e)],
                     "offload+onload": [e for e in inside if e["cat"] == "memory"],
                     "weight sync": [e for e in inside if e["cat"] == "sync"]}
            away: list[tuple[float, float]] = []
            for kind, found in kinds.items():
                covered = subtract(union((e["ts"], e["ts"] + e["dur"]) for e in found), union(away))
                total[kind] += length(covered)
                away += covered
            total["work"] += length(subtract([(low, high)], union(away)))
            total["between steps"] += sum(e["dur"] for e in spans if e["cat"] == "idle" and abs(e["ts"] - high) <= 1)
        for kind, value in total.items():
            parts.setdefault(kind, []).append(value / max(1, len(steps)) / 1e6)
    return {kind: statistics.median(values) for kind, values in parts.items()}


def predicted(path: Path, profiles: list[Path]) -> float:
    """``hwplace plan --profile``: the predicted step of the plan as ``path`` writes it."""
    argv = ["plan", str(path), "--nodes", NODES, "--json"]
    for profile in profiles:
        argv += ["--profile", str(profile)]
    return float(json.loads(hwplace(*argv))["prediction"]["step_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=1400, help="experience tokens per step, all trainer ranks")
    parser.add_argument("--png", type=Path, help="draw one step of the chosen run here")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep its configs, profiles and traces")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="hwplace-grpo-search-"))
    for name in ("grpo.py", "trainer.py", "resilience.py", "policy.py", "report.py"):
        shutil.copy(EXAMPLE / name, folder / name)
    try:
        print(f"GRPO example on --nodes {NODES}, {args.steps} steps, one step off-policy, {args.tokens} experience "
              "tokens per step", flush=True)
        plans = {"colocated": {"trainer,rollout": "0-3"}, "apart": {"rollout": "0-1", "trainer": "2-3"}}
        runs = {name: run(config(folder, name, placement), placement, args, folder)
                for name, placement in plans.items()}
        # the components the two runs placed alike (env and robot on their node groups) are measured once
        apart = json.loads(runs["apart"]["profile"].read_text())
        moved = {"trainer", "rollout"}
        apart["components"] = {k: v for k, v in apart["components"].items() if k in moved}
        (folder / "apart.moved.profile.json").write_text(json.dumps(apart))
        profiles = [runs["colocated"]["profile"], folder / "apart.moved.profile.json"]
        search = ["plan", str(folder / "apart.yaml"), "--nodes", NODES, "--search"]
        for profile in profiles:
            search += ["--profile", str(profile)]
        shown = hwplace(*search).replace(str(folder) + "/", "")
        print(f"\n$ hwplace plan grpo.yaml --nodes {NODES} --search --profile colocated.profile.json "
              "--profile apart.moved.profile.json")
        print(shown[shown.index("placement search:"):].rstrip())
        chosen_yaml = json.loads(hwplace(*search, "--json"))["search"]["component_placement"]
        chosen = {k: v for k, v in yaml.safe_load(chosen_yaml)["component_placement"].items()
                  if not isinstance(v, dict)}
        path = config(folder, "chosen", chosen)
        runs["chosen"] = run(path, chosen, args, folder)
        plans["chosen"] = chosen
        print("\npredicted (hwplace plan --profile, from both profiles; and from the run's own profile) against "
              "measured (training time / steps)")
        print(f"  {'run':<10} {'placement':<34} {'predicted':>10} {'measured':>10} {'measured/predicted':>19} "
              f"{'own profile':>12} {'measured/own':>13}")
        worst = 0.0
        for name, placement in plans.items():
            guess = predicted(folder / f"{name}.yaml", profiles)
            own = predicted(folder / f"{name}.yaml", [runs[name]["profile"]])
            measured = runs[name]["step"]
            worst = max(worst, abs(measured / guess - 1))
            written = ", ".join(f"{k}: {v}" for k, v in placement.items())
            print(f"  {name:<10} {written:<34} {1e3 * guess:8.0f} ms {1e3 * measured:7.0f} ms "
                  f"{measured / guess:18.2f}x {1e3 * own:9.0f} ms {measured / own:12.2f}x")
        print("\nwhere a trainer step went (the traces; ms a step, median rank, steps after the first)")
        print(f"  {'run':<10} " + " ".join(f"{kind:>15}" for kind in PARTS))
        for name in plans:
            found = decompose(json.loads((folder / f"{name}.trace.json").read_text()))
            print(f"  {name:<10} " + " ".join(f"{1e3 * value:15.1f}" for value in found.values())
                  + f"  = {1e3 * sum(found.values()):.0f}")
        fastest = min(("colocated", "apart"), key=lambda name: runs[name]["step"])
        print(f"\nchosen: {', '.join(f'{k}: {v}' for k, v in chosen.items())}; the faster profiled run was {fastest}; "
              f"largest gap between predicted and measured {100 * worst:.1f}% (goal {100 * GOAL:.0f}%)")
        if args.png:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from timeline_png import render  # beside this file; needs Pillow

            trace = json.loads((folder / "chosen.trace.json").read_text())
            method, seconds = render(trace, args.png, title="one trainer step of the GRPO example, placed as chosen")
            print(f"{args.png}: one {method} of the chosen run ({1e3 * seconds:.0f} ms), {args.png.stat().st_size} "
                  "bytes")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
