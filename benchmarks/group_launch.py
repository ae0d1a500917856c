"""Group launch time: hwplace worker groups against the same bare Ray actors, and against RLinf 0.3.0.

For each size N, in one local Ray instance and in alternating order, it times until N workers have each
answered one call:
- ``bare ray``: N actors of a trivial class, pinned to the node (hard node affinity, ``num_cpus=0``);
- ``hwplace``: ``Worker.create_group().launch(...)`` of N workers on the node, then one group call;
- ``rlinf``: RLinf's worker-group launch (see ``benchmarks/rlinf_baseline.py``), when RLinf is installed,
  for the sizes in ``--rlinf-sizes`` (each RLinf worker imports torch: about 280 MiB, so 64 of them need
  some 18 GiB).
Then it stops them. The table shows the median over ``--repeat`` runs and hwplace's ratio to each.

A worker process imports about 70 of hwplace's modules. Where their bytecode is not cached (an editable
install under ``PYTHONDONTWRITEBYTECODE=1``: no ``__pycache__`` is written), every worker compiles them, about
65 ms of CPU each on the 2-core machine; a wheel install (pip compiles it) or ``python -m compileall hwplace
plugins`` caches it. The first line says which case was measured.

Run: python benchmarks/group_launch.py [--sizes 4,16,64] [--repeat 3] [--rlinf-sizes 4,16]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable

import ray
import rlinf_baseline  # beside this script: RLinf's side, which imports RLinf only when it is used
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import hwplace


class Noop(hwplace.Worker):
    def ping(self) -> int:
        return self.rank


@ray.remote(num_cpus=0)
class BareActor:
    def ping(self) -> int:
        return 0


def bare_ray(n: int, node_id: str) -> float:
    start = time.perf_counter()
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    actors = [BareActor.options(scheduling_strategy=strategy).remote() for _ in range(n)]
    ray.get([a.ping.remote() for a in actors])
    seconds = time.perf_counter() - start
    for actor in actors:
        ray.kill(actor)
    return seconds


def bytecode_state() -> str:
    """Whether the hwplace modules this process has loaded have cached bytecode, which a worker then loads."""
    files = [module.__file__ for name, module in list(sys.modules.items())
             if name.split(".")[0] in ("hwplace", "hwplace_plugins") and getattr(module, "__file__", None)]
    cached = sum(os.path.exists(importlib.util.cache_from_source(f)) for f in files if f.endswith(".py"))
    if cached == len(files):
        return f"hwplace's bytecode cached ({cached} modules loaded here)"
    return (f"hwplace's bytecode cached for {cached} of {len(files)} modules loaded here: each worker compiles the "
            f"rest (`python -m compileall hwplace plugins` caches them)")


def with_hwplace(n: int, cluster: hwplace.Cluster, run: int) -> float:
    start = time.perf_counter()
    group = Noop.create_group().launch(cluster, hwplace.NodePlacementStrategy([0] * n), name=f"bench-{n}-{run}")
    group.ping().wait()
    seconds = time.perf_counter() - start
    group.shutdown()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,64", help="comma-separated group sizes")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per size and side (the median is shown)")
    parser.add_argument("--rlinf-sizes", default="4,16", help="the sizes RLinf is timed at")
    args = parser.parse_args()
    rlinf_sizes = {int(s) for s in args.rlinf_sizes.split(",") if s}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cluster = hwplace.Cluster({"num_nodes": 1})
    node_id = cluster.nodes[0].node_id
    sides: dict[str, Callable[[int, int], float]] = {
        "bare ray": lambda n, run: bare_ray(n, node_id),
        "hwplace": lambda n, run: with_hwplace(n, cluster, run),
    }
    if rlinf_baseline.RLINF_VERSION:
        sides["rlinf"] = lambda n, run: rlinf_baseline.launch_group_seconds(n)
    else:
        print(f"RLinf column left out: {rlinf_baseline.RLINF_MISSING_REASON}")
    # warm-up, each side: first-use costs (exporting an actor class, the remote functions) are not launch time
    with_hwplace(2, cluster, -1)
    bare_ray(2, node_id)
    print(f"ray {ray.__version__}, hwplace {hwplace.__version__}"
          + (f", rlinf {rlinf_baseline.RLINF_VERSION}" if rlinf_baseline.RLINF_VERSION else "")
          + f"; {os.cpu_count()} CPUs; median of {args.repeat} runs, seconds until every worker answered once")
    print(bytecode_state())
    header = f"{'workers':>8}" + "".join(f"{name:>11}" for name in sides) + f"{'hw/bare':>9}"
    if "rlinf" in sides:
        header += f"{'hw/rlinf':>10}"
    print(header)
    for n in (int(s) for s in args.sizes.split(",")):
        here = [name for name in sides if name != "rlinf" or n in rlinf_sizes]
        times: dict[str, list[float]] = {name: [] for name in here}
        for run in range(args.repeat):
            order = here if run % 2 == 0 else list(reversed(here))
            for name in order:
                times[name].append(sides[name](n, run))
                time.sleep(1.0)  # let killed workers exit before the next side starts
        medians = {name: statistics.median(values) for name, values in times.items()}
        row = f"{n:>8}" + "".join(f"{medians[name]:>11.3f}" if name in medians else f"{'-':>11}" for name in sides)
        row += f"{medians['hwplace'] / medians['bare ray']:>9.2f}"
        if "rlinf" in medians:
            row += f"{medians['hwplace'] / medians['rlinf']:>10.2f}"
        print(row, flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
