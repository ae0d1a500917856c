"""Cluster start-up: ``hwplace.Cluster(cfg)`` on an embedded local Ray against a bare ``ray.init()``.

Each run is a fresh Python process, timed from its first line until it is ready (imports included):
``bare ray`` runs ``import ray; ray.init()``; ``hwplace`` runs ``import hwplace; hwplace.Cluster(cfg)``,
which starts the same Ray, discovers the node and runs every backend's detection on it. Runs alternate.
Target: hwplace adds at most 0.5 s.

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
cluster = hwplace.Cluster({"num_nodes": 1})
print("READY", time.perf_counter() - start)
ray.shutdown()
"""

EMBEDDED = """
import time; start = time.perf_counter()
import hwplace
cluster = hwplace.Cluster({"num_nodes": 1, "address": "local"})
print("READY", time.perf_counter() - start)
"""


def ready_seconds(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return float(next(line for line in out.splitlines() if line.startswith("READY")).split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per side (the median is shown)")
    args = parser.parse_args()
    sides = {"bare ray.init()": BARE, "hwplace.Cluster (after ray.init)": HWPLACE,
             "hwplace.Cluster (address: local)": EMBEDDED}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for run in range(args.repeat):
        for name in (list(sides) if run % 2 == 0 else list(reversed(sides))):
            times[name].append(ready_seconds(sides[name]))
    base = statistics.median(times["bare ray.init()"])
    print(f"median of {args.repeat} fresh processes, seconds from the first line until ready")
    print(f"{'start':<36}{'median':>8}{'min':>8}{'max':>8}{'added':>8}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<36}{median:>8.2f}{min(values):>8.2f}{max(values):>8.2f}{median - base:>+8.2f}")


if __name__ == "__main__":
    main()
