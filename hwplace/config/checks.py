"""The checks every part of a config is read with: keys, mappings, integers, text, node ranks and
environment variables. Each violation is a :class:`~hwplace.ConfigError` naming the key path, the bad value
and what is allowed. Imports the foundation and :mod:`hwplace.config.grammar`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from hwplace.config.grammar import parse_range
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.wording import did_you_mean, safe_repr

MAX_NODES = 100_000  # far beyond any cluster; bounds what a typo such as num_nodes: 10000000000 can cost
LABEL = re.compile(r"^[A-Za-z0-9_.-]{1,128}\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def check_keys(mapping: Mapping[Any, Any], allowed: Sequence[str], path: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise ConfigError(f"{path}.{key}", "unknown key",
                              allowed=f"allowed keys: {', '.join(allowed)}{did_you_mean(str(key), allowed)}")


def component(name: Any, path: str, components: Sequence[str]) -> str:
    """``name`` when it is one of ``components`` (those of ``cluster.component_placement``), else a
    ``ConfigError`` at ``path`` with a did-you-mean and the list."""
    if not isinstance(name, str) or name not in components:
        hint = did_you_mean(name, list(components)) if isinstance(name, str) else ""
        raise ConfigError(path, f"{safe_repr(name)} is not a component of component_placement{hint}",
                          allowed="components: " + ", ".join(components))
    return name


def mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(path, "must be a mapping", value=value)
    return value


def integer(value: Any, path: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, "must be an integer", value=value)
    if value < minimum:
        raise ConfigError(path, f"must be at least {minimum}", value=value)
    return value


def check_num_nodes(value: Any) -> int:
    """``num_nodes``: an integer from 1 to :data:`MAX_NODES`."""
    num_nodes = integer(value, "cluster.num_nodes", minimum=1)
    if num_nodes > MAX_NODES:
        raise ConfigError("cluster.num_nodes", f"is more than {MAX_NODES} nodes", value=num_nodes,
                          allowed=f"1 to {MAX_NODES}")
    return num_nodes


def text(value: Any, path: str, what: str) -> str:
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


def env_value(raw: Any, where: str) -> str:
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


def env_vars(value: Any, path: str) -> dict[str, str]:
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
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise ConfigError(where, "is not a valid environment variable name", value=name,
                              allowed="letters, digits and '_', not starting with a digit")
        text = env_value(raw, where)
        if name in env and env[name] != text:
            raise ConfigError(where, f"is set twice, to {env[name]!r} and {text!r}")
        env[name] = text
    return env
