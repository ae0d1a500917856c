"""Same-node weight sync against one memcpy, with no Ray: for machines without it (the GPU machine).

hwplace's process executor (``hwplace.testing.process_cluster``) on one node: a trainer and two rollout ranks, a
state dict of four float32 tensors. Per size, the median of ``--repeat`` rounds (after one to warm up) of:
- the sync in the workers: from the start of the trainer's ``publish`` to the last rank's read of a value of the
  version (``latest()`` returned), on the node's one ``CLOCK_MONOTONIC``;
- the sync from the driver: the same calls started and waited for by the driver;
- one ``copy_`` of the state dict into tensors made before, timed in the trainer (the floor: a same-node sync
  needs one write by the source and an in-place read by each target), in the same run, taking turns.
``benchmarks/rl_transfer.py --parts one-node`` is the same on a Ray cluster, with Ray's baselines beside it; both
time the worker class of ``benchmarks/sync_sides.py``.

With ``--colocated``, the trainer and one rollout rank share accelerator 0 of the node: on a GPU machine (its own
accelerators, detected through NVML) the state dict lies on the GPU and the sync is ``same-device`` (CUDA IPC), the
floor one device-to-device ``copy_``; elsewhere (fake accelerators, CPU tensors) it runs as a dry run.

Run: python benchmarks/sync_memcpy.py [--sizes 1,100] [--repeat 7] [--threads 1] [--colocated]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_checks import harness  # after this directory is on the path

harness.importable()  # this checkout's hwplace, installed or not (the GPU machine has no install)

import torch  # noqa: E402
from sync_sides import SyncSide  # noqa: E402 (this folder, on the path above; the workers find it there too)

import hwplace  # noqa: E402
from hwplace.testing import process_cluster  # noqa: E402

STEPS = [  # what --profile times in each worker: (module, attribute)
    ("hwplace.runtime.weight_sync.sync", "WeightSync.publish"),
    ("hwplace.runtime.weight_sync.sync", "WeightSync.latest"),
    ("hwplace.runtime.weight_sync.source", "pack"),
    ("hwplace.runtime.weight_sync.source", "deliver"),
    ("hwplace.runtime.weight_sync.transports", "check"),
    ("hwplace.runtime.weight_sync.segments", "_copy_hashed"),
    ("hwplace.runtime.weight_sync.device_ring", "RingWriter.write"),
    ("hwplace.runtime.weight_sync.device_ring", "RingWriter._fill"),
    ("hwplace.runtime.weight_sync.device_ring", "RingWriter._bucket"),
    ("hwplace.runtime.weight_sync.device_ring", "device_digest"),
    ("hwplace.runtime.weight_sync.device_ring", "digest"),
    ("hwplace.runtime.weight_sync.device_ring", "RingReader.read"),
    ("hwplace.runtime.weight_sync.device_ring", "RingReader._mapping"),
    ("hwplace.runtime.weight_sync.links", "frames"),
    ("hwplace.runtime.weight_sync.receiver", "recv_pickle"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100", help="state dict sizes in MB, comma-separated")
    parser.add_argument("--repeat", type=int, default=7, help="rounds per size (one more warms up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each worker (its copy_'s)")
    parser.add_argument("--colocated", action="store_true", help="the trainer and one rollout rank on accelerator 0 "
                                                                   "(a GPU where there is one)")
    parser.add_argument("--profile", action="store_true", help="time the sync's steps in each worker too (the "
                                                                 "medians per size, ms, after the table's row)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    cuda = args.colocated and torch.cuda.is_available()
    shape: dict[str, Any] = {"inherit_env": True} if cuda else {"num_nodes": 1, "accelerators_per_node": 1}
    with process_cluster(**shape) as cluster:
        packed = hwplace.PackedPlacementStrategy(0, 0)  # accelerator 0 of node 0, for each group
        places = {"trainer": packed, "rollout": packed} if args.colocated else \
            {"trainer": hwplace.NodePlacementStrategy([0]), "rollout": hwplace.NodePlacementStrategy([0, 0])}
        trainer = SyncSide.create_group(args.threads, cuda).launch(cluster, places["trainer"], name="trainer")
        rollout = SyncSide.create_group(args.threads, cuda).launch(cluster, places["rollout"], name="rollout")
        try:
            sync = hwplace.WeightSync.create("bench", source="trainer", targets=("rollout",), cluster=cluster)
            transports = ", ".join(t.transport for t in sync.plan)
            where = torch.cuda.get_device_name(0) if cuda else f"{os.cpu_count()} CPUs"
            print(f"weight sync on one node, process executor, {where}, torch {torch.__version__}: "
                  f"{transports}; median of {args.repeat}, ms")
            print(f"  {'MB':>4}  {'memcpy':>8}  {'in workers':>10}  {'/memcpy':>7}  {'driver':>8}  {'/memcpy':>7}")
            if args.profile:
                for group in (trainer, rollout):
                    group.profile(STEPS).wait(timeout=60)
            version = 0
            for megabytes in sizes:
                threads = trainer.prepare(megabytes).wait(timeout=120)[0]
                rollout.prepare(megabytes).wait(timeout=120)
                runs: dict[str, list[float]] = {"memcpy": [], "inside": [], "driver": []}
                for attempt in range(args.repeat + 1):
                    for part in ("memcpy", "sync") if attempt % 2 else ("sync", "memcpy"):
                        if part == "memcpy":
                            [seconds] = trainer.memcpy(megabytes).wait(timeout=120)
                            runs["memcpy"].append(seconds)
                            continue
                        version += 1
                        start = time.perf_counter()
                        waiting = rollout.wait_version(sync, version)
                        [begin] = trainer.publish(sync, megabytes).wait(timeout=300)
                        ends = [end for _, end in waiting.wait(timeout=300)]
                        runs["driver"].append(time.perf_counter() - start)
                        runs["inside"].append(max(ends) - begin)
                    if not attempt:
                        runs = {k: [] for k in runs}  # the first round warms up
                memcpy, inside, driver = (statistics.median(runs[k]) * 1e3 for k in ("memcpy", "inside", "driver"))
                print(f"  {megabytes:>4}  {memcpy:>8.2f}  {inside:>10.2f}  {inside / memcpy:>7.2f}  {driver:>8.2f}  "
                      f"{driver / memcpy:>7.2f}   (torch threads {threads})")
                if args.profile:
                    for who, timings in (("trainer", trainer.timings()), ("rollout", rollout.timings())):
                        for rank, steps in enumerate(timings.wait(timeout=60)):
                            print(f"        {who} {rank}: " + ", ".join(f"{label} {count}x {ms:.3f}"
                                                                     for label, (count, ms) in steps.items()))
        finally:
            rollout.shutdown()
            trainer.shutdown()


if __name__ == "__main__":
    main()
