"""The ``cluster:`` section, validated once into a :class:`~hwplace.ClusterConfig` that is passed on.

Every rule is checked here, up front; every violation is a :class:`~hwplace.ConfigError` naming the key
path, the bad value and what is allowed. Reading files and OmegaConf objects is
:mod:`hwplace.config.loading`. Imports the layers below and the other modules of :mod:`hwplace.config`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hwplace.config.checks import (
    LABEL,
    check_keys,
    check_num_nodes,
    env_vars,
    mapping,
    parse_node_ranks,
    text,
)
from hwplace.config.hardware import parse_hardware
from hwplace.config.loading import to_plain
from hwplace.config.records import (
    DEFAULT_EXECUTOR,
    RESERVED_GROUPS,
    ClusterConfig,
    ComponentSpec,
    EnvConfig,
    NodeGroup,
)
from hwplace.contracts.hardware import PLUGIN_NAME
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.frozen import FrozenDict
from hwplace.foundation.wording import did_you_mean
from hwplace.plugin.manager import PluginManager

_CLUSTER_KEYS = ("num_nodes", "address", "executor", "node_groups", "component_placement")
_GROUP_KEYS = ("label", "node_ranks", "env_configs", "hardware", "ignore_hardware")
_ENV_CONFIG_KEYS = ("node_ranks", "env_vars", "python_interpreter_path")
_COMPONENT_KEYS = ("node_group", "placement")


def cluster_section(config: Mapping[str, Any]) -> Any:
    """The ``cluster:`` section of a whole config."""
    if "cluster" not in config:
        hint = ""
        if "num_nodes" in config or "component_placement" in config:
            hint = "; this looks like the cluster section itself: pass the whole config that contains it"
        raise ConfigError("cluster", f"the config has no 'cluster' section{hint}",
                          allowed=f"top-level keys found: {', '.join(map(str, config)) or 'none'}")
    return config["cluster"]


def _env_configs(value: Any, path: str, group_ranks: tuple[int, ...], num_nodes: int) -> tuple[EnvConfig, ...]:
    if not isinstance(value, list):
        raise ConfigError(path, "must be a list of {node_ranks, env_vars, python_interpreter_path}", value=value)
    configs: list[EnvConfig] = []
    for i, raw in enumerate(value):
        where = f"{path}[{i}]"
        raw = mapping(raw, where)
        check_keys(raw, _ENV_CONFIG_KEYS, where)
        if "node_ranks" not in raw:
            raise ConfigError(f"{where}.node_ranks", "is required")
        ranks = parse_node_ranks(raw["node_ranks"], f"{where}.node_ranks", num_nodes)
        outside = [r for r in ranks if r not in group_ranks]
        if outside:
            raise ConfigError(f"{where}.node_ranks", f"node rank(s) {outside} are not in this group",
                              value=raw["node_ranks"], allowed=f"the group's nodes are {list(group_ranks)}")
        env = env_vars(raw.get("env_vars", {}), f"{where}.env_vars")
        interpreter = raw.get("python_interpreter_path")
        if interpreter is not None:
            interpreter = text(interpreter, f"{where}.python_interpreter_path", "the path of a Python interpreter")
        configs.append(EnvConfig(ranks, FrozenDict(env), interpreter))
    # The same variable may differ between nodes, never on one node.
    for node in group_ranks:
        seen: dict[str, tuple[str, int]] = {}
        interpreters: dict[str, int] = {}
        for i, config in enumerate(configs):
            if node not in config.node_ranks:
                continue
            for name, val in config.env_vars.items():
                if name in seen and seen[name][0] != val:
                    raise ConfigError(f"{path}[{i}].env_vars.{name}",
                                      f"sets {val!r} on node {node}, where {path}[{seen[name][1]}] "
                                      f"already sets {seen[name][0]!r}")
                seen[name] = (val, i)
            if config.python_interpreter_path:
                interpreters[config.python_interpreter_path] = i
        if len(interpreters) > 1:
            raise ConfigError(f"{path}[{max(interpreters.values())}].python_interpreter_path",
                              f"node {node} is given several interpreters: {', '.join(interpreters)}")
    return tuple(configs)


def _node_group(raw: Any, path: str, num_nodes: int, manager: PluginManager | None) -> NodeGroup:
    raw = mapping(raw, path)
    check_keys(raw, _GROUP_KEYS, path)
    label = raw.get("label")
    if not isinstance(label, str) or not LABEL.match(label):
        raise ConfigError(f"{path}.label", "is required: 1 to 128 letters, digits, '_', '.' and '-'", value=label)
    if label in RESERVED_GROUPS:
        raise ConfigError(f"{path}.label", f"{label!r} is reserved (the built-in groups are "
                          f"{' and '.join(map(repr, RESERVED_GROUPS))})", allowed="choose another label")
    if "node_ranks" not in raw:
        raise ConfigError(f"{path}.node_ranks", "is required")
    ranks = parse_node_ranks(raw["node_ranks"], f"{path}.node_ranks", num_nodes)
    env_configs = _env_configs(raw.get("env_configs", []), f"{path}.env_configs", ranks, num_nodes)
    ignore = raw.get("ignore_hardware", False)
    if not isinstance(ignore, bool):
        raise ConfigError(f"{path}.ignore_hardware", "must be true or false", value=ignore)
    hardware = None
    if raw.get("hardware") is not None:
        if ignore:
            raise ConfigError(f"{path}.ignore_hardware", "cannot be true in a group that declares hardware")
        hardware = parse_hardware(raw["hardware"], f"{path}.hardware", ranks, manager)
    return NodeGroup(label, ranks, env_configs, hardware, ignore, path)


def _component_path(key: str) -> str:
    return f"cluster.component_placement.{key}" if LABEL.match(key) else f"cluster.component_placement[{key!r}]"


def _components(raw: Any, labels: Sequence[str]) -> dict[str, ComponentSpec]:
    raw = mapping(raw, "cluster.component_placement")
    components: dict[str, ComponentSpec] = {}
    for key, value in raw.items():
        path = _component_path(str(key))
        if not isinstance(key, str):
            raise ConfigError(path, "component names are strings", value=key)
        names = [name.strip() for name in key.split(",")]
        for name in names:
            if not LABEL.match(name):
                raise ConfigError(path, f"{name!r} is not a component name",
                                  allowed="names of letters, digits, '_', '.' and '-', joined by commas")
            if names.count(name) > 1:
                raise ConfigError(path, f"component {name!r} is placed twice in this key", value=key)
            if name in components:
                raise ConfigError(path, f"component {name!r} is placed twice "
                                  f"(also in {components[name].path})")
        groups: tuple[str, ...] = ("cluster",)
        if isinstance(value, Mapping):
            check_keys(value, _COMPONENT_KEYS, path)
            if "placement" not in value:
                raise ConfigError(f"{path}.placement", "is required")
            groups = _group_labels(value.get("node_group", "cluster"), f"{path}.node_group", labels)
            value = value["placement"]
            path = f"{path}.placement"
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ConfigError(path, "a placement is a string such as '0-7' or '0-1:0-3,4-7', or an integer",
                              value=value)
        if isinstance(value, str) and "\0" in value:
            raise ConfigError(path, "contains a NUL byte", value=value)
        for name in names:
            components[name] = ComponentSpec(name, groups, str(value), path)
    return components


def _group_labels(value: Any, path: str, labels: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, list | tuple) and value:
        items = list(value)
    else:
        raise ConfigError(path, "must be a group label, 'a,b' or a list of labels", value=value)
    groups = []
    for item in items:
        label = item.strip() if isinstance(item, str) else item
        if label not in labels:
            raise ConfigError(path, f"there is no node group {label!r}",
                              allowed=f"groups: {', '.join(labels)}{did_you_mean(str(label), labels)}")
        if label in groups:
            raise ConfigError(path, f"group {label!r} is listed twice", value=value)
        groups.append(label)
    return tuple(groups)


def _optional(raw: Mapping[str, Any], key: str, default: Any) -> Any:
    """``raw[key]``, with an explicit YAML null or an absent key meaning ``default`` (never ``false`` or ``0``)."""
    value = raw.get(key)
    return default if value is None else value


def parse_cluster_config(section: Any, *, plugin_manager: PluginManager | None = None) -> ClusterConfig:
    """Validate a ``cluster:`` section (mapping or OmegaConf) into a :class:`ClusterConfig`.

    ``plugin_manager`` (the process-wide one by default) supplies the hardware backends that declared
    hardware is checked against.
    """
    if isinstance(section, ClusterConfig):
        return section
    raw = mapping(to_plain(section), "cluster")
    if "cluster" in raw and isinstance(raw["cluster"], Mapping):
        raise ConfigError("cluster", "this looks like a whole config (it has a 'cluster' key): pass its cluster "
                          "section instead, such as cfg['cluster']")
    check_keys(raw, _CLUSTER_KEYS, "cluster")
    if "num_nodes" not in raw:
        raise ConfigError("cluster.num_nodes", "is required: the number of nodes the job uses")
    num_nodes = check_num_nodes(raw["num_nodes"])
    address = raw.get("address")
    if address is not None:
        address = text(address, "cluster.address", "'auto' or a Ray address such as 'ray://head:10001'")
    executor = text(_optional(raw, "executor", DEFAULT_EXECUTOR), "cluster.executor", "an executor name")
    if not PLUGIN_NAME.match(executor):
        raise ConfigError("cluster.executor", "is not an executor name", value=executor,
                          allowed=f"lower-case letters, digits, '.', '_' and '-' (default {DEFAULT_EXECUTOR!r})")
    groups_raw = _optional(raw, "node_groups", [])
    if not isinstance(groups_raw, list):
        raise ConfigError("cluster.node_groups", "must be a list of node groups", value=groups_raw)
    groups: list[NodeGroup] = []
    for i, group_raw in enumerate(groups_raw):
        group = _node_group(group_raw, f"cluster.node_groups[{i}]", num_nodes, plugin_manager)
        for other in groups:
            if other.label == group.label:
                raise ConfigError(f"cluster.node_groups[{i}].label",
                                  f"label {group.label!r} is already used by {other.path}")
        groups.append(group)
    labels = [g.label for g in groups] + list(RESERVED_GROUPS)
    components = _components(_optional(raw, "component_placement", {}), labels)
    return ClusterConfig(num_nodes, address, tuple(groups), components, executor)
