"""Cluster start-up: ``hwplace.Cluster(cfg)`` on an embedded local Ray against a bare ``ray.init()``.

Each run is a fresh Python process, timed from its first line until it is ready (imports included):
``bare ray`` runs ``import ray; ray.init()``; ``hwplace`` runs ``import hwplace; hwplace.Cluster(cfg)``,
which starts the same Ray, discovers the node and runs every backend's detection on it. Runs alternate.
Ray's own start varies by about a second from run to run on a small machine, so the last line also times
``hwplace.Cluster(cfg)`` alone inside the process, right after ``ray.init()``: that is what hwplace adds.
Target: at most 0.5 s.

Run: python benchmarks/cluster_start.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

BARE = """
import time; start = time.perf_counter()
import ray
ray.init(num_cpus=2, include_dashboard=False)
print("READY", time.perf_counter() - start)
ray.shutdown()
"""

HWPLACE = """
import time; start = time.perf_counter()
import ray
import hwplace
ray.init(num_cpus=2, include_dashboard=False)  # the same Ray start as above: what hwplace adds is discovery
begin = time.perf_counter()
cluster = hwplace.Cluster({"num_nodes": 1})
print("READY", time.perf_counter() - start)
print("CLUSTER", time.perf_counter() - begin)
ray.shutdown()
"""

EMBEDDED = """
import time; start = time.perf_counter()
import hwplace
cluster = hwplace.Cluster({"num_nodes": 1, "address": "local"})
print("READY", time.perf_counter() - start)
"""


def timings(code: str) -> dict[str, float]:
    """The ``NAME seconds`` lines a fresh process printed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if line.split()[:1] in (
        ["READY"], ["CLUSTER"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per side (the median is shown)")
    args = parser.parse_args()
    sides = {"bare ray.init()": BARE, "hwplace.Cluster (after ray.init)": HWPLACE,
             "hwplace.Cluster (address: local)": EMBEDDED}
    times: dict[str, list[float]] = {name: [] for name in sides}
    discovery: list[float] = []  # hwplace.Cluster(...) alone, on a Ray already started: what hwplace adds
    for run in range(args.repeat):
        for name in (list(sides) if run % 2 == 0 else list(reversed(sides))):
            seen = timings(sides[name])
            times[name].append(seen["READY"])
            if "CLUSTER" in seen:
                discovery.append(seen["CLUSTER"])
    base = statistics.median(times["bare ray.init()"])
    print(f"median of {args.repeat} fresh processes, seconds from the first line until ready")
    print(f"{'start':<36}{'median':>8}{'min':>8}{'max':>8}{'added':>8}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<36}{median:>8.2f}{min(values):>8.2f}{max(values):>8.2f}{median - base:>+8.2f}")
    print(f"hwplace.Cluster(cfg) itself, after ray.init(): median {statistics.median(discovery):.3f} s "
          f"(min {min(discovery):.3f}, max {max(discovery):.3f}); target at most 0.5 s")


if __name__ == "__main__":
    main()
