"""Where a same-node weight sync spends its time: one publish and both targets' ``latest()``, phase by phase.

One local one-node Ray cluster; a trainer (the source) and two rollout ranks on it, a 100 MB state dict (four
float32 tensors) as in ``benchmarks/rl_transfer.py --parts one-node``. Each worker wraps the weight sync's
internal steps (the rendezvous note, packing, the segment's claim and its copy-and-hash, the announcements, a
target's hold, kept mapping, digest check or hashing while the source writes, the views) to record when each
began and ended (``CLOCK_MONOTONIC``, one clock for every process of the machine); the driver prints them for the
first and last timed round, relative to when it started the calls, and the medians of every round against one
``copy_`` of the state dict in the trainer (the floor's write) and one pass reading it (the floor's in-place read
by each target), both timed in the worker in the same run.

Run: python benchmarks/sync_profile.py [--megabytes 100] [--rounds 8]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import statistics
import time
from typing import Any

import torch

import hwplace
from hwplace.testing import local_ray_cluster

MB = 10**6
EVENTS: list[tuple[str, int, int]] = []
STEPS = [  # (module, attribute, label): what each worker records
    ("hwplace_plugins.ray.rendezvous", "kv_put", "rendezvous note"),
    ("hwplace.runtime.weight_sync.source", "pack", "pack"),
    ("hwplace.runtime.weight_sync.segments", "SegmentPool._claim", "claim segment"),
    ("hwplace.runtime.weight_sync.segments", "_copy_hashed", "copy+hash bucket"),
    ("hwplace.runtime.weight_sync.source", "forewarn", "Writing note"),
    ("hwplace.runtime.weight_sync.transports", "SameNode.seal", "seal"),
    ("hwplace.runtime.weight_sync.source", "deliver", "announce"),
    ("hwplace.runtime.weight_sync.receiver", "recv_pickle", "note received"),
    ("hwplace.runtime.weight_sync.transports", "check_while_written", "check while written"),
    ("hwplace.runtime.weight_sync.transports", "wait_posted", "node's check posted"),
    ("hwplace.runtime.weight_sync.transports", "wait_sealed", "seal seen"),
    ("hwplace.runtime.weight_sync.segments", "SegmentReader.hold", "hold"),
    ("hwplace.runtime.weight_sync.segments", "SegmentReader.checking", "kept mapping"),
    ("hwplace.runtime.weight_sync.transports", "check", "digest check"),
    ("hwplace.runtime.weight_sync.transports", "HostVersion.weights", "views"),
]


def record(owner: Any, name: str, label: str) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "recorded", False):
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        begin = time.monotonic_ns()
        try:
            return original(*args, **kwargs)
        finally:
            EVENTS.append((label, begin, time.monotonic_ns()))

    wrapper.recorded = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)


def instrument() -> None:
    for module, attribute, label in STEPS:
        owner: Any = importlib.import_module(module)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        record(owner, name, label)


class Profiled(hwplace.Worker):
    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}
        self.into: dict[str, torch.Tensor] = {}

    def prepare(self, megabytes: int) -> None:
        instrument()
        self.state = {f"layer{i}.weight": torch.full((megabytes * MB // 16,), float(i)) for i in range(4)}
        self.into = {k: torch.empty_like(v) for k, v in self.state.items()}

    def publish(self, sync: hwplace.WeightSync) -> int:
        EVENTS.append(("call arrives", time.monotonic_ns(), 0))
        return sync.publish(self.state)

    def cpu(self) -> float:
        """Seconds of CPU this process has used, all its threads."""
        return time.process_time()

    def wait_version(self, sync: hwplace.WeightSync, version: int) -> float:
        EVENTS.append(("call arrives", time.monotonic_ns(), 0))
        weights = sync.latest(min_version=version, timeout=300)
        value = float(weights.tensors["layer3.weight"][-1])
        EVENTS.append(("latest() returned", time.monotonic_ns(), 0))
        return value

    def floor(self) -> tuple[float, float]:
        """Seconds of one copy of the state dict (``copy_`` into tensors made before) and of one read of it."""
        begin = time.perf_counter()
        for name, tensor in self.state.items():
            self.into[name].copy_(tensor)
        middle = time.perf_counter()
        for tensor in self.into.values():
            tensor.sum()
        return middle - begin, time.perf_counter() - middle

    def events(self) -> list[tuple[str, int, int]]:
        out = list(EVENTS)
        EVENTS.clear()
        return out


def show(start: int, rows: dict[str, list[tuple[str, int, int]]]) -> None:
    for who, events in rows.items():
        for label, begin, end in sorted(events, key=lambda e: e[1]):
            if begin < start:
                continue  # a receive posted before this round
            took = f"  took {(end - begin) / 1e6:6.2f} ms" if end else ""
            print(f"  {who:>9}  {label:<20} at {(begin - start) / 1e6:7.2f} ms{took}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    os.environ["RAY_preallocate_plasma_memory"] = "1"  # noqa: SIM112 (Ray spells it so)
    with local_ray_cluster(num_nodes=1):
        cluster = hwplace.Cluster({"num_nodes": 1})
        trainer = Profiled.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="trainer")
        rollout = Profiled.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 0]), name="rollout")
        sync = hwplace.WeightSync.create("profiled", source="trainer", targets=("rollout",))
        for group in (trainer, rollout):
            group.prepare(args.megabytes).wait(timeout=120)
        totals, copies, reads, writes, tails, cpus = [], [], [], [], [], []
        marks: dict[str, list[float]] = {}  # per round, when each milestone came (ms after the driver's start)
        for version in range(1, args.rounds + 2):  # the first round makes the segments and is not counted
            [(copy, read)] = trainer.floor().wait(timeout=120)
            used = [*trainer.cpu().wait(timeout=60), *rollout.cpu().wait(timeout=60)]
            start = time.monotonic_ns()
            published = trainer.publish(sync)  # the source's call first, as in rl_transfer.py
            waiting = rollout.wait_version(sync, version)
            published.wait(timeout=300)
            waiting.wait(timeout=300)
            took = (time.monotonic_ns() - start) / 1e6
            used = [b - a for a, b in zip(used, [*trainer.cpu().wait(timeout=60), *rollout.cpu().wait(timeout=60)],
                                          strict=True)]
            [source] = trainer.events().wait(timeout=60)
            targets = rollout.events().wait(timeout=60)
            if version == 1:
                continue
            written = [e for e in source if e[0] == "copy+hash bucket" and e[1] >= start]
            returned = [e[1] for rows in targets for e in rows if e[0] == "latest() returned"]
            if written and returned:
                writes.append((max(e[2] for e in written) - min(e[1] for e in written)) / 1e6)
                tails.append((max(returned) - max(e[2] for e in written)) / 1e6)
                arrived = [e[1] for e in source if e[0] == "call arrives" and e[1] >= start]
                for mark, at in (("source's call arrives", min(arrived, default=start)),
                                 ("copy begins", min(e[1] for e in written)),
                                 ("copy ends", max(e[2] for e in written)),
                                 ("first latest() returns", min(returned)), ("last latest() returns", max(returned)),
                                 ("driver has both", start + int(took * 1e6))):
                    marks.setdefault(mark, []).append((at - start) / 1e6)
            totals.append(took)
            cpus.append(sum(used) * 1e3)
            copies.append(copy * 1e3)
            reads.append(read * 1e3)
            if version in (2, args.rounds + 1):
                print(f"round {version - 1}: {took:.2f} ms end to end (driver), one copy {copy * 1e3:.2f} ms, "
                      f"one read {read * 1e3:.2f} ms")
                show(start, {"source": source, **{f"rollout {i}": e for i, e in enumerate(targets)}})
        total, copy, read = (statistics.median(x) for x in (totals, copies, reads))
        print(f"medians of {args.rounds}: sync {total:.2f} ms, one copy {copy:.2f} ms ({total / copy:.2f}x), "
              f"copy + read {copy + read:.2f} ms ({total / (copy + read):.2f}x); load {os.getloadavg()[0]:.1f}")
        print(f"  CPU time of the three processes (every thread, calls included) {statistics.median(cpus):.2f} ms")
        if writes:
            print(f"  the source's copy-and-hash of the version {statistics.median(writes):.2f} ms; from its end to "
                  f"the last target's latest() returning {statistics.median(tails):.2f} ms")
            print("  medians of each milestone, ms after the driver's start: " +
                  ", ".join(f"{mark} {statistics.median(at):.2f}" for mark, at in marks.items()))


if __name__ == "__main__":
    main()
