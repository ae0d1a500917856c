"""The ``cluster:`` section, validated into typed, immutable records.

Every rule is checked here, up front; every violation is a :class:`~hwplace.ConfigError` naming the key
path, the bad value and what is allowed. Reading files and OmegaConf objects is :mod:`hwplace.loading`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hwplace.errors import ConfigError
from hwplace.frozen import FrozenDict, freeze
from hwplace.grammar import parse_range
from hwplace.hardware import PLUGIN_NAME
from hwplace.loading import to_plain
from hwplace.wording import did_you_mean, safe_repr

if TYPE_CHECKING:
    from hwplace.plugin_manager import PluginManager

RESERVED_GROUPS = ("cluster", "node")
DEFAULT_EXECUTOR = "ray"
MAX_NODES = 100_000  # far beyond any cluster; bounds what a typo such as num_nodes: 10000000000 can cost
_LABEL = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_CLUSTER_KEYS = ("num_nodes", "address", "executor", "node_groups", "component_placement")
_GROUP_KEYS = ("label", "node_ranks", "env_configs", "hardware", "ignore_hardware")
_ENV_CONFIG_KEYS = ("node_ranks", "env_vars", "python_interpreter_path")
_HARDWARE_KEYS = ("type", "configs")
_COMPONENT_KEYS = ("node_group", "placement")


# -- records ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvConfig:
    """Environment and interpreter for some nodes of a group."""

    node_ranks: tuple[int, ...]
    env_vars: Mapping[str, str]
    python_interpreter_path: str | None = None


@dataclass(frozen=True)
class HardwareConfig:
    """A group's declared hardware type, and for device backends the per-node device configs."""

    type: str
    configs: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class NodeGroup:
    """A labelled set of nodes; ``hardware`` and ``ignore_hardware`` decide what its resources are."""

    label: str
    node_ranks: tuple[int, ...]
    env_configs: tuple[EnvConfig, ...] = ()
    hardware: HardwareConfig | None = None
    ignore_hardware: bool = False
    path: str = "cluster"  # the key path of its entry in cluster.node_groups; "cluster" for the reserved groups

    def __post_init__(self) -> None:
        for rank in self.node_ranks:
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise ConfigError(f"{self.path}.node_ranks", f"group {self.label!r} holds node rank "
                                  f"{safe_repr(rank)}", allowed="node ranks are non-negative integers")

    @property
    def declares_devices(self) -> bool:
        """Whether this group declares devices of its own (``hardware.configs``)."""
        return self.hardware is not None and bool(self.hardware.configs)

    def env_vars(self, node_rank: int) -> dict[str, str]:
        """The environment variables this group sets on one of its nodes."""
        env: dict[str, str] = {}
        for config in self.env_configs:
            if node_rank in config.node_ranks:
                env.update(config.env_vars)
        return env

    def python_interpreter_path(self, node_rank: int) -> str | None:
        """The interpreter this group's processes use on one of its nodes, ``None`` for the default."""
        for config in self.env_configs:
            if node_rank in config.node_ranks and config.python_interpreter_path:
                return config.python_interpreter_path
        return None


@dataclass(frozen=True)
class ComponentSpec:
    """One component's placement as configured: the node group(s) and the placement string."""

    name: str
    node_groups: tuple[str, ...]
    placement: str
    path: str


@dataclass(frozen=True)
class ClusterConfig:
    """The validated ``cluster:`` section."""

    num_nodes: int
    address: str | None = None
    node_groups: tuple[NodeGroup, ...] = ()
    components: Mapping[str, ComponentSpec] = field(default_factory=FrozenDict)
    executor: str = DEFAULT_EXECUTOR

    def __post_init__(self) -> None:
        check_num_nodes(self.num_nodes)
        for group in self.node_groups:
            beyond = [rank for rank in group.node_ranks if rank >= self.num_nodes]
            if beyond:
                raise ConfigError(f"{group.path}.node_ranks", f"node rank {beyond[0]} is out of range: "
                                  f"cluster.num_nodes is {self.num_nodes}")
        object.__setattr__(self, "components", FrozenDict(self.components))

    def group(self, label: str) -> NodeGroup:
        """A configured group, or the reserved ``cluster`` / ``node`` group, by label."""
        labels = [g.label for g in self.node_groups] + list(RESERVED_GROUPS)
        if not isinstance(label, str):
            raise ConfigError("node_group", "a node group is named by its label, a string", value=label,
                              allowed=f"groups: {', '.join(labels)}")
        if label in RESERVED_GROUPS:
            return NodeGroup(label, tuple(range(self.num_nodes)), ignore_hardware=label == "node")
        for group in self.node_groups:
            if group.label == label:
                return group
        raise ConfigError("cluster.node_groups", f"there is no node group {label!r}",
                          allowed=f"groups: {', '.join(labels)}{did_you_mean(label, labels)}")

    def declared_configs(self, node_rank: int) -> dict[str, list[Mapping[str, Any]]]:
        """The device configs every group declares for one node, by hardware type, in declaration order."""
        found: dict[str, list[Mapping[str, Any]]] = {}
        for group in self.node_groups:
            if group.hardware is not None:
                for config in group.hardware.configs:
                    if config["node_rank"] == node_rank:
                        found.setdefault(group.hardware.type, []).append(config)
        return found

    def declared_range(self, label: str, node_rank: int) -> range:
        """Where group ``label``'s own declared devices sit among the node's devices of their type.

        Devices of one type on one node are detected in declaration order, group after group; a group
        owns exactly the ones its own ``hardware.configs`` declare.
        """
        target = self.group(label).hardware
        start = 0
        for group in self.node_groups:
            if group.hardware is None:
                continue
            count = sum(1 for config in group.hardware.configs if config["node_rank"] == node_rank)
            if group.label == label:
                return range(start, start + count)
            if target is not None and group.hardware.type == target.type:
                start += count
        return range(0)

    def device_declarations(self) -> tuple[tuple[str, HardwareConfig], ...]:
        """Every group that declares devices, with its declaration: what a Cluster detects."""
        return tuple((g.label, g.hardware) for g in self.node_groups if g.hardware is not None and g.hardware.configs)


# -- the cluster section ------------------------------------------------------------------------


def cluster_section(config: Mapping[str, Any]) -> Any:
    """The ``cluster:`` section of a whole config."""
    if "cluster" not in config:
        hint = ""
        if "num_nodes" in config or "component_placement" in config:
            hint = "; this looks like the cluster section itself: pass the whole config that contains it"
        raise ConfigError("cluster", f"the config has no 'cluster' section{hint}",
                          allowed=f"top-level keys found: {', '.join(map(str, config)) or 'none'}")
    return config["cluster"]


# -- validation -------------------------------------------------------------------------------------


def _check_keys(mapping: Mapping[Any, Any], allowed: Sequence[str], path: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise ConfigError(f"{path}.{key}", "unknown key",
                              allowed=f"allowed keys: {', '.join(allowed)}{did_you_mean(str(key), allowed)}")


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(path, "must be a mapping", value=value)
    return value


def _int(value: Any, path: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, "must be an integer", value=value)
    if value < minimum:
        raise ConfigError(path, f"must be at least {minimum}", value=value)
    return value


def check_num_nodes(value: Any) -> int:
    """``num_nodes``: an integer from 1 to :data:`MAX_NODES`."""
    num_nodes = _int(value, "cluster.num_nodes", minimum=1)
    if num_nodes > MAX_NODES:
        raise ConfigError("cluster.num_nodes", f"is more than {MAX_NODES} nodes", value=num_nodes,
                          allowed=f"1 to {MAX_NODES}")
    return num_nodes


def _text(value: Any, path: str, what: str) -> str:
    """A non-empty string without NUL bytes or line breaks at its ends."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(path, f"must be a non-empty string: {what}", value=value)
    if "\0" in value:
        raise ConfigError(path, "contains a NUL byte", value=value, allowed=what)
    if value != value.strip():
        raise ConfigError(path, "starts or ends with whitespace or a line break (a YAML block scalar keeps "
                          "its final newline: use '|-')", value=value, allowed=what)
    return value


def parse_node_ranks(value: Any, path: str, num_nodes: int) -> tuple[int, ...]:
    """Node ranks as ``"0-1"``, ``"0,2-3"``, ``1``, ``[0, 1]`` or ``"all"``, sorted and checked."""
    allowed = f"allowed: 'all', a rank, a range 'a-b', a comma list '0,2-3' or a list, within 0-{num_nodes - 1}"
    if isinstance(value, str) and value.strip().lower() == "all":
        return tuple(range(num_nodes))
    if isinstance(value, bool) or value is None:
        raise ConfigError(path, "is not a node rank specification", value=value, allowed=allowed)
    if isinstance(value, int):
        parts: list[Any] = [value]
    elif isinstance(value, str):
        parts = value.split(",")
    elif isinstance(value, list | tuple):
        parts = list(value)
    else:
        raise ConfigError(path, "is not a node rank specification", value=value, allowed=allowed)
    ranks: list[int] = []
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, int | str):
            raise ConfigError(path, f"{part!r} is not a node rank", value=value, allowed=allowed)
        if isinstance(part, int):
            pair: tuple[int, int] | None = (part, part) if part >= 0 else None
        else:
            try:
                pair = parse_range(part)
            except ValueError as exc:
                raise ConfigError(path, str(exc), value=value) from None
        if pair is None:
            raise ConfigError(path, f"{part!r} is not a node rank or range", value=value, allowed=allowed)
        if pair[1] >= num_nodes:
            raise ConfigError(path, f"node rank {pair[1]} is out of range: cluster.num_nodes is {num_nodes}",
                              value=value, allowed=allowed)
        ranks.extend(range(pair[0], pair[1] + 1))
    if not ranks:
        raise ConfigError(path, "names no node", value=value, allowed=allowed)
    duplicates = sorted(rank for rank, count in Counter(ranks).items() if count > 1)
    if duplicates:
        raise ConfigError(path, f"node rank(s) {duplicates} appear more than once", value=value)
    return tuple(sorted(ranks))


def _env_value(raw: Any, where: str) -> str:
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, int):
        return str(raw)
    if isinstance(raw, float):
        raise ConfigError(where, "is a number with a fraction, which YAML would change (11.10 becomes '11.1')",
                          value=raw, allowed="quote it: '11.10'")
    if not isinstance(raw, str):
        raise ConfigError(where, "environment values are strings, integers or booleans", value=raw,
                          allowed="quote other values")
    if "\0" in raw:
        raise ConfigError(where, "contains a NUL byte, which no environment variable can hold", value=raw)
    if raw.endswith(("\n", "\r")):
        raise ConfigError(where, "ends with a line break (a YAML block scalar keeps its final newline: use '|-')",
                          value=raw)
    return raw


def _env_vars(value: Any, path: str) -> dict[str, str]:
    pairs: list[tuple[Any, Any, str]] = []
    if isinstance(value, Mapping):
        pairs = [(k, v, f"{path}.{k}") for k, v in value.items()]
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, Mapping) or len(item) != 1:
                raise ConfigError(f"{path}[{i}]", "must be a mapping with exactly one key", value=item)
            ((k, v),) = item.items()
            pairs.append((k, v, f"{path}[{i}].{k}"))
    else:
        raise ConfigError(path, "must be a mapping or a list of one-key mappings", value=value)
    env: dict[str, str] = {}
    for name, raw, where in pairs:
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ConfigError(where, "is not a valid environment variable name", value=name,
                              allowed="letters, digits and '_', not starting with a digit")
        text = _env_value(raw, where)
        if name in env and env[name] != text:
            raise ConfigError(where, f"is set twice, to {env[name]!r} and {text!r}")
        env[name] = text
    return env


def _env_configs(value: Any, path: str, group_ranks: tuple[int, ...], num_nodes: int) -> tuple[EnvConfig, ...]:
    if not isinstance(value, list):
        raise ConfigError(path, "must be a list of {node_ranks, env_vars, python_interpreter_path}", value=value)
    configs: list[EnvConfig] = []
    for i, raw in enumerate(value):
        where = f"{path}[{i}]"
        raw = _mapping(raw, where)
        _check_keys(raw, _ENV_CONFIG_KEYS, where)
        if "node_ranks" not in raw:
            raise ConfigError(f"{where}.node_ranks", "is required")
        ranks = parse_node_ranks(raw["node_ranks"], f"{where}.node_ranks", num_nodes)
        outside = [r for r in ranks if r not in group_ranks]
        if outside:
            raise ConfigError(f"{where}.node_ranks", f"node rank(s) {outside} are not in this group",
                              value=raw["node_ranks"], allowed=f"the group's nodes are {list(group_ranks)}")
        env = _env_vars(raw.get("env_vars", {}), f"{where}.env_vars")
        interpreter = raw.get("python_interpreter_path")
        if interpreter is not None:
            interpreter = _text(interpreter, f"{where}.python_interpreter_path", "the path of a Python interpreter")
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


def _hardware(value: Any, path: str, group_ranks: tuple[int, ...], manager: PluginManager | None) -> HardwareConfig:
    from hwplace.plugin_manager import failures_note, get_plugin_manager  # only declared hardware needs them

    raw = _mapping(value, path)
    _check_keys(raw, _HARDWARE_KEYS, path)
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
                                  f"{did_you_mean(type_name, kind_names)}{failures_note(manager)}")
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
        config = _mapping(config, where)
        if "node_rank" not in config:
            raise ConfigError(f"{where}.node_rank", "is required: the node the device is attached to")
        node_rank = _int(config["node_rank"], f"{where}.node_rank")
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


def _node_group(raw: Any, path: str, num_nodes: int, manager: PluginManager | None) -> NodeGroup:
    raw = _mapping(raw, path)
    _check_keys(raw, _GROUP_KEYS, path)
    label = raw.get("label")
    if not isinstance(label, str) or not _LABEL.match(label):
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
        hardware = _hardware(raw["hardware"], f"{path}.hardware", ranks, manager)
    return NodeGroup(label, ranks, env_configs, hardware, ignore, path)


def _component_path(key: str) -> str:
    return f"cluster.component_placement.{key}" if _LABEL.match(key) else f"cluster.component_placement[{key!r}]"


def _components(raw: Any, labels: Sequence[str]) -> dict[str, ComponentSpec]:
    raw = _mapping(raw, "cluster.component_placement")
    components: dict[str, ComponentSpec] = {}
    for key, value in raw.items():
        path = _component_path(str(key))
        if not isinstance(key, str):
            raise ConfigError(path, "component names are strings", value=key)
        names = [name.strip() for name in key.split(",")]
        for name in names:
            if not _LABEL.match(name):
                raise ConfigError(path, f"{name!r} is not a component name",
                                  allowed="names of letters, digits, '_', '.' and '-', joined by commas")
            if names.count(name) > 1:
                raise ConfigError(path, f"component {name!r} is placed twice in this key", value=key)
            if name in components:
                raise ConfigError(path, f"component {name!r} is placed twice "
                                  f"(also in {components[name].path})")
        groups: tuple[str, ...] = ("cluster",)
        if isinstance(value, Mapping):
            _check_keys(value, _COMPONENT_KEYS, path)
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
    raw = _mapping(to_plain(section), "cluster")
    if "cluster" in raw and isinstance(raw["cluster"], Mapping):
        raise ConfigError("cluster", "this looks like a whole config (it has a 'cluster' key): pass its cluster "
                          "section instead, such as cfg['cluster']")
    _check_keys(raw, _CLUSTER_KEYS, "cluster")
    if "num_nodes" not in raw:
        raise ConfigError("cluster.num_nodes", "is required: the number of nodes the job uses")
    num_nodes = check_num_nodes(raw["num_nodes"])
    address = raw.get("address")
    if address is not None:
        address = _text(address, "cluster.address", "'auto' or a Ray address such as 'ray://head:10001'")
    executor = _text(_optional(raw, "executor", DEFAULT_EXECUTOR), "cluster.executor", "an executor name")
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
