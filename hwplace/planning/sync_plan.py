"""The plan of a weight sync: how each target rank gets the source's weights, chosen from the placements alone.

Pure functions over :class:`~hwplace.Placement` records: a target sharing an accelerator with the source reads
shared memory (CUDA IPC on GPUs), one on the source's node maps the object store's copy, one on another node
takes part in a broadcast. Also the top-level ``weight_sync:`` section of a config, checked against its
components. Imports the layers below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.contracts.records import Placement
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.wording import did_you_mean, safe_repr

SHARED_MEMORY = "shared-memory"
OBJECT_STORE = "object-store"
BROADCAST = "broadcast"
TRANSPORTS = (SHARED_MEMORY, OBJECT_STORE, BROADCAST)
KEYS = ("source", "targets", "source_rank")  # the keys of one weight_sync entry


@dataclass(frozen=True)
class SyncTarget:
    """One target rank of a weight sync: its group, rank, node, and the transport its weights take."""

    group: str
    rank: int
    node: int
    transport: str


def share_accelerator(a: Placement, b: Placement) -> bool:
    """Whether two placements hold a common accelerator (same node, same type, a common device index)."""
    return (a.node_rank == b.node_rank and a.hardware_type == b.hardware_type and a.local_accelerator_id >= 0
            and b.local_accelerator_id >= 0 and bool(set(a.local_hardware_ranks) & set(b.local_hardware_ranks)))


def transport(source: Placement, target: Placement) -> str:
    """The transport from ``source`` to ``target``."""
    if share_accelerator(source, target):
        return SHARED_MEMORY
    return OBJECT_STORE if source.node_rank == target.node_rank else BROADCAST


def plan_sync(source: Placement, targets: Mapping[str, Sequence[Placement]]) -> tuple[SyncTarget, ...]:
    """Every rank of every target group, in group then rank order, with its transport from ``source``."""
    return tuple(SyncTarget(group, p.rank, p.node_rank, transport(source, p))
                 for group, placements in targets.items() for p in placements)


@dataclass(frozen=True)
class SyncSpec:
    """One entry of a config's ``weight_sync:`` section."""

    name: str
    source: str
    targets: tuple[str, ...]
    source_rank: int = 0


def parse_weight_sync(section: Any, components: Sequence[str]) -> tuple[SyncSpec, ...]:
    """The ``weight_sync:`` section (``{name: {source: trainer, targets: [rollout]}}``), checked against the
    config's components; ``ConfigError`` naming the entry and key otherwise."""
    if section is None:
        return ()
    if not isinstance(section, Mapping):
        raise ConfigError("weight_sync", "is a mapping of sync names to {source, targets}", value=section)
    specs = []
    for name, entry in section.items():
        path = f"weight_sync.{name}"
        if not isinstance(entry, Mapping):
            raise ConfigError(path, "is a mapping with source and targets", value=entry,
                              allowed="{source: trainer, targets: [rollout]}")
        unknown = sorted(set(map(str, entry)) - set(KEYS))
        if unknown:
            raise ConfigError(f"{path}.{unknown[0]}", "is not a weight_sync key",
                              allowed=", ".join(KEYS) + did_you_mean(unknown[0], KEYS))
        source = _component(entry.get("source"), f"{path}.source", components)
        raw = entry.get("targets")
        raw_targets = [raw] if isinstance(raw, str) else raw
        if not isinstance(raw_targets, Sequence) or not raw_targets:
            raise ConfigError(f"{path}.targets", "names at least one component", value=raw)
        targets = tuple(_component(t, f"{path}.targets[{i}]", components) for i, t in enumerate(raw_targets))
        if source in targets:
            raise ConfigError(f"{path}.targets", f"includes the source {source!r}", allowed="other components")
        rank = entry.get("source_rank", 0)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ConfigError(f"{path}.source_rank", "is a rank of the source", value=rank)
        specs.append(SyncSpec(str(name), source, targets, rank))
    return tuple(specs)


def _component(value: Any, path: str, components: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in components:
        hint = did_you_mean(value, list(components)) if isinstance(value, str) else ""
        raise ConfigError(path, f"{safe_repr(value)} is not a component of component_placement{hint}",
                          allowed="components: " + ", ".join(components))
    return value
