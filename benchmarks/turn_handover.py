"""Turn hand-over: how long a worker waits, after another group's worker leaves its turn, before it enters.

Two workers of different groups share fake accelerator 0 of one node (``rollout,trainer: 0``) and neither
defines ``onload``/``offload``. Both take ``--turns`` turns at once, each holding its turn ``--hold`` seconds,
so the other is always waiting: first come, first served makes every turn a hand-over. Each worker stamps
``time.monotonic()`` (one clock for every process of the machine) just before leaving a turn and just after
entering one; a hand-over is the gap from one worker's leave to the other's enter. For scale, the table also
shows the round trip of an empty Ray actor call between the same processes. Target: median under 5 ms.

Run: python benchmarks/turn_handover.py [--turns 300] [--hold 0.002]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

import ray

import hwplace

CONFIG = {"cluster": {"num_nodes": 1, "component_placement": {"rollout,trainer": "0"}}}


class Taker(hwplace.Worker):
    def take(self, turns: int, hold: float) -> list[tuple[float, float]]:
        stamps = []
        for _ in range(turns):
            with self.turn():
                entered = time.monotonic()
                time.sleep(hold)
                stamps.append((entered, time.monotonic()))
        return stamps

    def ping(self) -> int:
        return self.rank


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--hold", type=float, default=0.002)
    args = parser.parse_args()
    with hwplace.testing.local_ray_cluster(1, 2):
        cluster = hwplace.Cluster(CONFIG["cluster"])
        plan = hwplace.ComponentPlacement(CONFIG, cluster)
        trainer = Taker.create_group().launch(cluster, plan.get_strategy("trainer"), name="trainer")
        rollout = Taker.create_group().launch(cluster, plan.get_strategy("rollout"), name="rollout")
        trainer.take(5, 0).wait()  # connect both to the arbiter
        rollout.take(5, 0).wait()
        runs = trainer.take(args.turns, args.hold), rollout.take(args.turns, args.hold)
        events = sorted([(entered, left, "trainer") for entered, left in runs[0].wait()[0]]
                        + [(entered, left, "rollout") for entered, left in runs[1].wait()[0]])
        overlaps = sum(1 for a, b in itertools.pairwise(events) if b[0] < a[1])
        handovers = [(b[0] - a[1]) * 1000 for a, b in itertools.pairwise(events) if a[2] != b[2]]
        pings = []
        for _ in range(200):
            start = time.perf_counter()
            trainer.ping().wait()
            pings.append((time.perf_counter() - start) * 1000)
        trainer.shutdown()
        rollout.shutdown()
    print(f"ray {ray.__version__}, hwplace {hwplace.__version__}; {os.cpu_count()} CPUs; {args.turns} turns per "
          f"worker, each held {args.hold * 1000:g} ms, no hooks")
    print(f"{'':34}{'median ms':>10}{'p90 ms':>10}{'count':>8}")
    print(f"{'turn hand-over (leave -> enter)':34}{statistics.median(handovers):10.3f}"
          f"{percentile(handovers, 0.9):10.3f}{len(handovers):8d}")
    print(f"{'Ray actor call round trip':34}{statistics.median(pings):10.3f}{percentile(pings, 0.9):10.3f}"
          f"{len(pings):8d}")
    met = "met" if statistics.median(handovers) < 5 else "NOT met"
    print(f"overlapping turns: {overlaps}; target: hand-over median under 5 ms: {met}")


if __name__ == "__main__":
    main()
