"""The ``weight_sync:`` section of a job file, parsed into :class:`SyncSpec` records.

Each entry names a source component and its targets (``{name: {source: trainer, targets: [rollout]}}``),
checked against the components of ``cluster.component_placement``; a mistake is a
:class:`~hwplace.ConfigError` naming the entry and the key. How each target gets the weights is planned from
the placements in :mod:`hwplace.planning.sync_plan`. Imports the layers below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.foundation.errors import ConfigError
from hwplace.foundation.wording import did_you_mean, safe_repr

KEYS = ("source", "targets", "source_rank")  # the keys of one weight_sync entry


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
