"""A node group's ``hardware:`` section: a hardware type checked against the registered backends and,
for device backends, the declared device configs, each checked by its backend. Imports the layers below
(the plugin manager) and :mod:`hwplace.config.checks` and :mod:`hwplace.config.records`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwplace.config.checks import check_keys, integer, mapping
from hwplace.config.records import HardwareConfig
from hwplace.contracts.hardware import BACKEND_ALIASES
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.frozen import freeze
from hwplace.foundation.wording import did_you_mean, safe_repr
from hwplace.plugin.manager import PluginManager, failures_note
from hwplace.plugin.session import get_plugin_manager

HARDWARE_KEYS = ("type", "configs")


def parse_hardware(
    value: Any, path: str, group_ranks: tuple[int, ...], manager: PluginManager | None
) -> HardwareConfig:
    """A group's ``hardware:`` mapping at ``path``, checked against the backends ``manager`` has."""
    raw = mapping(value, path)
    check_keys(raw, HARDWARE_KEYS, path)
    manager = manager or get_plugin_manager()
    backends = manager.backends()
    kind_names = sorted(name for name, info in backends.items() if info.kind != "node")
    type_name = raw.get("type")
    if not isinstance(type_name, str):
        raise ConfigError(f"{path}.type", "is required: the name of a hardware backend", value=type_name,
                          allowed=f"registered types: {', '.join(kind_names) or 'none'}")
    if type_name not in backends or backends[type_name].kind == "node":
        hint = "; for plain nodes use 'ignore_hardware: true' or no hardware at all" if type_name in backends else ""
        raise ConfigError(f"{path}.type", f"no hardware backend is named {type_name!r}{hint}",
                          allowed=f"registered types: {', '.join(kind_names) or 'none'}"
                                  f"{did_you_mean(type_name, kind_names, BACKEND_ALIASES)}{failures_note(manager)}")
    backend = backends[type_name].backend
    configs_raw = raw.get("configs")
    if backend.kind == "accelerator":
        if configs_raw is not None:
            raise ConfigError(f"{path}.configs", f"{type_name!r} is an accelerator backend: its devices are "
                              "found on every node, not declared", allowed="leave configs out")
        return HardwareConfig(type_name)
    if not isinstance(configs_raw, list) or not configs_raw:
        raise ConfigError(f"{path}.configs", f"{type_name!r} devices must be declared: a non-empty list of "
                          "mappings, each with a node_rank", value=configs_raw)
    configs: list[Mapping[str, Any]] = []
    for i, config in enumerate(configs_raw):
        where = f"{path}.configs[{i}]"
        config = mapping(config, where)
        if "node_rank" not in config:
            raise ConfigError(f"{where}.node_rank", "is required: the node the device is attached to")
        node_rank = integer(config["node_rank"], f"{where}.node_rank")
        if node_rank not in group_ranks:
            raise ConfigError(f"{where}.node_rank", f"node {node_rank} is not in this group",
                              allowed=f"the group's nodes are {list(group_ranks)}")
        try:
            frozen = freeze(config, where)
        except TypeError as exc:
            raise ConfigError(where, str(exc)) from None
        try:
            backend.check_config(frozen)
        except ValueError as exc:
            raise ConfigError(where, str(exc), allowed=f"see the {type_name!r} backend's documentation") from None
        except Exception as exc:  # a broken backend: say so, without taking anything else down
            raise ConfigError(where, f"the {type_name!r} backend ({backends[type_name].distribution}) failed to "
                              f"check this entry: check_config raised {safe_repr(exc)}",
                              allowed="report it to the backend's authors, or disable its plugin") from None
        configs.append(frozen)
    return HardwareConfig(type_name, tuple(configs))
