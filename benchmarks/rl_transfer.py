"""Weight sync and messaging between workers, each against its baseline in the same run.

One local two-node Ray cluster (``hwplace.testing.local_ray_cluster``), started once. All timings are taken on
the driver: both sides' calls are started (the source's first), then awaited; the clock runs from the start until
all finished.
State dicts are built once per size in the workers (four float32 tensors of a quarter of the size each), so no
timing includes making them. Each figure is the median of ``--repeat`` runs, the systems taking turns.

Weight sync of 1, 10 and 100 MB to two rollout ranks (the trainer's rank 0 publishes, both ranks wait for
that version with ``latest(min_version=v)`` and read a value of it):
- one node (trainer and both rollout ranks on node 0), also timed in the workers ("hwplace in workers": from the
  start of the trainer's ``publish`` to the last rank's read of the version, on the node's one monotonic clock,
  leaving out the driver's calls, which a training loop does not make), and from the driver with the targets
  waiting ("targets waiting": their calls made and left 50 ms to arrive and wait in ``latest()`` before the clock
  starts, as a loop's targets wait when its source publishes; the clock then covers the publish call and the
  results' return): against one copy of the state dict in the
  trainer (torch ``copy_`` into tensors made before, timed in the worker: the floor, as a same-node sync needs one
  write by the source and an in-place read by each target; target at 100 MB: at most 2x), against one ``ray.put`` of
  the same arrays in the trainer plus a ``ray.get`` on each rank (target: at most 1.2x at 1 MB), and against
  relaying through the driver (target: hwplace at least 3x faster), two ways: "driver relay (numpy)" returns numpy
  views of the tensors, which Ray maps from its object store without a copy at every hop (a relay few users write);
  "driver relay (torch)" is what an RL user writes: the trainer's method returns its state dict of torch tensors,
  the driver gets it and passes it to the rollout ranks' method (each tensor pickled with its bytes at every hop);
- two nodes (trainer on node 0, both rollout ranks on node 1): against a bare gloo broadcast of the same bytes
  (one flat uint8 tensor) between the same three processes (target: at most 1.3x).

Messaging: 1 KiB tensors, ``send`` / ``recv`` between workers of two groups on node 0, 2000 messages, against the
same hand-over through Ray actor calls (the sender awaits ``receiver.take.remote(item)`` for each; target:
hwplace at least 5x the rate); a 64 MiB tensor from node 0 to node 1, 5 times, against a bare gloo
``send``/``recv`` between the same processes (target: hwplace at least 0.7x the rate).

Each node's object store (1 GiB) is populated when the cluster starts (``RAY_preallocate_plasma_memory``), as a
store is after a while of use: otherwise the first touch of its pages (0.2 s per 100 MB here) lands on whichever
system first puts into a fresh part of it. ``--cold-store`` leaves that out.

Run: python benchmarks/rl_transfer.py [--repeat 3] [--quick] [--sizes 100] [--parts one-node,two-nodes,messaging]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import ray
import torch
from sync_sides import MB, SyncSide  # this folder is the script's: on sys.path

import hwplace
from hwplace.runtime.messaging.communicator import connect, find_entry
from hwplace.testing import local_ray_cluster

MEMCPY = "one memcpy (in worker)"
IN_WORKERS = "hwplace in workers"
WAITING = "targets waiting"  # from the driver, the targets' calls made before the clock starts
SETTLE = 0.05  # seconds the driver leaves the targets' calls to arrive and wait, before it starts the clock


class Bench(SyncSide):
    """The sync's ends and the floor's copy (:class:`SyncSide`), and the baselines' sides."""

    def __init__(self) -> None:
        super().__init__()
        self.pg: Any = None

    def put(self, megabytes: int) -> list[Any]:
        return [ray.put({k: v.numpy() for k, v in self.states[megabytes].items()})]

    def get(self, refs: list[Any]) -> int:
        return int(ray.get(refs[0])["layer3.weight"][-1])

    def arrays(self, megabytes: int) -> dict[str, Any]:
        return {k: v.numpy() for k, v in self.states[megabytes].items()}

    def take(self, arrays: dict[str, Any]) -> int:
        return int(arrays["layer3.weight"][-1])

    def state(self, megabytes: int) -> dict[str, torch.Tensor]:
        return self.states[megabytes]

    def bare_connect(self, key: str, members: list[tuple[str, int]]) -> None:
        entry = find_entry(hwplace.executor.current_executor(), self.group_name)
        index = members.index((self.group_name, self.rank))
        self.pg = connect(hwplace.executor.current_executor(), key, members, index, entry.addresses[self.rank],
                          None).gloo

    def bare_broadcast(self, nbytes: int) -> int:
        tensor = torch.full((nbytes,), 3, dtype=torch.uint8) if self.group_name == "trainer" else \
            torch.empty(nbytes, dtype=torch.uint8)
        self.pg.broadcast(tensor, 0).wait()
        return int(tensor[-1])

    def bare_send(self, nbytes: int, count: int) -> None:
        tensor = torch.ones(nbytes, dtype=torch.uint8)
        for _ in range(count):
            self.pg.send([tensor], 1, 0).wait()

    def bare_recv(self, nbytes: int, count: int) -> None:
        tensor = torch.empty(nbytes, dtype=torch.uint8)
        for _ in range(count):
            self.pg.recv([tensor], 0, 0).wait()

    def send_many(self, group: str, rank: int, nbytes: int, count: int) -> None:
        tensor = torch.ones(nbytes, dtype=torch.uint8)
        for _ in range(count):
            self.send(tensor, group, rank)

    def recv_many(self, group: str, rank: int, count: int) -> None:
        for _ in range(count):
            self.recv(group, rank, timeout=300)


@ray.remote(num_cpus=0)
class RaySink:
    def take(self, item: Any) -> None:
        self.last = item


@ray.remote(num_cpus=0)
class RaySource:
    def run(self, sink: Any, nbytes: int, count: int) -> None:
        item = torch.ones(nbytes, dtype=torch.uint8)
        for _ in range(count):
            ray.get(sink.take.remote(item))


def timed(start: Callable[[], list[Any]], results: list[Any] | None = None) -> float:
    begin = time.perf_counter()
    for handle in start():
        got = handle.wait(timeout=600) if hasattr(handle, "wait") else ray.get(handle, timeout=600)
        if results is not None:
            results.append(got)
    return time.perf_counter() - begin


def median(runs: list[float]) -> float:
    return statistics.median(runs)


def weight_sync_rows(cluster: hwplace.Cluster, nodes: list[int], sizes: list[int], repeat: int,
                     baselines: list[str]) -> None:
    trainer = Bench.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="trainer")
    rollout = Bench.create_group().launch(cluster, hwplace.NodePlacementStrategy(nodes), name="rollout")
    sync = hwplace.WeightSync.create(f"bench-{nodes[0]}", source="trainer", targets=("rollout",))
    members = [("trainer", 0), ("rollout", 0), ("rollout", 1)]
    if "gloo broadcast" in baselines:
        key = f"bench-bcast-{time.time_ns()}"
        handles = [trainer.bare_connect(key, members), rollout.bare_connect(key, members)]
        for h in handles:
            h.wait(timeout=120)
    where = "one node" if nodes[0] == 0 else "two nodes"
    print(f"weight sync to two rollout ranks, {where}: {', '.join(sync.plan[i].transport for i in range(2))}")
    inside = IN_WORKERS if nodes[0] == 0 else None  # one node: one clock for the source and its targets
    print(f"  {'MB':>4}  {'hwplace s':>10}  " + "  ".join(f"{b + ' s':>22}  {'ratio':>6}" for b in baselines)
          + (f"  {inside + ' s':>22}  {'/memcpy':>7}  {WAITING + ' s':>18}  {'/memcpy':>7}" if inside else ""))
    version = 0
    late = 0  # rounds of WAITING where a target's call began waiting only after the publish began
    for megabytes in sizes:
        for group in (trainer, rollout):
            group.prepare(megabytes).wait(timeout=120)
        runs: dict[str, list[float]] = {"hwplace": [], IN_WORKERS: [], WAITING: [], **{b: [] for b in baselines}}
        for attempt in range(repeat + 1):  # the first round warms every path up and is not counted

            def ours(v: int, mb: int) -> list[Any]:
                published = trainer.publish(sync, mb)  # the source's call first, as every baseline's
                return [published, rollout.wait_version(sync, v)]

            def waited(v: int, mb: int) -> Callable[[], list[Any]]:
                """The targets' calls first, left to arrive and wait; then (the clock started) the publish."""
                waiting = rollout.wait_version(sync, v)
                time.sleep(SETTLE)
                return lambda: [trainer.publish(sync, mb), waiting]

            def put_get(mb: int = megabytes) -> list[Any]:
                [refs] = trainer.put(mb).wait(timeout=120)
                return [rollout.get(refs)]

            def relay(mb: int = megabytes) -> list[Any]:
                [arrays] = trainer.arrays(mb).wait(timeout=120)
                return [rollout.take(arrays)]

            def bcast(mb: int = megabytes) -> list[Any]:
                nbytes = mb * MB
                return [rollout.bare_broadcast(nbytes), trainer.bare_broadcast(nbytes)]

            def relay_torch(mb: int = megabytes) -> list[Any]:
                [tensors] = trainer.state(mb).wait(timeout=120)
                return [rollout.take(tensors)]

            chosen = {"ray.put + get": put_get, "driver relay (numpy)": relay, "driver relay (torch)": relay_torch,
                      "gloo broadcast": bcast}
            ours_too = ["hwplace", WAITING] if inside else ["hwplace"]
            order = [*ours_too, *baselines] if attempt % 2 else [*baselines, *ours_too]
            for system in order:
                results: list[Any] = []
                if system == MEMCPY:
                    [seconds] = trainer.memcpy(megabytes).wait(timeout=120)
                elif system in ("hwplace", WAITING):
                    version += 1
                    start = functools.partial(ours, version, megabytes) if system == "hwplace" else \
                        waited(version, megabytes)
                    seconds = timed(start, results)
                else:
                    seconds = timed(chosen[system], results)
                if attempt:
                    runs[system].append(seconds)
                    if system == "hwplace" and inside:  # from the publish call's start to the last target's read
                        [begin], waits = results[0], results[1]
                        runs[IN_WORKERS].append(max(end for _, end in waits) - begin)
                    if system == WAITING:
                        [begin], waits = results[0], results[1]
                        late += any(began > begin for began, _ in waits)
        mine = median(runs["hwplace"])
        cells = "  ".join(f"{median(runs[b]):>22.4f}  {mine / median(runs[b]):>6.2f}" for b in baselines)
        if inside:
            within, waiting = median(runs[IN_WORKERS]), median(runs[WAITING])
            cells += f"  {within:>22.4f}  {within / median(runs[MEMCPY]):>7.2f}"
            cells += f"  {waiting:>18.4f}  {waiting / median(runs[MEMCPY]):>7.2f}"
        print(f"  {megabytes:>4}  {mine:>10.4f}  {cells}")
    print("  ratio: hwplace's time over the baseline's")
    if inside:
        print(f"  {WAITING}: the targets' calls made {SETTLE * 1e3:g} ms before the clock starts (a training loop's "
              f"targets wait in latest() when the source publishes); a target was not yet waiting in {late} of "
              f"{repeat * len(sizes)} rounds")
    print()
    trainer.shutdown()
    rollout.shutdown()


def messaging_rows(cluster: hwplace.Cluster, repeat: int, count: int) -> None:
    sender = Bench.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="sender")
    receiver = Bench.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="receiver")
    node0 = next(n.node_id for n in cluster.nodes if n.rank == 0)
    affinity = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node0, soft=False)
    sink = RaySink.options(scheduling_strategy=affinity).remote()
    source = RaySource.options(scheduling_strategy=affinity).remote()
    runs: dict[str, list[float]] = {"hwplace": [], "ray actor calls": []}
    for attempt in range(repeat + 1):
        def ours() -> list[Any]:
            waiting = receiver.recv_many("sender", 0, count)
            return [sender.send_many("receiver", 0, 1024, count), waiting]

        for system in (["hwplace", "ray actor calls"] if attempt % 2 else ["ray actor calls", "hwplace"]):
            seconds = timed(ours if system == "hwplace" else lambda: [source.run.remote(sink, 1024, count)])
            if attempt:
                runs[system].append(seconds)
    rate = {k: count / median(v) for k, v in runs.items()}
    print(f"send/recv of 1 KiB tensors between two groups on one node, {count} messages")
    print(f"  hwplace {rate['hwplace']:>9.0f} msg/s   ray actor calls {rate['ray actor calls']:>9.0f} msg/s   "
          f"ratio {rate['hwplace'] / rate['ray actor calls']:.1f}x\n")
    sender.shutdown()
    receiver.shutdown()

    sender = Bench.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="sender")
    receiver = Bench.create_group().launch(cluster, hwplace.NodePlacementStrategy([1]), name="receiver")
    key = f"bench-pair-{time.time_ns()}"
    members = [("sender", 0), ("receiver", 0)]
    for h in [sender.bare_connect(key, members), receiver.bare_connect(key, members)]:
        h.wait(timeout=120)
    nbytes, times = 64 * 2**20, 5
    runs = {"hwplace": [], "gloo send/recv": []}
    for attempt in range(repeat + 1):
        def ours_big() -> list[Any]:
            waiting = receiver.recv_many("sender", 0, times)
            return [sender.send_many("receiver", 0, nbytes, times), waiting]

        def bare() -> list[Any]:
            waiting = receiver.bare_recv(nbytes, times)
            return [sender.bare_send(nbytes, times), waiting]

        for system in (["hwplace", "gloo send/recv"] if attempt % 2 else ["gloo send/recv", "hwplace"]):
            seconds = timed(ours_big if system == "hwplace" else bare)
            if attempt:
                runs[system].append(seconds)
    mib = {k: times * 64 / median(v) for k, v in runs.items()}
    print(f"a 64 MiB tensor from node 0 to node 1, {times} times")
    print(f"  hwplace {mib['hwplace']:>7.0f} MiB/s   gloo send/recv {mib['gloo send/recv']:>7.0f} MiB/s   "
          f"ratio {mib['hwplace'] / mib['gloo send/recv']:.2f}x\n")
    sender.shutdown()
    receiver.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 and 10 MB only, fewer messages")
    parser.add_argument("--sizes", default="", help="weight sync sizes in MB, comma-separated (default 1,10,100)")
    parser.add_argument("--cold-store", action="store_true", help="do not populate the object stores at start")
    parser.add_argument("--parts", default="one-node,two-nodes,messaging", help="which parts to run")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [1, 10] if args.quick else [1, 10, 100]
    parts = set(args.parts.split(","))
    if not args.cold_store:
        os.environ["RAY_preallocate_plasma_memory"] = "1"  # noqa: SIM112 (Ray spells it so); the raylets inherit it
    with local_ray_cluster(num_nodes=2):
        cluster = hwplace.Cluster({"num_nodes": 2})
        if "one-node" in parts:
            weight_sync_rows(cluster, [0, 0], sizes, args.repeat,
                             [MEMCPY, "ray.put + get", "driver relay (numpy)", "driver relay (torch)"])
        if "two-nodes" in parts:
            weight_sync_rows(cluster, [1, 1], sizes, args.repeat, ["gloo broadcast"])
        if "messaging" in parts:
            messaging_rows(cluster, args.repeat, 500 if args.quick else 2000)


if __name__ == "__main__":
    main()
