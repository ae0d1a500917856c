"""Plan reports: the tables ``hwplace plan`` and ``hwplace run`` print, and the plan as JSON.

Imports the layers below; the CLI and the job runner both use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from hwplace.config.weight_sync import SyncSpec
from hwplace.contracts.records import Placement
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.sizes import format_size
from hwplace.foundation.wording import plural
from hwplace.inventory.cluster import Cluster
from hwplace.planning.component import ComponentPlacement
from hwplace.planning.memory import DeviceMemory
from hwplace.planning.sharing import shared_accelerators
from hwplace.planning.sync_plan import SAME_DEVICE, SyncPlan, SyncTarget, ring_bucket_bytes, sync_plan

SyncPlans = list[tuple[SyncSpec, int, SyncPlan]]  # each sync, its source's node, its plan


def _hardware_cell(placement: Placement) -> str:
    return f"{placement.hardware_type} {','.join(map(str, placement.local_hardware_ranks))}"


def _env_cell(env: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "-"


def table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")


def print_cluster(cluster: Cluster, out: TextIO) -> None:
    """``cluster: Ray cluster at 10.0.0.1:6379, 2 nodes: 0 10.0.0.1 (0123456789ab), 1 10.0.0.2 (...)``."""
    nodes = ", ".join(f"{n.rank} {n.address} ({n.node_id[:12]})" for n in cluster.nodes)
    out.write(f"cluster: {cluster.executor().where()}, {plural(cluster.num_nodes, 'node')}: {nodes}\n\n")


def group_settings(plan: ComponentPlacement, placement: Placement) -> tuple[dict[str, str], str | None]:
    """The env_vars and interpreter that a placement's node group sets on its node."""
    group = plan.config.group(placement.node_group)
    return group.env_vars(placement.node_rank), group.python_interpreter_path(placement.node_rank)


def print_plan(plan: ComponentPlacement, out: TextIO) -> None:
    """One table per component: rank, node, local rank, hardware, isolation env, group settings; then the
    accelerators it shares with other components (they take turns: ``Worker.turn``); then, when the job has a
    ``resources:`` section, each accelerator's peak memory (:func:`print_memory`)."""
    shares = shared_accelerators({name: plan.get_placements(name) for name in plan.components})
    for name in plan.components:
        spec = plan.spec(name)
        placements = plan.get_placements(name)
        policy = plan.job.restart.get(name)
        restarts = f", restarts in place: {policy.describe()}" if policy is not None else ""
        out.write(f"{name}: {plural(len(placements), 'process', 'processes')} on group "
                  f"{'+'.join(spec.node_groups)}, placement {spec.placement!r}{restarts}\n")
        settings = [group_settings(plan, p) for p in placements]
        show_env = any(env for env, _ in settings)
        show_python = any(python for _, python in settings)
        header = ["rank", "node", "local", "hardware", "isolation env"]
        header += ["group env"] * show_env + ["python"] * show_python
        rows = [header]
        for p, (env, python) in zip(placements, settings, strict=True):
            row = [str(p.rank), f"{p.node_rank} ({p.node_id[:12]})", f"{p.local_rank}/{p.local_world_size}",
                   _hardware_cell(p), _env_cell(p.env)]
            rows.append(row + [_env_cell(env)] * show_env + [python or "-"] * show_python)
        table(rows, out)
        for p in placements:
            for share in shares.get((name, p.rank), ()):
                out.write(f"  rank {p.rank} {share}\n")
        out.write("\n")
    if plan.job.resources:
        print_memory(plan.memory, out)


def _memory_note(device: DeviceMemory) -> str:
    notes = [device.breakdown()]
    if device.capacity is None:
        notes.append("capacity unknown: not checked")
    if device.undeclared:
        notes.append(f"not in resources: {', '.join(device.undeclared)}")
    return "; ".join(notes)


def print_memory(devices: Sequence[DeviceMemory], out: TextIO) -> None:
    """Each accelerator's capacity, peak and headroom, and who holds what at its peak (SPEC §13)."""
    out.write("memory per accelerator (resources:): the peak, when the component named first works\n")
    rows = [["device", "capacity", "peak", "headroom", "at the peak"]]
    for device in devices:
        rows.append([device.device, format_size(device.capacity) if device.capacity is not None else "unknown",
                     format_size(device.peak), format_size(device.headroom) if device.headroom is not None else "-",
                     _memory_note(device)])
    if len(rows) == 1:
        rows.append(["-", "-", "-", "-", "no process owns an accelerator"])
    table(rows, out)
    out.write("\n")


def memory_json(devices: Sequence[DeviceMemory]) -> list[dict[str, Any]]:
    """Each accelerator's memory plan as JSON: figures in bytes, ``capacity`` and ``headroom`` null when unknown."""
    return [{"node_rank": d.node_rank, "hardware_type": d.hardware_type, "index": d.index, "capacity": d.capacity,
             "peak": d.peak, "headroom": d.headroom, "checked": d.capacity is not None, "fits": d.fits,
             "holdings": [dataclasses.asdict(h) for h in d.holdings], "undeclared": list(d.undeclared)}
            for d in devices]


def plan_json(plan: ComponentPlacement) -> dict[str, Any]:
    shares = shared_accelerators({name: plan.get_placements(name) for name in plan.components})

    def placement(p: Placement, name: str) -> dict[str, Any]:
        env, python = group_settings(plan, p)
        shared = [dataclasses.asdict(share) for share in shares.get((name, p.rank), ())]
        return {**dataclasses.asdict(p), "group_env": env, "python_interpreter_path": python, "shares": shared}

    memory = {"memory": memory_json(plan.memory)} if plan.job.resources else {}
    return {
        "nodes": [{"rank": n.rank, "node_id": n.node_id, "address": n.address,
                   "hardware": {t: len(d) for t, d in n.hardware.items()}} for n in plan.cluster.nodes],
        "components": {
            name: {
                "node_groups": list(plan.spec(name).node_groups),
                "placement": plan.spec(name).placement,
                "world_size": plan.get_world_size(name),
                "placements": [placement(p, name) for p in plan.get_placements(name)],
                "restart": dataclasses.asdict(plan.job.restart[name]) if name in plan.job.restart else None,
            }
            for name in plan.components
        },
        **memory,
    }


def sync_plans(specs: Sequence[SyncSpec], plan: ComponentPlacement) -> SyncPlans:
    """The plan of each parsed ``weight_sync:`` entry (``JobConfig.weight_sync``) on ``plan``'s placements."""
    plans = []
    for spec in specs:
        sources = plan.get_placements(spec.source)
        if spec.source_rank >= len(sources):
            raise ConfigError(f"weight_sync.{spec.name}.source_rank", f"component {spec.source!r} has ranks "
                              f"0-{len(sources) - 1}", value=spec.source_rank)
        targets = {t: plan.get_placements(t) for t in spec.targets}
        source = sources[spec.source_rank]
        plans.append((spec, source.node_rank, sync_plan(source, (spec.source, spec.source_rank), targets,
                                                        spec.bucket_bytes, spec.device_buckets)))
    return plans


def print_sync_plans(plans: SyncPlans, out: TextIO) -> None:
    """One table per weight sync: each target rank's group, rank, node and transport, and on other nodes its relay
    (``relays``: the source sends it each version, it passes it on to its node's other ranks; ``via <group>
    <rank>``: it gets each version from that relay); then what it costs in device memory, per device."""
    for spec, node, targets in plans:
        out.write(f"weight sync {spec.name}: {spec.source} rank {spec.source_rank} (node {node}) -> "
                  f"{', '.join(spec.targets)}\n")
        relayed = any(t.relay is not None for t in targets)
        rows = [["target", "rank", "node", "transport"] + (["relay"] if relayed else [])]
        rows += [[t.group, str(t.rank), str(t.node), t.transport] + ([_relay_cell(t)] if relayed else [])
                 for t in targets]
        table(rows, out)
        out.write("".join(f"{line}\n" for line in targets.memory()))
        out.write("\n")


def _relay_cell(target: SyncTarget) -> str:
    if target.relay is None:
        return "-"
    return "relays" if target.relays else f"via {target.relay[0]} {target.relay[1]}"


def sync_plans_json(plans: SyncPlans) -> dict[str, Any]:
    return {spec.name: {"source": spec.source, "source_rank": spec.source_rank, "targets": list(spec.targets),
                        "source_node": node, "plan": [dataclasses.asdict(t) for t in targets],
                        "device_memory": _device_memory(spec, targets)}
            for spec, node, targets in plans}


def _device_memory(spec: SyncSpec, targets: Sequence[SyncTarget]) -> dict[str, Any]:
    """What a sync costs in device memory, as ``hwplace plan --json`` gives it: the bucket size and ring, the most
    the source holds on a GPU it shares with a target (0 when none does), and the targets that hold a copy of the
    model with ``latest()``."""
    shared = [[t.group, t.rank] for t in targets if t.transport == SAME_DEVICE]
    size = ring_bucket_bytes(spec.bucket_bytes)
    return {"bucket_bytes": spec.bucket_bytes, "device_buckets": spec.device_buckets,
            "source_max_bytes": spec.device_buckets * size if shared else 0, "model_copy_with_latest": shared}
