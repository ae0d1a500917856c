"""Channel throughput: hwplace channels against ``ray.util.queue.Queue`` and against RLinf 0.3.0's Channel.

All systems run in one local Ray instance, started once with ``object_store_memory`` of 2 GiB (the same store
for all; the 16 MiB items of scenario (c) reuse its memory instead of spilling). Each system gets one producer
and one consumer, each a separate process launched once and warmed up with a short run of every scenario (for (c),
128 arrays, 2 GiB: the first pass through the store's memory costs page faults, several times the steady cost of
a copy, and would otherwise fall on whichever system runs first):
- ``hwplace``: two one-worker groups of a ``hwplace.Worker`` on node 0, over ``hwplace.Channel.create(name)``;
- ``ray queue``: two Ray actors (``num_cpus=0``) over ``ray.util.queue.Queue`` (its actor ``num_cpus=0`` too);
- ``rlinf``: two one-worker RLinf groups on node 0 over RLinf's ``Channel.create(name)`` made from the driver
  (see ``benchmarks/rlinf_baseline.py``), when RLinf imports; otherwise its rows say why.
A channel (or queue) is passed to the worker methods as an argument. The same loop code runs on all three
(:class:`Loops`); the Ray queue is reached through :class:`RayQueueChannel`, which maps the channel calls the
loops make onto the Queue API.

Scenarios (one measurement: both calls started, then both awaited; the clock runs from starting both until
both finished; msg/s and MiB/s are items and payload bytes got divided by that time):
- (a) 1 KiB ``bytes`` items, sync: the producer ``put``s each item, the consumer ``get``s each one.
- (b) 1 KiB items, pipelined: the producer issues ``put(item, weight=1, async_op=True)`` for each item and waits
  on the handles in windows of 1000; the consumer takes ``get_batch(256)`` (the last one smaller). For the Ray
  queue the producer issues ``queue.actor.put.remote(item)`` for each item (what ``Queue.put``/``put_async`` send,
  without waiting) and ``ray.get``s each window's references in one call; the consumer takes
  ``get_nowait_batch(256)`` and, when fewer than 256 items are queued, waits for the next item with a blocking
  ``get()`` (``get_nowait_batch`` refuses a short batch), then tries the batch again. ``put_nowait_batch`` is not
  used: it batches on the producer's side, which the other systems' producers do not do either. Tried and no
  faster on a 2-core machine: ``actor.put_nowait.remote``, a consumer that tops up its batch with ``qsize()``, and
  a consumer issuing 256 pipelined ``actor.get.remote()`` calls (the slowest).
- (c) 16 MiB numpy ``uint8`` arrays, sync put / get: the producer makes each one (``np.full``: about one memcpy),
  the consumer reads each one whole (``max()``), so it is really delivered. hwplace's items go by the same-node
  lane (the producer's shared memory, read in place: ``hwplace.channels.lane``); the floor is near two memcpys
  per item (the producer's fill and its copy into the lane).

The ratio column is hwplace's rate over that system's (msg/s; for (c) the same as MiB/s); the targets (from the
issue) are against the Ray queue: (a) >= 2x, (b) >= 20x, (c) >= 3x. Each figure is the median of ``--repeat``
measurements (``seconds`` is that median, ``(min-max)`` the spread), the systems taking turns in alternating order.

Run: python benchmarks/channel_throughput.py [--repeat 3] [--quick] [--only abc]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import rlinf_baseline  # beside this script: RLinf's side, which imports RLinf only when it is used
from ray.util.queue import Empty, Queue

import hwplace

KIB = 1024
MIB = 1024 * KIB
SMALL = KIB  # payload of scenarios (a) and (b)
LARGE = 16 * MIB  # payload of scenario (c)
BATCH = 256  # get_batch weight (items of weight 1) in (b)
WINDOW = 1000  # async puts in flight before the producer waits on them in (b)
OBJECT_STORE = 2 * 1024**3
TIMEOUT = 600.0  # seconds a measurement may take before it counts as hung
SYSTEMS = ("hwplace", "ray queue", "rlinf")


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    produce: str  # the Loops methods the producer and the consumer run
    consume: str
    size: int
    counts: dict[str, int]  # items per measurement, per system
    quick: dict[str, int]
    target: float  # hwplace's rate over the Ray queue's, wanted at least
    warmup: int  # items of the warm-up run (each system)


SCENARIOS = (
    Scenario("a", "1 KiB bytes items, sync put / get", "produce_sync", "consume_sync", SMALL,
             {"hwplace": 10000, "ray queue": 1000, "rlinf": 500}, {"hwplace": 300, "ray queue": 100, "rlinf": 50}, 2.0,
             50),
    Scenario("b", f"1 KiB items, pipelined async puts (windows of {WINDOW}) / get_batch({BATCH})", "produce_pipelined",
             "consume_batches", SMALL, {"hwplace": 50000, "ray queue": 5000, "rlinf": 1000},
             {"hwplace": 5000, "ray queue": 500, "rlinf": 100}, 20.0, 500),
    Scenario("c", "16 MiB numpy uint8 arrays, sync put / get", "produce_arrays", "consume_arrays", LARGE,
             {"hwplace": 200, "ray queue": 60, "rlinf": 30}, {"hwplace": 10, "ray queue": 5, "rlinf": 5}, 3.0,
             OBJECT_STORE // LARGE),
)


def _wait_each(handles: list[Any]) -> None:
    for handle in handles:
        handle.wait()


class Loops:
    """The producer's and the consumer's loops, shared by every system (a mixin of each system's worker class).

    ``channel`` offers ``put(item, weight=..., async_op=...)``, ``get()`` and ``get_batch(weight)`` (hwplace's and
    RLinf's channels do; :class:`RayQueueChannel` maps them onto ``ray.util.queue.Queue``). Consumers return the
    payload bytes they got, so the driver can check that everything arrived.
    """

    def ready(self) -> bool:
        return True

    def produce_sync(self, channel: Any, n: int, size: int) -> int:
        item = os.urandom(size)
        for _ in range(n):
            channel.put(item)
        return n

    def consume_sync(self, channel: Any, n: int) -> int:
        got = 0
        for _ in range(n):
            got += len(channel.get())
        return got

    def produce_pipelined(self, channel: Any, n: int, size: int) -> int:
        item = os.urandom(size)
        wait_all: Callable[[list[Any]], None] = getattr(channel, "wait_all", _wait_each)
        handles: list[Any] = []
        for _ in range(n):
            handles.append(channel.put(item, weight=1, async_op=True))
            if len(handles) == WINDOW:
                wait_all(handles)
                handles = []
        wait_all(handles)
        return n

    def consume_batches(self, channel: Any, n: int) -> int:
        got = items = 0
        while items < n:
            batch = channel.get_batch(min(BATCH, n - items))
            items += len(batch)
            got += sum(len(item) for item in batch)
        return got

    def produce_arrays(self, channel: Any, n: int, size: int) -> int:
        for index in range(n):
            channel.put(np.full(size, index % 251, dtype=np.uint8))  # each item made anew, as a rollout makes it
        return n

    def consume_arrays(self, channel: Any, n: int) -> int:
        got = touched = 0
        for _ in range(n):
            array = channel.get()
            touched ^= int(array.max())  # read it, every byte: the array is really here
            got += array.nbytes
        return got


class RayQueueChannel:
    """``ray.util.queue.Queue`` behind the calls :class:`Loops` makes (see the module's docstring for the mapping)."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def put(self, item: Any, weight: float = 0, async_op: bool = False) -> Any:
        if async_op:
            return self.queue.actor.put.remote(item)
        self.queue.put(item)
        return None

    def wait_all(self, refs: list[Any]) -> None:
        ray.get(refs)

    def get(self) -> Any:
        return self.queue.get()

    def get_batch(self, batch_weight: float) -> list[Any]:
        try:
            return self.queue.get_nowait_batch(int(batch_weight))
        except Empty:
            return [self.queue.get()]


class HwplaceSide(Loops, hwplace.Worker):
    pass


@ray.remote(num_cpus=0)
class RaySide(Loops):
    pass


def _rlinf_side_cls() -> type:
    """The RLinf worker class (RLinf's ``Worker`` plus :class:`Loops`), made when RLinf is used."""

    class RlinfSide(Loops, rlinf_baseline.worker_base()):  # type: ignore[misc]
        pass

    return RlinfSide


class System:
    """One system's producer, consumer and channel; :meth:`run` times one measurement."""

    name: str

    def call(self, producer: bool, method: str, *args: Any) -> Callable[[], Any]:
        """Start ``method`` on the producer or the consumer; returns a function waiting for its result."""
        raise NotImplementedError

    def run(self, scenario: Scenario, n: int) -> float:
        start = time.perf_counter()
        consumer = self.call(False, scenario.consume, n)
        producer = self.call(True, scenario.produce, n, scenario.size)
        put, got = producer(), consumer()
        seconds = time.perf_counter() - start
        if put != n or got != n * scenario.size:
            raise RuntimeError(f"{self.name}, ({scenario.key}): {put} of {n} items put, {got} of "
                               f"{n * scenario.size} bytes got")
        return seconds


class Hwplace(System):
    name = "hwplace"

    def __init__(self, cluster: hwplace.Cluster) -> None:
        self.channel = hwplace.Channel.create(f"bench-throughput-{os.getpid()}")
        self.groups = [HwplaceSide.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]),
                                                         name=f"bench-{role}-{os.getpid()}")
                       for role in ("producer", "consumer")]

    def call(self, producer: bool, method: str, *args: Any) -> Callable[[], Any]:
        handle = getattr(self.groups[0 if producer else 1], method)(self.channel, *args)
        return lambda: handle.wait(timeout=TIMEOUT)[0]


class RayQueue(System):
    name = "ray queue"

    def __init__(self) -> None:
        self.channel = RayQueueChannel(Queue(actor_options={"num_cpus": 0}))
        self.actors = [RaySide.remote(), RaySide.remote()]  # type: ignore[attr-defined]
        ray.get([actor.ready.remote() for actor in self.actors])

    def call(self, producer: bool, method: str, *args: Any) -> Callable[[], Any]:
        ref = getattr(self.actors[0 if producer else 1], method).remote(self.channel, *args)
        return lambda: ray.get(ref, timeout=TIMEOUT)


class Rlinf(System):
    name = "rlinf"

    def __init__(self) -> None:
        cls = _rlinf_side_cls()
        self.channel = rlinf_baseline.create_channel(f"bench_throughput_{os.getpid()}")
        self.groups = [rlinf_baseline.launch_worker(cls, f"bench_{role}_{os.getpid()}")
                       for role in ("producer", "consumer")]

    def call(self, producer: bool, method: str, *args: Any) -> Callable[[], Any]:
        handle = getattr(self.groups[0 if producer else 1], method)(self.channel, *args)
        return lambda: handle.wait()[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per scenario and system (the median shows)")
    parser.add_argument("--quick", action="store_true", help="small item counts (a smoke run, not a measurement)")
    parser.add_argument("--only", default="abc", help="the scenarios to run, by letter (default: abc)")
    args = parser.parse_args()
    scenarios = [s for s in SCENARIOS if s.key in args.only]
    wall = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), object_store_memory=OBJECT_STORE, include_dashboard=False, log_to_driver=False)
    cluster = hwplace.Cluster({"num_nodes": 1})
    systems: dict[str, System] = {"hwplace": Hwplace(cluster), "ray queue": RayQueue()}
    missing: dict[str, str] = {}  # system -> why it has no figures at all
    if rlinf_baseline.RLINF_VERSION:
        try:
            systems["rlinf"] = Rlinf()
        except Exception as exc:
            missing["rlinf"] = f"RLinf's channel or workers did not start ({_first_line(exc)})"
    else:
        missing["rlinf"] = rlinf_baseline.RLINF_MISSING_REASON
    failed: dict[tuple[str, str], str] = {}  # (system, scenario) -> why it has no figure
    for scenario in scenarios:  # warm-up: connections, RLinf's communication groups, first-use costs
        for name, system in systems.items():
            try:
                system.run(scenario, min(scenario.warmup, scenario.quick[name]) if args.quick else scenario.warmup)
            except Exception as exc:
                failed[name, scenario.key] = _first_line(exc)
    print(f"ray {ray.__version__}, hwplace {hwplace.__version__}"
          + (f", rlinf {rlinf_baseline.RLINF_VERSION}" if "rlinf" in systems else "")
          + f"; {os.cpu_count()} CPUs; object store {OBJECT_STORE / 1024**3:g} GiB; median of {args.repeat} runs"
          + (" (--quick counts)" if args.quick else ""))
    for scenario in scenarios:
        counts = scenario.quick if args.quick else scenario.counts
        here = [name for name in systems if (name, scenario.key) not in failed]
        times: dict[str, list[float]] = {name: [] for name in here}
        for run in range(args.repeat):
            for name in here if run % 2 == 0 else reversed(here):
                if (name, scenario.key) in failed:
                    continue
                try:
                    times[name].append(systems[name].run(scenario, counts[name]))
                except Exception as exc:
                    failed[name, scenario.key] = _first_line(exc)
        rates = {name: counts[name] / statistics.median(values)
                 for name, values in times.items() if values and (name, scenario.key) not in failed}
        print(f"\n({scenario.key}) {scenario.title}; target: hwplace >= {scenario.target:g}x ray queue")
        print(f"{'system':<10}{'items':>7}{'seconds':>9}{'(min-max)':>14}{'msg/s':>9}{'MiB/s':>9}{'hwplace/x':>11}"
              "  target")
        for name in SYSTEMS:
            if name in rates:
                rate = rates[name]
                spread = f"{min(times[name]):.2f}-{max(times[name]):.2f}"
                row = f"{name:<10}{counts[name]:>7}{counts[name] / rate:>9.3f}{spread:>14}{rate:>9.0f}"
                row += f"{rate * scenario.size / MIB:>9.1f}"
                if name != "hwplace" and "hwplace" in rates:
                    ratio = rates["hwplace"] / rate
                    row += f"{ratio:>10.2f}x"
                    if name == "ray queue":
                        row += f"  >= {scenario.target:g}x: " + ("met" if ratio >= scenario.target else "MISSED")
                print(row)
            else:
                reason = failed.get((name, scenario.key)) or missing.get(name, "not run")
                print(f"{name:<10}  no figure: {reason}")
    print(f"\nwhole run {time.perf_counter() - wall:.0f} s")
    ray.shutdown()


if __name__ == "__main__":
    main()
