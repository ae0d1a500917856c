"""The ``weight_sync:`` section of a job file, parsed into :class:`SyncSpec` records.

Each entry names a source component and its targets (``{name: {source: trainer, targets: [rollout]}}``),
checked against the components of ``cluster.component_placement``, and optionally its ``source_rank``, its
``bucket_bytes`` (the size of a bucket: ``64MiB``) and ``device_buckets`` (how many buckets the source keeps on a
GPU it shares with a target: its device memory for the sync is at most their product); a mistake is a
:class:`~hwplace.ConfigError` naming the entry and the key. :func:`check_buckets` is the one rule for both sizes,
here and in ``WeightSync.create``. How each target gets the weights is planned from the placements in
:mod:`hwplace.planning.sync_plan`. Imports the layers below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.foundation.errors import ConfigError
from hwplace.foundation.sizes import parse_size
from hwplace.foundation.wording import did_you_mean, safe_repr

KEYS = ("source", "targets", "source_rank", "bucket_bytes", "device_buckets")  # the keys of one weight_sync entry
DEFAULT_BUCKET_BYTES = 64 * 2**20
DEFAULT_DEVICE_BUCKETS = 8  # with 64 MiB buckets: at most 512 MiB of the source's GPU memory per sync
MAX_DEVICE_BUCKETS = 2**16


@dataclass(frozen=True)
class SyncSpec:
    """One entry of a config's ``weight_sync:`` section."""

    name: str
    source: str
    targets: tuple[str, ...]
    source_rank: int = 0
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    device_buckets: int = DEFAULT_DEVICE_BUCKETS


def check_buckets(bucket_bytes: Any, device_buckets: Any, path: str = "") -> tuple[int, int]:
    """``bucket_bytes`` (a number of bytes above 0, or a size such as ``"64MiB"``) and ``device_buckets`` (a whole
    number from 1 to 65536) as numbers; ``ConfigError`` naming the key (under ``path``) and what is allowed."""
    where = f"{path}." if path else ""
    size = parse_size(bucket_bytes, f"{where}bucket_bytes")
    if size <= 0:
        raise ConfigError(f"{where}bucket_bytes", "is the size of one bucket", value=bucket_bytes,
                          allowed="above 0 bytes, such as 64MiB")
    if isinstance(device_buckets, bool) or not isinstance(device_buckets, int) or \
            not 1 <= device_buckets <= MAX_DEVICE_BUCKETS:
        raise ConfigError(f"{where}device_buckets", "is how many buckets the source keeps on a GPU it shares with a "
                          "target", value=device_buckets, allowed=f"a whole number from 1 to {MAX_DEVICE_BUCKETS}")
    return size, device_buckets


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
        sizes = check_buckets(entry.get("bucket_bytes", DEFAULT_BUCKET_BYTES),
                              entry.get("device_buckets", DEFAULT_DEVICE_BUCKETS), path)
        specs.append(SyncSpec(str(name), source, targets, rank, *sizes))
    return tuple(specs)


def _component(value: Any, path: str, components: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in components:
        hint = did_you_mean(value, list(components)) if isinstance(value, str) else ""
        raise ConfigError(path, f"{safe_repr(value)} is not a component of component_placement{hint}",
                          allowed="components: " + ", ".join(components))
    return value
