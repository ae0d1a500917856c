"""Planning speed over growing clusters: is ComponentPlacement linear in the number of processes?

Each cluster has N nodes of 8 fake accelerators (G = 8N) and three components:
``actor: all`` (G processes), ``rollout: 0-(G-1):0-(2G-1)`` (2G processes, two per accelerator) and
``env`` on group ``node`` with 16 processes per node (16N processes).

Run: python benchmarks/plan_scaling.py [--nodes 16,64,256,1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from hwplace import ComponentPlacement
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="16,64,256,1024", help="comma-separated node counts")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per size (the median is shown)")
    args = parser.parse_args()
    print(f"{'nodes':>6} {'accels':>7} {'processes':>10} {'plan s':>9} {'proc/s':>11} {'us/proc':>8}")
    for num_nodes in (int(n) for n in args.nodes.split(",")):
        cfg = config(num_nodes)
        cluster = fake_cluster(cfg["cluster"], accelerators_per_node=ACCELERATORS_PER_NODE)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            plan = ComponentPlacement(cfg, cluster)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        processes = sum(plan.get_world_size(name) for name in plan.components)
        print(f"{num_nodes:>6} {num_nodes * ACCELERATORS_PER_NODE:>7} {processes:>10} {seconds:>9.4f} "
              f"{processes / seconds:>11,.0f} {1e6 * seconds / processes:>8.2f}")


if __name__ == "__main__":
    main()
