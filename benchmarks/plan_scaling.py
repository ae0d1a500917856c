"""Planning speed over growing clusters: is ComponentPlacement linear in the number of processes?

Each cluster has N nodes of 8 fake accelerators (G = 8N) and three components:
``actor: all`` (G processes), ``rollout: 0-(G-1):0-(2G-1)`` (2G processes, two per accelerator) and
``env`` on group ``node`` with 16 processes per node (16N processes).

``plan s`` times ``ComponentPlacement(cfg, cluster)``, which checks every process; ``+placements s`` also
asks every component's strategy for its ``Placement`` records, which is what a launch consumes, and is
what RLinf 0.3.0 is timed doing on the same inventory (``benchmarks/rlinf_baseline.py``), when it is
installed, up to ``--rlinf-max-nodes`` (its planning grows with the square of the processes).

Run: python benchmarks/plan_scaling.py [--nodes 16,64,256,1024] [--repeat 5] [--rlinf-max-nodes 256]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import rlinf_baseline  # beside this script: RLinf's side, which imports RLinf only when it is used

from hwplace import Cluster, ComponentPlacement
from hwplace.testing import fake_cluster

ACCELERATORS_PER_NODE = 8
ENV_PER_NODE = 16


def config(num_nodes: int) -> dict[str, object]:
    g = num_nodes * ACCELERATORS_PER_NODE
    return {"cluster": {
        "num_nodes": num_nodes,
        "component_placement": {
            "actor": "all",
            "rollout": f"0-{g - 1}:0-{2 * g - 1}",
            "env": {"node_group": "node", "placement": f"0-{num_nodes - 1}:0-{ENV_PER_NODE * num_nodes - 1}"},
        },
    }}


def plan_and_place(cfg: dict[str, object], cluster: Cluster) -> None:
    plan = ComponentPlacement(cfg, cluster)
    for name in plan.components:
        plan.get_strategy(name).get_placement(cluster)


def median_seconds(repeat: int, work: Callable[..., object], *args: object) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="16,64,256,1024", help="comma-separated node counts")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per size (the median is shown)")
    parser.add_argument("--rlinf-max-nodes", type=int, default=256, help="largest cluster RLinf is timed on")
    args = parser.parse_args()
    rlinf = rlinf_baseline.RLINF_VERSION
    print(f"rlinf {rlinf}" if rlinf else f"RLinf column left out: {rlinf_baseline.RLINF_MISSING_REASON}")
    print(f"{'nodes':>6} {'accels':>7} {'processes':>10} {'plan s':>9} {'us/proc':>8} {'+placements s':>14}"
          + (f" {'rlinf s':>9} {'rlinf/hwplace':>14}" if rlinf else ""))
    for num_nodes in (int(n) for n in args.nodes.split(",")):
        cfg = config(num_nodes)
        cluster = fake_cluster(cfg["cluster"], accelerators_per_node=ACCELERATORS_PER_NODE)
        plan = ComponentPlacement(cfg, cluster)
        processes = sum(plan.get_world_size(name) for name in plan.components)
        seconds = median_seconds(args.repeat, ComponentPlacement, cfg, cluster)
        placed = median_seconds(args.repeat, plan_and_place, cfg, cluster)
        row = (f"{num_nodes:>6} {num_nodes * ACCELERATORS_PER_NODE:>7} {processes:>10} {seconds:>9.4f} "
               f"{1e6 * seconds / processes:>8.2f} {placed:>14.4f}")
        if rlinf and num_nodes <= args.rlinf_max_nodes:
            theirs, their_processes = rlinf_baseline.plan_seconds(
                num_nodes, ACCELERATORS_PER_NODE, cfg["cluster"]["component_placement"],  # type: ignore[index]
                repeat=args.repeat if num_nodes < 256 else 1)
            if their_processes != processes:
                raise SystemExit(f"RLinf planned {their_processes} processes, hwplace {processes}: not comparable")
            row += f" {theirs:>9.4f} {theirs / placed:>14.1f}"
        elif rlinf:
            row += f" {'skipped':>9}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
