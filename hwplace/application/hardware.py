"""``hwplace hardware``: what every registered backend detects on this node, and the executors there are.

With ``--config``, the devices the config declares for one node (``--node-rank``, else ``HWPLACE_NODE_RANK``)
are detected too. Imports the layers below and :mod:`hwplace.application.report` (its tables).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping
from typing import Any, TextIO

from hwplace.application.report import table
from hwplace.config.job_config import parse_job_config
from hwplace.contracts.hardware import Device
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.settings import NODE_RANK, read_node_rank
from hwplace.foundation.wording import ranks_text, safe_repr
from hwplace.inventory.detection import detect_node_hardware
from hwplace.plugin.manager import PluginManager
from hwplace.plugin.session import get_plugin_manager


def _node_rank(args: argparse.Namespace, num_nodes: int) -> int:
    raw = args.node_rank if args.node_rank is not None else (read_node_rank() or "0")
    where = "--node-rank" if args.node_rank is not None else NODE_RANK
    if not (str(raw).isascii() and str(raw).isdigit() and len(str(raw)) <= 7 and int(raw) < num_nodes):
        raise ConfigError(where, f"{str(raw)[:20]!r} is not a node rank of this config",
                          allowed=f"0 to {num_nodes - 1} (cluster.num_nodes is {num_nodes})")
    return int(raw)


IDENTITY_KEYS = ("uuid", "physical_id", "port", "url", "name", "hostname")
"""Device properties that say which device it is, shown first by ``hwplace hardware``."""


def _device_row(device: Device) -> list[str]:
    identity = [f"{k}={device.properties[k]}" for k in IDENTITY_KEYS if k in device.properties]
    details = [f"{k}={v}" for k, v in device.properties.items() if k not in IDENTITY_KEYS]
    health = "healthy" if device.healthy else f"UNHEALTHY: {device.reason}"
    return [str(device.index), device.model, health, " ".join(identity) or "-", " ".join(details)]


def _why_none(manager: PluginManager, name: str, declared: Mapping[str, Any], args: argparse.Namespace,
              node_rank: int) -> str | None:
    """The reason a backend gave for finding nothing here (``NoDevices``), from the cached detection."""
    if manager.backends()[name].kind == "device" and name not in declared:
        if args.config is not None:
            return f"{args.config} declares no {name} devices for node {node_rank} (hardware.configs)"
        return "its devices are declared in a config's hardware.configs: add --config job.yaml"
    return manager.detect(name, declared.get(name, ())).absent


def hardware_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``hwplace hardware [--config F] [--node-rank N] [--json]``: a table per backend, its devices, and notes."""
    manager = get_plugin_manager()
    declared: dict[str, list[Mapping[str, Any]]] = {}
    elsewhere: list[int] = []
    node_rank = 0
    if args.config is not None:
        config = parse_job_config(args.config, plugin_manager=manager).cluster
        node_rank = _node_rank(args, config.num_nodes)
        declared = config.declared_configs(node_rank)
        elsewhere = [r for r in range(config.num_nodes) if r != node_rank and config.declared_configs(r)]
    elif args.node_rank is not None:
        raise ConfigError("--node-rank", "needs --config: it picks which node's declared devices to detect")
    found, problems = detect_node_hardware(declared, manager=manager)
    backends = manager.backends()
    executors = manager.executors()
    absent = {name: why for name in backends if not found.get(name) and name not in problems
              and (why := _why_none(manager, name, declared, args, node_rank))}
    notes = []
    if args.config is not None:
        notes.append(f"devices {args.config} declares for node {node_rank} were detected here"
                     if declared else f"{args.config} declares no devices for node {node_rank}")
        if elsewhere:
            notes.append(f"it also declares devices for {ranks_text(elsewhere)}: run this there with --node-rank "
                         "(or HWPLACE_NODE_RANK) to check them")
    if args.json:
        json.dump({
            "node_rank": node_rank,
            "backends": [{"name": b.name, "kind": b.kind, "plugin": b.plugin, "distribution": b.distribution,
                          "devices": [dataclasses.asdict(d) for d in found.get(b.name, ())],
                          "problem": problems.get(b.name), "why_none": absent.get(b.name)}
                         for b in sorted(backends.values(), key=lambda b: b.name)],
            "executors": [{"name": name, "plugin": e.plugin, "distribution": e.distribution}
                          for name, e in executors.items()],
            "problems": [f"{what}: {why}" for what, why in problems.items()],
            "notes": notes,
        }, out, indent=2, default=safe_repr)
        out.write("\n")
        return 0
    rows = [["backend", "kind", "plugin", "distribution", "devices here"]]
    rows += [[b.name, b.kind, b.plugin, b.distribution,
              f"0: {absent[b.name]}" if b.name in absent else str(len(found.get(b.name, ())))]
             for b in sorted(backends.values(), key=lambda b: b.name)]
    table(rows, out)
    out.write("\n")
    table([["executor", "plugin", "distribution"]]
           + [[name, e.plugin, e.distribution] for name, e in executors.items()], out)
    for name, devices in found.items():
        out.write(f"\n{name}:\n")
        table([["index", "model", "health", "identity", "details"]] + [_device_row(d) for d in devices], out)
    for note in notes:
        out.write(f"\nnote: {note}\n")
    for what, why in problems.items():
        err.write(f"hwplace: warning: {what}: {why}\n")
    return 0
