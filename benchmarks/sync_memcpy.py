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

Run: python benchmarks/sync_memcpy.py [--sizes 1,100] [--repeat 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_checks import harness  # after this directory is on the path

harness.importable()  # this checkout's hwplace, installed or not (the GPU machine has no install)

import torch  # noqa: E402
from sync_sides import SyncSide  # noqa: E402 (this folder, on the path above; the workers find it there too)

import hwplace  # noqa: E402
from hwplace.testing import process_cluster  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100", help="state dict sizes in MB, comma-separated")
    parser.add_argument("--repeat", type=int, default=7, help="rounds per size (one more warms up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each worker (its copy_'s)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with process_cluster(num_nodes=1) as cluster:
        trainer = SyncSide.create_group(args.threads).launch(cluster, hwplace.NodePlacementStrategy([0]),
                                                             name="trainer")
        rollout = SyncSide.create_group(args.threads).launch(cluster, hwplace.NodePlacementStrategy([0, 0]),
                                                             name="rollout")
        try:
            sync = hwplace.WeightSync.create("bench", source="trainer", targets=("rollout",), cluster=cluster)
            transports = ", ".join(t.transport for t in sync.plan)
            print(f"same-node weight sync, process executor, {os.cpu_count()} CPUs, torch {torch.__version__}: "
                  f"{transports}; median of {args.repeat}, ms")
            print(f"  {'MB':>4}  {'memcpy':>8}  {'in workers':>10}  {'/memcpy':>7}  {'driver':>8}  {'/memcpy':>7}")
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
        finally:
            rollout.shutdown()
            trainer.shutdown()


if __name__ == "__main__":
    main()
