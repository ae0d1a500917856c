"""Variants of the same-node weight sync taking turns round by round in one cluster: which is faster, on a noisy
machine.

Two runs of ``benchmarks/rl_transfer.py`` minutes apart differ by 10 to 20 % on the 2-core machine, as much as most
changes to the sync are worth. Here every variant runs in the same Ray cluster, on the same workers (a trainer and
two rollout ranks on one node, as in ``rl_transfer.py --parts one-node``), its rounds alternating with the others'
(in the order A B B A ...), so that what changes the machine's speed falls on all of them alike. A variant sets
module attributes in every worker before its round (``--variant NAME=module:attribute=value,...``, a value any
Python literal); an attribute a variant leaves out keeps the value it was found with. Per variant, medians of:
- the sync from the driver (both calls started and waited for by it), and in the workers (from the start of the
  trainer's ``publish`` to the last rank's read of a value of the version);
- one ``copy_`` of the state dict in the trainer before each round (the floor), and the ratios to it;
- how long the publish call took to begin in the trainer after the driver started it, and how long the driver took
  to have both results after the last rank's read.

Run: python benchmarks/sync_ab.py --variant NAME=module:attribute=value[,...] [--variant ...] [--rounds 20]
         [--megabytes 100]
e.g. --variant chunk=hwplace.runtime.weight_sync.pieces:CHUNK=262144
     --variant piece=hwplace.runtime.weight_sync.pieces:CHUNK=1048576
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sync_sides import FOUND, SyncSide  # this folder, on the path above; the workers find it there too

import hwplace
from hwplace.testing import local_ray_cluster

ROWS = ("driver", "workers", "memcpy", "begins", "returns")


def variant(text: str) -> tuple[str, list[tuple[str, str, Any]]]:
    """``NAME=module:attribute=value,...`` as its name and its changes."""
    name, _, changes = text.partition("=")
    parsed = []
    for change in filter(None, changes.split(",")):
        where, _, value = change.partition("=")
        module, _, attribute = where.partition(":")
        if not (module and attribute and value):
            raise SystemExit(f"--variant {text!r}: {change!r} is not module:attribute=value")
        try:
            parsed.append((module, attribute, ast.literal_eval(value)))
        except (ValueError, SyntaxError):
            raise SystemExit(f"--variant {text!r}: {value!r} is not a Python literal (a number, a string in "
                             "quotes, True, None, a tuple ...)") from None
    if not name:
        raise SystemExit(f"--variant {text!r} has no name before '='")
    return name, parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", default=[], help="NAME=module:attribute=value[,...]")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds of each variant")
    parser.add_argument("--megabytes", type=int, default=100)
    args = parser.parse_args()
    variants = dict(variant(text) for text in args.variant) or {"as found": []}
    names = list(variants)
    touched = {(m, a) for changes in variants.values() for m, a, _ in changes}
    os.environ["RAY_preallocate_plasma_memory"] = "1"  # noqa: SIM112 (Ray spells it so)
    with local_ray_cluster(num_nodes=1):
        cluster = hwplace.Cluster({"num_nodes": 1})
        trainer = SyncSide.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="trainer")
        rollout = SyncSide.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 0]), name="rollout")
        sync = hwplace.WeightSync.create("ab", source="trainer", targets=("rollout",))
        for group in (trainer, rollout):
            group.prepare(args.megabytes).wait(timeout=120)
        runs: dict[str, dict[str, list[float]]] = {n: {row: [] for row in ROWS} for n in names}
        order = [*names, *reversed(names)]
        for version in range(1, 2 * len(names) + args.rounds * len(names) + 1):  # the first turn warms up
            name = order[(version - 1) % len(order)]
            changes = [(m, a, FOUND) for m, a in sorted(touched)] + variants[name]
            for group in (trainer, rollout):
                group.setting(changes).wait(timeout=60)
            [floor] = trainer.memcpy(args.megabytes).wait(timeout=120)
            start = time.monotonic()
            published = trainer.publish(sync, args.megabytes)  # the source's call first, as in rl_transfer.py
            waited = rollout.wait_version(sync, version)
            [begin], reads = published.wait(timeout=300), waited.wait(timeout=300)
            took = time.monotonic() - start
            if version > 2 * len(names):
                last = max(end for _, end in reads)
                for row, seconds in zip(ROWS, (took, last - begin, floor, begin - start, start + took - last),
                                        strict=True):
                    runs[name][row].append(seconds * 1e3)
        print(f"same-node weight sync of {args.megabytes} MB to two rollout ranks, {args.rounds} rounds a variant "
              f"taking turns; medians, ms")
        print(f"  {'variant':<14} {'driver':>8} {'/memcpy':>8} {'workers':>8} {'/memcpy':>8} {'memcpy':>8} "
              f"{'call begins':>12} {'results back':>13}")
        for name in names:
            m = {row: statistics.median(values) for row, values in runs[name].items()}
            print(f"  {name:<14} {m['driver']:>8.2f} {m['driver'] / m['memcpy']:>8.2f} {m['workers']:>8.2f} "
                  f"{m['workers'] / m['memcpy']:>8.2f} {m['memcpy']:>8.2f} {m['begins']:>12.2f} {m['returns']:>13.2f}")
        print(f"  load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
