"""The ``hwplace`` command: ``plan`` a config without launching anything, list ``hardware``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from hwplace import __version__
from hwplace.cluster import Cluster, detect_node_hardware
from hwplace.component import ComponentPlacement
from hwplace.config import cluster_section, parse_cluster_config
from hwplace.errors import ConfigError, HwplaceError, PlacementError
from hwplace.loading import load_config
from hwplace.plugin_manager import get_plugin_manager
from hwplace.testing import fake_cluster

EXIT_ERROR = 2
_NODES_ITEM = re.compile(r"^(?:([0-9]+)x)?([0-9]+)$")


def parse_nodes(spec: str) -> list[int]:
    """``--nodes``: ``4x8`` (4 nodes of 8 accelerators), ``2x8,1x4``, or ``8,8,4`` (one count per node)."""
    counts: list[int] = []
    for item in spec.replace(" ", "").split(","):
        match = _NODES_ITEM.match(item)
        if match is None:
            raise ConfigError("--nodes", f"{item!r} is not a node count",
                              allowed="NODESxACCELERATORS such as 4x8, or accelerators per node such as 8,8,4")
        repeat = int(match.group(1) or 1)
        if repeat == 0:
            raise ConfigError("--nodes", f"{item!r} has no nodes")
        counts += [int(match.group(2))] * repeat
    return counts


def _hardware_cell(placement: Any) -> str:
    return f"{placement.hardware_type} {','.join(map(str, placement.local_hardware_ranks))}"


def _env_cell(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "-"


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")


def _print_plan(plan: ComponentPlacement, out: TextIO) -> None:
    for name in plan.components:
        spec = plan.spec(name)
        placements = plan.get_placements(name)
        out.write(f"{name}: {len(placements)} process(es) on group {'+'.join(spec.node_groups)}, "
                  f"placement {spec.placement!r}\n")
        rows = [["rank", "node", "local", "hardware", "env"]]
        rows += [[str(p.rank), f"{p.node_rank} ({p.node_id})", f"{p.local_rank}/{p.local_world_size}",
                  _hardware_cell(p), _env_cell(p.env)] for p in placements]
        _table(rows, out)
        out.write("\n")


def _plan_json(plan: ComponentPlacement) -> dict[str, Any]:
    return {
        "nodes": [{"rank": n.rank, "node_id": n.node_id, "address": n.address,
                   "hardware": {t: len(d) for t, d in n.hardware.items()}} for n in plan.cluster.nodes],
        "components": {
            name: {
                "node_groups": list(plan.spec(name).node_groups),
                "placement": plan.spec(name).placement,
                "world_size": plan.get_world_size(name),
                "placements": [dataclasses.asdict(p) for p in plan.get_placements(name)],
            }
            for name in plan.components
        },
    }


def _show_error(error: HwplaceError, err: TextIO) -> None:
    err.write(f"hwplace: error: {error}\n")
    if isinstance(error, PlacementError) and error.text is not None and error.span is not None:
        start, end = error.span
        prefix = f"    {error.component or 'placement'}: "
        err.write(f"{prefix}{error.text}\n")
        err.write(" " * (len(prefix) + start) + "^" * max(end - start, 1) + "\n")


def _plan(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    config = load_config(args.config)
    section = cluster_section(config)
    if args.nodes is not None:
        counts = parse_nodes(args.nodes)
        cluster = fake_cluster(section, num_nodes=len(counts), accelerators_per_node=counts)
    else:
        cluster = Cluster(section)
    for problem in cluster.problems:
        err.write(f"hwplace: warning: {problem}\n")
    plan = ComponentPlacement(config, cluster)
    if args.json:
        json.dump(_plan_json(plan), out, indent=2)
        out.write("\n")
    else:
        _print_plan(plan, out)
    return 0


def _hardware(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    manager = get_plugin_manager()
    declared = {}
    if args.config is not None:
        declared = parse_cluster_config(cluster_section(load_config(args.config))).declared_configs(args.node_rank)
    found, problems = detect_node_hardware(declared)
    backends = manager.backends()
    if args.json:
        json.dump({
            "backends": [{"name": b.name, "kind": b.kind, "plugin": b.plugin, "distribution": b.distribution,
                          "devices": [dataclasses.asdict(d) for d in found.get(b.name, ())]}
                         for b in backends.values()],
            "problems": list(problems),
        }, out, indent=2, default=str)
        out.write("\n")
        return 0
    rows = [["backend", "kind", "plugin", "distribution", "devices here"]]
    rows += [[b.name, b.kind, b.plugin, b.distribution, str(len(found.get(b.name, ())))] for b in backends.values()]
    _table(rows, out)
    for name, devices in found.items():
        out.write(f"\n{name}:\n")
        for d in devices:
            health = "healthy" if d.healthy else f"UNHEALTHY: {d.reason}"
            props = " ".join(f"{k}={v}" for k, v in d.properties.items())
            out.write(f"  {d.index}  {d.model}  {health}  {props}\n".rstrip() + "\n")
    for problem in problems:
        err.write(f"hwplace: warning: {problem}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hwplace", description="Place a distributed job's processes on hardware.")
    parser.add_argument("--version", action="version", version=f"hwplace {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="resolve every component of a config without launching anything")
    plan.add_argument("config", help="YAML file with a cluster: section")
    plan.add_argument("--nodes", help="plan on a declared inventory of fake accelerators instead of this "
                      "machine: 4x8 (4 nodes of 8), 2x8,1x4, or 8,8,4")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(run=_plan)
    hardware = commands.add_parser("hardware", help="list the registered backends and what they detect here")
    hardware.add_argument("--config", help="also detect the devices this config declares for this node")
    hardware.add_argument("--node-rank", type=int, default=0, help="which node's declared devices (default 0)")
    hardware.add_argument("--json", action="store_true", help="print as JSON")
    hardware.set_defaults(run=_hardware)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the command line; returns the exit code (2 for a configuration or placement error)."""
    out, err = out or sys.stdout, err or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args, out, err)
    except HwplaceError as error:
        _show_error(error, err)
        return EXIT_ERROR
    except BrokenPipeError:  # the reader went away (`hwplace plan ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code
