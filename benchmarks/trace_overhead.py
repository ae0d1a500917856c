"""Tracing on the GRPO example: what it costs, how much of each worker's time its spans cover, and whether an
injected stall comes out as the top wait (SPEC §13; goals: coverage >= 99%, cost <= 2% of the step time).

Every run is ``hwplace run examples/rl-grpo/grpo.yaml --nodes 1x4 job.steps=N`` in a fresh process (its own
throwaway Ray cluster), with ``--summary``; the traced runs add ``--trace``. Plain and traced runs take turns,
``--repeat`` of each; the step time is the run's training time (the driver's clock, from the first step's call to
the last step's result) over its steps, and the cost is the traced median over the plain median, less one.
On a shared 2-core machine runs differ by several percent from one another, which hides a cost of 2%; so the
script also measures the recorder itself: the time of one span while tracing is off and on (a tight loop in
this process), times the spans a step records (counted in the trace), over the step time.

Coverage, per worker, is the share of the training window (from the first ``trainer.step`` span's start to the
last one's end) that the worker's spans cover; also shown for group calls alone (without the ``between calls``
spans): the trainer's gaps are the time between one step's result and the next step's call, the driver's loop.

The stall run subclasses the example's trainer: in one step, rank 1 sleeps ``--stall`` seconds in its work, after
taking its batch (a stall at the start of a step hides in the wait for experience) and before its first
``all_reduce``. The example marks its collectives as waits (``with hwplace.span("all_reduce")``), so rank 0's
wait for rank 1, charged to rank 1 (the rank it waited for), should be the top wait of ``hwplace report``: the
wait of the steps longest beyond the usual wait of its kind.

Run: python benchmarks/trace_overhead.py [--steps 60] [--repeat 2] [--stall 0.2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from hwplace.application.trace_report import TraceSummary, length, overlap, union
from hwplace.foundation import trace
from hwplace.foundation.settings import TRACE_DIR

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "rl-grpo"

STALLED = '''\
"""The GRPO example, with a trainer whose rank 1 stalls once, in its work between its batch and its all_reduce."""
import time

import grpo

STALL_STEP, STALL_SECONDS = {step}, {seconds}


class StalledTrainer(grpo.Trainer):
    def __init__(self, settings):
        super().__init__(settings)
        zero_grad = self.optimizer.zero_grad

        def late_zero_grad(*args, **kwargs):  # the first thing the step does once it holds its batch
            if self.stall_now:
                self.stall_now = False
                time.sleep(STALL_SECONDS)
            return zero_grad(*args, **kwargs)

        self.stall_now = False
        self.optimizer.zero_grad = late_zero_grad

    def step(self, channel, demos):
        self.stall_now = self.rank == 1 and len(self.history) + 1 == STALL_STEP
        return super().step(channel, demos)


grpo.Trainer = StalledTrainer
main = grpo.main
'''


def run(config: Path, steps: int, folder: Path, name: str, traced: bool) -> dict[str, Any]:
    """One run in a fresh process; its summary, with the trace when ``traced``."""
    summary, trace_file = folder / f"{name}.summary.json", folder / f"{name}.trace.json"
    command = [sys.executable, "-m", "hwplace", "run", str(config), "--nodes", "1x4", f"job.steps={steps}",
               f"job.eval_every={steps}", "--summary", str(summary)]
    if traced:
        command += ["--trace", str(trace_file)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    result: dict[str, Any] = json.loads(summary.read_text())
    if traced:
        result["trace"] = json.loads(trace_file.read_text())
    return result


def span_cost(on: bool, count: int = 200_000) -> float:
    """Seconds per ``with span(...)`` in a tight loop, tracing on or off."""
    folder = tempfile.mkdtemp(prefix="hwplace-span-cost-")
    try:
        if on:
            trace.start(folder, {"group": "bench", "rank": 0, "node": 0})
        start = time.perf_counter()
        for _ in range(count):
            with trace.span("get", trace.WAIT, channel="c", queue="default"):
                pass
        if on:
            trace.flush()  # writing is part of the cost
        return (time.perf_counter() - start) / count
    finally:
        trace.stop()
        shutil.rmtree(folder, ignore_errors=True)


def training_window(data: dict[str, Any]) -> tuple[float, float]:
    tracks = data["otherData"]["hwplace"]["tracks"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in data["traceEvents"] if e.get("ph") == "X"
             and e["name"] == "step" and tracks.get(f"{e['pid']}:{e['tid']}", {}).get("group") == "trainer"]
    return min(s for s, _ in steps), max(e for _, e in steps)


def coverage(data: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per worker: the share of the training window its spans cover, and its group calls alone."""
    tracks = data["otherData"]["hwplace"]["tracks"]
    window = [training_window(data)]
    spans: dict[str, list[tuple[float, float]]] = {}
    calls: dict[str, list[tuple[float, float]]] = {}
    for e in data["traceEvents"]:
        track = tracks.get(f"{e.get('pid')}:{e.get('tid')}")
        if e.get("ph") != "X" or track is None or e["name"] == "__init__":
            continue
        worker = f"{track['group']} rank {track['rank']}"
        spans.setdefault(worker, []).append((e["ts"], e["ts"] + e["dur"]))
        if e["cat"] != trace.IDLE:
            calls.setdefault(worker, []).append((e["ts"], e["ts"] + e["dur"]))
    whole = length(window)
    return {worker: (overlap(union(found), window) / whole, overlap(union(calls.get(worker, [])), window) / whole)
            for worker, found in sorted(spans.items())}


def window_waits(data: dict[str, Any]) -> list[tuple[float, str, str, Any]]:
    """The waits inside the training window, longest first: (µs, worker, name, args)."""
    tracks = data["otherData"]["hwplace"]["tracks"]
    start, end = training_window(data)
    waits = []
    for e in data["traceEvents"]:
        track = tracks.get(f"{e.get('pid')}:{e.get('tid')}")
        if e.get("ph") == "X" and e["cat"] == trace.WAIT and track and start <= e["ts"] and e["ts"] + e["dur"] <= end:
            waits.append((e["dur"], f"{track['group']} rank {track['rank']}", e["name"], e.get("args", "")))
    return sorted(waits, key=lambda wait: -wait[0])


def spans_per_step(data: dict[str, Any], steps: int) -> float:
    start, end = training_window(data)
    inside = sum(1 for e in data["traceEvents"] if e.get("ph") == "X" and start <= e["ts"] <= end)
    return inside / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--stall", type=float, default=0.2, help="seconds trainer rank 1 stalls in the stall run")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--stall-config", default="grpo.yaml", help="the example's config of the stall run")
    parser.add_argument("--skip-overhead", action="store_true", help="only the stall run")
    parser.add_argument("--keep", metavar="FOLDER", help="copy the traces there")
    args = parser.parse_args()
    os.environ.pop(TRACE_DIR, None)  # the plain runs record nothing
    folder = Path(tempfile.mkdtemp(prefix="hwplace-trace-bench-"))
    try:
        config = EXAMPLE / "grpo.yaml"
        plain: list[float] = []
        traced: list[float] = []
        last: dict[str, Any] = {}
        for i in range(0 if args.skip_overhead else args.repeat):
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                result = run(config, args.steps, folder, f"run{i}-{'traced' if on else 'plain'}", on)
                (traced if on else plain).append(result["training_seconds"] / result["steps"])
                if on:
                    last = result["trace"]
        if args.skip_overhead:
            stall_run(args, folder)
            return
        off_cost, on_cost = span_cost(False), span_cost(True)
        per_step = spans_per_step(last, args.steps)
        step = statistics.median(plain)
        print(f"GRPO example (grpo.yaml, --nodes 1x4), {args.steps} steps, {args.repeat} runs each")
        print(f"  step time, plain:  median {1e3 * step:7.1f} ms  ({', '.join(f'{1e3 * s:.1f}' for s in plain)})")
        print(f"  step time, traced: median {1e3 * statistics.median(traced):7.1f} ms  "
              f"({', '.join(f'{1e3 * s:.1f}' for s in traced)})")
        print(f"  end to end, traced over plain: {100 * (statistics.median(traced) / step - 1):+.1f}% "
              "(run-to-run spread included)")
        print(f"  one span: {1e9 * off_cost:.0f} ns off, {1e9 * on_cost:.0f} ns on (recorded and written); "
              f"{per_step:.0f} spans per step in all workers -> {1e3 * per_step * on_cost:.3f} ms of recording "
              f"per step, {100 * per_step * on_cost / step:.2f}% of a step (all workers' recording summed)")
        print("  coverage of the training window (all spans; without the time between calls):")
        for worker, (spans, calls) in coverage(last).items():
            print(f"    {worker:<16} {100 * spans:7.2f}%  {100 * calls:7.2f}%")

        stall_run(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def stall_run(args: argparse.Namespace, folder: Path) -> None:
    """The GRPO example with a trainer rank that stalls once: where the stall shows among the waits."""
    stalled = folder / "stalled"
    stalled.mkdir()
    for name in ("grpo.py", "trainer.py", "resilience.py", "policy.py", "report.py"):
        shutil.copy(EXAMPLE / name, stalled / name)
    stall_step = max(2, args.steps // 2)
    (stalled / "stalled.py").write_text(STALLED.format(step=stall_step, seconds=args.stall))
    raw = yaml.safe_load((EXAMPLE / args.stall_config).read_text())
    raw["job"]["entrypoint"] = "stalled.py:main"
    (stalled / "grpo.yaml").write_text(yaml.safe_dump(raw))
    result = run(stalled / "grpo.yaml", args.steps, folder, "stalled", True)
    summary = TraceSummary(result["trace"])
    waits = window_waits(result["trace"])
    stalled_wait = max((w for w in waits if w[1:3] == ("trainer rank 0", "all_reduce")), default=None)
    print(f"stall run ({args.stall_config}): trainer rank 1 sleeps {1e3 * args.stall:.0f} ms before its first "
          f"all_reduce of step {stall_step}; top {args.top} waits of the training window:")
    for duration, worker, name, wait_args in waits[:args.top]:
        print(f"    {duration / 1e3:8.1f} ms  {worker:<16} {name:<14} {wait_args}")
    if stalled_wait is not None:
        print(f"  trainer rank 0's longest all_reduce wait: {stalled_wait[0] / 1e3:.1f} ms, number "
              f"{waits.index(stalled_wait) + 1} of {len(waits)} waits in the window")
    print("  and of the whole trace (hwplace report):")
    for duration, _, key, name, wait_args in summary.waits[:args.top]:
        print(f"    {duration / 1e3:8.1f} ms  {summary.worker(key):<16} {name:<14} {wait_args or ''}")
    holds = summary.holds()
    print("  hwplace report's top waits (beyond the usual of their kind, a collective's charged to its last rank):")
    for hold in holds[:args.top]:
        who = f"{summary.worker(hold.culprit)} held up " if hold.culprit else ""
        print(f"    {hold.excess / 1e3:8.1f} ms  {who}{', '.join(sorted({summary.worker(k) for k in hold.waiters}))} "
              f"in {hold.name} (waited {hold.longest / 1e3:.1f} ms, usually {hold.usual / 1e3:.1f} ms)")
    top = holds[0] if holds else None
    found = top is not None and top.culprit is not None and summary.worker(top.culprit) == "trainer rank 1" \
        and top.name == "all_reduce" and top.longest >= 0.9 * args.stall * 1e6
    # (the wait, not its excess: the excess nets out what rank 1's own waits for experience explain of its lateness)
    print(f"  the stall is the top wait of hwplace report (trainer rank 1 holding up the others in all_reduce, a "
          f"wait of at least {0.9 * args.stall * 1e3:.0f} ms): {'yes' if found else 'no'}")
    if args.keep:
        for path in folder.glob("*.trace.json"):
            shutil.copy(path, Path(args.keep) / path.name)


if __name__ == "__main__":
    main()
