"""Placement search speed: ``hwplace.search_placements`` on 512 accelerators (64 nodes of 8 fake ones).

The goal (issue 24): 512 accelerators searched in at most 1 s. Each scenario's profile makes every process
count from 1 to 512 predictable (``scaling: data-parallel`` between a point at 1 process and one at 512), the
hardest case for the search: every size of every cell is a candidate. Components:

- ``trainer`` (train 800 s on 1 process, 2 s on 512; offloads, 1 GiB while offloaded; 50 GiB training),
- ``rollout`` (generate 1200 s on 1, 3 s on 512; offloads; 30 GiB),
- ``reward`` (score 300 s on 1, 1 s on 512; offloads; 10 GiB),
- ``critic`` (4 components only: 600 s on 1, 2 s on 512; offloads; 40 GiB),

with a 2 GB weight sync from the trainer to the rollout. ``seconds`` is the median of ``--repeat`` searches
(planning the layouts, all orders, all sizes), ``cpu s`` the median processor time of this process in them (the
figure to read on a shared, loaded machine), ``layouts`` how many layouts were searched, ``best`` the
fastest layout and its predicted step; ``--nodes`` changes the cluster (nodes of 8).

Run: python benchmarks/placement_search.py [--repeat 5] [--nodes 64] [--components 2,3,4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import hwplace
from hwplace.testing import fake_cluster

COMPONENTS: dict[str, tuple[str, float, float, str]] = {  # stage, seconds on 1 process, on 512, working memory
    "trainer": ("train", 800.0, 2.0, "50GiB"),
    "rollout": ("generate", 1200.0, 3.0, "30GiB"),
    "reward": ("score", 300.0, 1.0, "10GiB"),
    "critic": ("value", 600.0, 2.0, "40GiB"),
}


def job(names: list[str], num_nodes: int) -> hwplace.JobConfig:
    return hwplace.parse_job_config({
        "cluster": {"num_nodes": num_nodes, "component_placement": {name: str(i) for i, name in enumerate(names)}},
        "weight_sync": {"policy": {"source": "trainer", "targets": ["rollout"]}}})


def profile(names: list[str], most: int) -> hwplace.Profile:
    components: dict[str, Any] = {}
    for name in names:
        stage, one, many, memory = COMPONENTS[name]
        components[name] = {"scaling": "data-parallel", "points": [
            {"processes": processes, "stages": {stage: {"seconds": seconds}}, "offload": {"seconds": 0.5},
             "onload": {"seconds": 0.5}, "memory": {stage: memory, "offloaded": "1GiB"}}
            for processes, seconds in ((1, one), (most, many))]}
    return hwplace.parse_profile({"version": 1, "components": components,
                                  "weight_sync": {"policy": {"bytes": "2GB"}}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed searches per scenario (the median is shown)")
    parser.add_argument("--nodes", type=int, default=64, help="nodes of 8 fake accelerators (default 64: 512)")
    parser.add_argument("--components", default="2,3,4", help="comma-separated component counts to search")
    args = parser.parse_args()
    accelerators = 8 * args.nodes
    print(f"{'components':>10} {'accels':>7} {'layouts':>8} {'seconds':>9} {'cpu s':>7}  best")
    for count in (int(c) for c in args.components.split(",")):
        names = list(COMPONENTS)[:count]
        config = job(names, args.nodes)
        cluster = fake_cluster(config.cluster, accelerators_per_node=8)
        measured = profile(names, accelerators)
        times, cpu, result = [], [], None
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = hwplace.search_placements(config, cluster, measured)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        assert result is not None
        best = result.best
        placement = ", ".join(f"{','.join(c.components)} {c.size}" for c in best.cells or ())
        print(f"{count:>10} {accelerators:>7} {len(result.candidates):>8} {statistics.median(times):>9.3f} "
              f"{statistics.median(cpu):>7.3f}  "
              f"{best.label}: {best.step_seconds:.3f} s ({placement})")


if __name__ == "__main__":
    main()
