"""A whole job file as one record: :class:`JobConfig`, parsed once by :func:`parse_job_config`.

The sections hwplace reads become records: ``cluster:`` a :class:`~hwplace.ClusterConfig`
(:mod:`hwplace.config.section`), ``weight_sync:`` a tuple of :class:`~hwplace.config.weight_sync.SyncSpec`
(:mod:`hwplace.config.weight_sync`), ``resources:`` a tuple of :class:`~hwplace.config.resources.ComponentResources`
(:mod:`hwplace.config.resources`), ``restart:`` a :class:`~hwplace.Restart` per component
(:mod:`hwplace.config.restart`). The whole file is also kept as written, read-only, in ``raw``: ``job:`` and
any section of the job's own (``model:``, ...), which hwplace does not refuse. Planning and the runtime receive
this record, never the raw mapping, so the file is read and checked once.

A new section: its parser and records in a module of their own in this package,
a field of :class:`JobConfig` with an empty default, and one line in :func:`parse_job_config` that parses it.

Imports the layers below and the other modules of :mod:`hwplace.config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hwplace.config.loading import load_config
from hwplace.config.records import ClusterConfig
from hwplace.config.resources import ComponentResources, parse_resources
from hwplace.config.restart import Restart, parse_restart
from hwplace.config.section import cluster_section, parse_cluster_config
from hwplace.config.weight_sync import SyncSpec, parse_weight_sync
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.frozen import FrozenDict
from hwplace.foundation.wording import safe_repr
from hwplace.plugin.manager import PluginManager


@dataclass(frozen=True)
class JobConfig:
    """A job file, parsed: ``cluster``, ``weight_sync``, ``resources`` and ``restart`` (a policy per component)
    as records, and the whole file, read-only, as ``raw``.

    ``raw`` holds every top-level section as written (``cluster:`` and ``weight_sync:`` too), its mappings as
    read-only dicts and its lists as tuples; :meth:`to_dict` gives a plain, mutable copy.
    """

    cluster: ClusterConfig
    weight_sync: tuple[SyncSpec, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=FrozenDict)
    resources: tuple[ComponentResources, ...] = ()
    restart: Mapping[str, Restart] = field(default_factory=FrozenDict)

    def __post_init__(self) -> None:
        if not isinstance(self.cluster, ClusterConfig):
            raise ConfigError("cluster", f"{safe_repr(self.cluster)} is not a ClusterConfig",
                              allowed="parse a config with parse_job_config")
        if not isinstance(self.raw, Mapping):
            raise ConfigError("", "the raw job file is a mapping of its top-level sections", value=self.raw)
        object.__setattr__(self, "weight_sync", tuple(self.weight_sync))
        object.__setattr__(self, "resources", tuple(self.resources))
        object.__setattr__(self, "restart", FrozenDict(self.restart))
        object.__setattr__(self, "raw", _frozen(self.raw))

    def to_dict(self) -> dict[str, Any]:
        """The whole file as plain, mutable dicts and lists (a fresh copy each time)."""
        thawed: dict[str, Any] = _thawed(self.raw)
        return thawed


def parse_job_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | JobConfig | Any,
    *,
    plugin_manager: PluginManager | None = None,
) -> JobConfig:
    """Read and check a whole job file (a YAML path, a mapping or an OmegaConf ``DictConfig``) into a
    :class:`JobConfig`; a ``JobConfig`` is returned as it is.

    Every section hwplace reads is checked here, ``cluster:`` first: a mistake is a
    :class:`~hwplace.ConfigError` naming the key path. ``plugin_manager`` (the process-wide one by default)
    supplies the hardware backends that declared hardware is checked against. Top-level keys hwplace does not
    read are kept in ``raw``, not refused.
    """
    if isinstance(source, JobConfig):
        return source
    raw = load_config(source)
    cluster = parse_cluster_config(cluster_section(raw), plugin_manager=plugin_manager)
    # One line per section hwplace reads, each parsed by its own module, in the order its errors should surface.
    weight_sync = parse_weight_sync(raw.get("weight_sync"), list(cluster.components))
    resources = parse_resources(raw.get("resources"), list(cluster.components))
    restart = parse_restart(raw.get("restart"), list(cluster.components))
    return JobConfig(cluster, weight_sync, raw, resources, restart)


def _frozen(value: Any) -> Any:
    """A read-only deep copy: mappings become :class:`FrozenDict`, lists tuples, sets frozensets."""
    if isinstance(value, Mapping):
        return FrozenDict({key: _frozen(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    if isinstance(value, set | frozenset):
        return frozenset(value)
    return value


def _thawed(value: Any) -> Any:
    """A plain, mutable deep copy of what :func:`_frozen` made."""
    if isinstance(value, Mapping):
        return {key: _thawed(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_thawed(item) for item in value]
    if isinstance(value, frozenset):
        return set(value)
    return value
