"""Weight sync to other nodes through their relays, on an emulated network, against the link model's prediction.

One local Ray cluster of ``--nodes`` nodes (``hwplace.testing.local_ray_cluster``) whose links between nodes are
hwplace's own emulator (``HWPLACE_LINK_BANDWIDTH``: a token bucket per node pair, ``--bandwidth`` bytes per second,
so the bandwidth, not the loopback, decides). The trainer's rank 0 on node 0 publishes a state dict of ``--mb``
MB (four float32 tensors); ``R`` rollout ranks on each other node (``--ranks``, one row each) wait for that version
with ``latest(min_version=v)`` and read a value of it. For each row:

- bytes leaving the source's node per publish (counted by the source, all node pairs together) and per node pair,
  against the version's size: with a relay on each node, once per node whatever R (each rank its own copy would be
  R times);
- the time from the start of ``publish`` until every rank has the version (median of ``--repeat``; the first
  round warms up and is not counted), against the link model's prediction: the most bytes on one node pair over
  the bandwidth (the pairs send side by side), and against what per-rank copies would take (R times that).

Run: python benchmarks/relay_sync.py [--nodes 4] [--ranks 1,2,3] [--mb 64] [--bandwidth 100MB] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import hwplace
from hwplace.foundation.settings import LINK_BANDWIDTH
from hwplace.foundation.sizes import parse_size
from hwplace.runtime.weight_sync.link_model import traffic
from hwplace.testing import local_ray_cluster

MB = 10**6


class Bench(hwplace.Worker):
    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}

    def prepare(self, megabytes: int) -> None:
        count = megabytes * MB // 16
        self.state = {f"layer{i}.weight": torch.full((count,), float(i)) for i in range(4)}

    def publish(self, sync: hwplace.WeightSync, version: int) -> int:
        self.state["layer3.weight"][-1] = float(version)
        return sync.publish(self.state)

    def sent(self) -> dict[tuple[int, int], int]:
        return dict(traffic().sent)

    def wait_version(self, sync: hwplace.WeightSync, version: int) -> int:
        weights = sync.latest(min_version=version, timeout=600)
        return int(float(weights.tensors["layer3.weight"][-1]))


def row(cluster: hwplace.Cluster, nodes: int, ranks: int, megabytes: int, rate: int, repeat: int) -> None:
    targets = [node for node in range(1, nodes) for _ in range(ranks)]
    trainer = Bench.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name=f"trainer{ranks}")
    rollout = Bench.create_group().launch(cluster, hwplace.NodePlacementStrategy(targets), name=f"rollout{ranks}")
    try:
        trainer.prepare(megabytes).wait(timeout=120)
        sync = hwplace.WeightSync.create(f"relay{ranks}", source=f"trainer{ranks}", targets=(f"rollout{ranks}",))
        relays = sorted({f"{t.relay[0]} {t.relay[1]} (node {t.node})" for t in sync.plan if t.relay is not None})
        times, per_publish = [], []
        for version in range(1, repeat + 2):  # the first round warms every path up and is not counted
            [before] = trainer.sent().wait(timeout=60)
            begin = time.perf_counter()
            waiting = rollout.wait_version(sync, version)
            trainer.publish(sync, version).wait(timeout=600)
            assert waiting.wait(timeout=600) == [version] * len(targets)
            seconds = time.perf_counter() - begin
            [after] = trainer.sent().wait(timeout=60)
            if version > 1:
                times.append(seconds)
                per_publish.append({pair: after[pair] - before.get(pair, 0) for pair in after})
        sent = {pair: statistics.median(p.get(pair, 0) for p in per_publish) for pair in per_publish[0]}
        total, busiest = sum(sent.values()), max(sent.values())
        model = megabytes * MB
        predicted = busiest / rate
        measured = statistics.median(times)
        print(f"  {ranks:>5}  {len(targets):>5}  {total / MB:>10.1f}  {total / model:>8.2f}  {busiest / model:>8.2f}  "
              f"{measured:>8.3f}  {predicted:>9.3f}  {measured / predicted:>6.2f}  {ranks * predicted:>10.3f}")
        print(f"         relays: {', '.join(relays)}")
    finally:
        trainer.shutdown()
        rollout.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--ranks", default="1,2,3", help="rollout ranks per node other than the source's, per row")
    parser.add_argument("--mb", type=int, default=64, help="the state dict's size in MB")
    parser.add_argument("--bandwidth", default="100MB", help="bytes per second per node pair (100MB: 100 MB/s)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rate = parse_size(args.bandwidth, "--bandwidth")
    with local_ray_cluster(args.nodes, cpus_per_node=4, env_vars={LINK_BANDWIDTH: str(rate)}):
        cluster = hwplace.Cluster({"num_nodes": args.nodes})
        print(f"weight sync of {args.mb} MB from node 0 to {args.nodes - 1} other nodes, links of {rate / MB:g} MB/s "
              f"per node pair (emulated); median of {args.repeat}")
        print(f"  {'ranks':>5}  {'total':>5}  {'MB sent':>10}  {'x model':>8}  {'per pair':>8}  {'time s':>8}  "
              f"{'model s':>9}  {'ratio':>6}  {'per-rank s':>10}")
        for ranks in (int(r) for r in args.ranks.split(",")):
            row(cluster, args.nodes, ranks, args.mb, rate, args.repeat)
        print("  ranks: per other node; MB sent: bytes leaving the source's node per publish; x model: that over the "
              "state dict's size;\n  per pair: the most on one node pair over the size; time: publish until every "
              "rank has it; model: the link\n  model's prediction (the busiest pair's bytes over the bandwidth); "
              "ratio: time over model; per-rank: the model's\n  time if the source sent each rank its own copy")


if __name__ == "__main__":
    main()
