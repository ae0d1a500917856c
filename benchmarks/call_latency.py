"""The round trip of one call on a 2-rank hwplace group, against the same call on two bare Ray actors of each kind.

One local one-node Ray cluster (``hwplace.testing.local_ray_cluster``). Each system gets a trivial method that
returns at once; the driver calls it on both ranks and waits for both, ``--calls`` times per round, and the table
shows the median of each round:
- ``hwplace``: ``group.ping().wait()`` on a group of two workers (each hosted by a threaded Ray actor with
  concurrency groups: plain methods on the default group's one thread, ``async def`` ones on a loop of its own);
- ``ray sync actor``: ``ray.get([a.ping.remote() for a in actors])``, plain actors;
- ``ray async actor``: the same, the method ``async def``;
- ``ray async + thread``: an async actor whose method runs the work on a thread (``run_in_executor``), as
  hwplace's host does;
- ``ray threaded + group``: a plain actor with a concurrency group for a second, never-ending method (what
  hwplace's host needs to watch its process), the floor of hwplace's host.

Run: python benchmarks/call_latency.py [--calls 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

import hwplace
from hwplace.testing import local_ray_cluster


class Pinged(hwplace.Worker):
    def ping(self) -> int:
        return 1


@ray.remote(num_cpus=0)
class SyncActor:
    def ping(self) -> int:
        return 1


@ray.remote(num_cpus=0)
class AsyncActor:
    async def ping(self) -> int:
        return 1


@ray.remote(num_cpus=0)
class AsyncThreadActor:
    def __init__(self) -> None:
        self.thread = ThreadPoolExecutor(1)

    async def ping(self) -> int:
        return await asyncio.get_running_loop().run_in_executor(self.thread, int, 1)


@ray.remote(num_cpus=0, concurrency_groups={"watch": 1})
class ThreadedActor:
    def ping(self) -> int:
        return 1

    @ray.method(concurrency_group="watch")  # type: ignore[untyped-decorator]
    def watch(self) -> None:
        threading.Event().wait()


def median_ms(call: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        begin = time.perf_counter()
        call()
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with local_ray_cluster(num_nodes=1):
        group = Pinged.create_group().launch(hwplace.Cluster({"num_nodes": 1}), hwplace.NodePlacementStrategy([0, 0]),
                                             name="pinged")
        bare = {"ray sync actor": SyncActor, "ray async actor": AsyncActor, "ray async + thread": AsyncThreadActor,
                "ray threaded + group": ThreadedActor}
        actors = {name: [kind.remote() for _ in range(2)] for name, kind in bare.items()}
        for actor in actors["ray threaded + group"]:
            actor.watch.remote()
        systems: dict[str, Callable[[], Any]] = {"hwplace": lambda: group.ping().wait(timeout=60)}
        for name, pair in actors.items():
            systems[name] = lambda pair=pair: ray.get([a.ping.remote() for a in pair], timeout=60)
        for call in systems.values():
            for _ in range(20):  # warm up
                call()
        print(f"one call on two ranks, median of {args.calls} per round, ms")
        print("  ".join(f"{name:>20}" for name in systems))
        for _ in range(args.rounds):
            print("  ".join(f"{median_ms(call, args.calls):>20.3f}" for call in systems.values()), flush=True)
        group.shutdown()


if __name__ == "__main__":
    main()
