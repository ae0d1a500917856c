"""Reading a whole configuration: a YAML file path, a mapping, or an OmegaConf container, into plain data.

Validation of the ``cluster:`` section lives in :mod:`hwplace.config`; this module only turns what the user
gave into plain dicts, lists and scalars, or raises :class:`~hwplace.ConfigError`.

YAML is read with ``yaml.SafeLoader``, but plain scalars resolve the YAML 1.2 way: integers are decimal
(``1:30`` stays a string, not the base-60 ``90``) and the only booleans are ``true``/``True``/``TRUE`` and
``false``/``False``/``FALSE`` (``yes``, ``no``, ``on``, ``off``, ``y`` and ``n`` stay strings). A key written
twice in one mapping is an error (YAML would silently keep the last); keys brought in by a merge (``<<: *base``)
may be overridden.

Hostile input fails in bounded time and memory. Refused: files over 1 MiB or not UTF-8, integer literals over
30 digits, nesting over 100 levels, self-references (recursive anchors, a dict that contains itself), and
anything that expands to over 1,000,000 values (scalars, lists, mappings and keys, counted each time an alias
or a shared object repeats them).
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import yaml

from hwplace.foundation.errors import ConfigError
from hwplace.foundation.wording import did_you_mean, safe_repr

_MAX_FILE_BYTES = 1024 * 1024  # pure-Python PyYAML parses as little as 64 KiB a second
_MAX_INT_DIGITS = 30
_MAX_DEPTH = 100
_MAX_VALUES = 1_000_000
_NESTING = f"nest lists and mappings at most {_MAX_DEPTH} levels deep, counting what aliases repeat"

_INT = "tag:yaml.org,2002:int"
_BOOL = "tag:yaml.org,2002:bool"
_MERGE = "tag:yaml.org,2002:merge"

# -- YAML ----------------------------------------------------------------------------------------


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with YAML 1.2 integers and booleans, duplicate-key checks and the limits above."""

    def __init__(self, text: str, name: str) -> None:
        stream = io.StringIO(text)
        stream.name = name  # yaml names the file in its messages
        super().__init__(stream)
        self._values = 0  # values composed so far, an alias counting as all it repeats
        self._open: list[str | None] = []  # anchors of the collections being composed, innermost last
        self._extents: dict[yaml.Node, tuple[int, int]] = {}
        self._checked: set[yaml.MappingNode] = set()  # mappings whose keys were checked for duplicates

    def _error(self, mark: yaml.Mark | None, problem: str, allowed: str | None = None) -> ConfigError:
        where = f"{self.name}:{mark.line + 1}" if mark else self.name
        return ConfigError("", f"{where}: {problem}", allowed=allowed)

    def _extent(self, node: yaml.Node) -> tuple[int, int]:
        """How many values ``node`` expands to, and how many levels of collections it nests."""
        if isinstance(node, yaml.ScalarNode):
            return 1, 0
        if node not in self._extents:
            pairs = isinstance(node, yaml.MappingNode)
            children = [part for pair in node.value for part in pair] if pairs else node.value
            extents = [self._extent(child) for child in children]
            self._extents[node] = 1 + sum(size for size, _ in extents), 1 + max((lv for _, lv in extents), default=0)
        return self._extents[node]

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        mark, anchor = event.start_mark, event.anchor
        collection = isinstance(event, yaml.CollectionStartEvent)
        size, levels = 1, int(collection)
        if isinstance(event, yaml.AliasEvent) and anchor in self._open:
            raise self._error(mark, f"alias *{anchor} is inside its own anchor, an endless structure",
                              "an alias may only repeat a value that is complete")
        if isinstance(event, yaml.AliasEvent) and anchor in self.anchors:
            size, levels = self._extent(self.anchors[anchor])
        if len(self._open) + levels > _MAX_DEPTH:
            raise self._error(mark, f"nested more than {_MAX_DEPTH} levels", _NESTING)
        self._values += size
        if self._values > _MAX_VALUES:
            raise self._error(mark, f"the document expands to more than {_MAX_VALUES:,} values",
                              "an alias counts as every value it repeats")
        if not collection:
            return super().compose_node(parent, index)
        self._open.append(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._open.pop()

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return super().construct_object(node, deep)
        try:
            return super().construct_object(node, deep)
        except (ConfigError, yaml.YAMLError):
            raise
        except Exception as exc:  # a scalar its tag cannot hold: `!!int abc`, `2024-13-45`
            tag = node.tag.rpartition(":")[2]
            raise self._error(node.start_mark, f"cannot read {node.value[:80]!r} as {tag}: {exc}") from None

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        if node not in self._checked:  # the first call sees the keys as written; merging then adds keys
            self._checked.add(node)
            self._refuse_duplicate_keys(node)
        super().flatten_mapping(node)

    def _refuse_duplicate_keys(self, node: yaml.MappingNode) -> None:
        lines: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                continue
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if not isinstance(key, Hashable):  # `? !!set x`: yaml reports the unhashable key
                continue
            if key in lines:
                raise self._error(key_node.start_mark,
                                  f"key {key_node.value!r} is written twice in one mapping (lines {lines[key]} and "
                                  f"{line}); YAML would silently keep the last", "write each key once")
            lines[key] = line

    def _construct_int(self, node: yaml.ScalarNode) -> int:
        digits = len(re.sub(r"^[-+]?0[box]|[-+_:]", "", self.construct_scalar(node)))  # `!!int {}` fails here
        if digits > _MAX_INT_DIGITS:
            raise self._error(node.start_mark, f"integer with {digits} digits is too large",
                              f"an integer has at most {_MAX_INT_DIGITS} digits")
        return self.construct_yaml_int(node)


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _BOOL)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
BOOL_TEXT = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)\Z")  # \Z: "$" would match before a final newline
INT_TEXT = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)\Z")
_YamlLoader.add_implicit_resolver(_BOOL, BOOL_TEXT, list("tTfF"))
_YamlLoader.add_implicit_resolver(_INT, INT_TEXT, list("-+0123456789"))
_YamlLoader.add_constructor(_INT, _YamlLoader._construct_int)


def _load_file(name: str) -> dict[str, Any]:
    """The mapping a YAML file holds."""
    try:
        with open(name, "rb") as file:
            data = file.read(_MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte or a lone surrogate in the path
        raise ConfigError("", f"cannot read config file {name!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if len(data) > _MAX_FILE_BYTES:
        raise ConfigError("", f"{name} is larger than {_MAX_FILE_BYTES >> 20} MiB",
                          allowed="a config file is a few kilobytes of YAML")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError("", f"{name} is not UTF-8: byte {data[exc.start]:#04x} at offset {exc.start} "
                              f"(line {line}) {exc.reason}", allowed="save the file as UTF-8") from None
    loaded = _parse(text, name) if text.strip() else _EMPTY
    if loaded is _EMPTY:
        raise ConfigError("", f"{name} is empty; it must hold a mapping at the top level")
    if not isinstance(loaded, dict):
        raise ConfigError("", f"{name} must hold a mapping at the top level", value=type(loaded).__name__)
    return loaded


_EMPTY = object()  # what a YAML text without a document (blank, or only comments) holds


def _parse(text: str, name: str) -> Any:
    """The value a YAML text holds, read with :class:`_YamlLoader`; ``_EMPTY`` when it holds no document."""
    try:
        loader = _YamlLoader(text, name)  # already reads the start, and checks its characters
        node = loader.get_single_node()  # yaml refuses a tab outside a scalar
        return _EMPTY if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{name} is not valid YAML: {exc}") from None
    except RecursionError:  # only where the caller's own stack is already deep
        raise ConfigError("", f"{name} is nested too deeply to read", allowed=_NESTING) from None


_OVERRIDE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*\Z")


CHECKED_SECTIONS = ("cluster", "job")
"""Top-level sections whose keys hwplace checks itself (``cluster:`` when it is parsed, ``job:`` against the
entry point's settings): an override may add a key there that the file leaves out."""


def apply_overrides(config: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """``config`` with each ``dotted.key=value`` set; values are YAML (``job.steps=5``, ``a.b='[1, 2]'``).

    A path must name something: its first key a section of the config (or one hwplace reads, ``cluster`` and
    ``job``), and inside any other section every key must already be there. Inside ``cluster:`` and ``job:``
    new keys are allowed, since their own checks refuse the unknown ones (with a did-you-mean). A path that
    names nothing, or passes through a value that is not a mapping, is a ``ConfigError``.
    """
    allowed = "dotted.key=value, such as job.steps=5 or cluster.num_nodes=2"
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not _OVERRIDE_KEY.match(key.strip()):
            raise ConfigError("override", f"{item[:60]!r} is not key=value", allowed=allowed)
        key = key.strip()
        *parents, last = key.split(".")
        checked = (parents or [last])[0] in CHECKED_SECTIONS
        target = config
        for depth, part in enumerate([*parents, last]):
            if part in target or checked:
                if depth == len(parents):
                    break
                child = target.setdefault(part, {})
                if not isinstance(child, dict):
                    where = ".".join(parents[: depth + 1])
                    raise ConfigError(where, f"is {safe_repr(child)}, not a mapping, so {key!r} cannot be set",
                                      allowed=allowed)
                target = child
                continue
            where = ".".join(parents[:depth]) or "the config's top level"
            known = list(dict.fromkeys([*target, *CHECKED_SECTIONS])) if depth == 0 else list(target)
            raise ConfigError(f"override {key}", f"names nothing: {where} has no key {part!r}"
                              f"{_suggest(config, parents[:depth], part, known)}",
                              allowed=f"a path into the config (keys there: {', '.join(map(str, known)) or 'none'})")
        value = _parse(raw, f"the value of {key}") if raw.strip() else ""
        target[last] = "" if value is _EMPTY else value
    return config


def _suggest(config: Mapping[str, Any], parents: list[str], part: str, known: list[Any]) -> str:
    """A did-you-mean for an override key: a key beside it, or (at the top) the key inside a section."""
    close = did_you_mean(part, known)
    if close or parents:
        return close
    inside = [f"{name}.{key}" for name, section in config.items() if isinstance(section, Mapping)
              for key in section if key == part]
    return f"; did you mean {(inside or [f'job.{part}'])[0]!r}?"


def load_config(source: str | os.PathLike[str] | Mapping[str, Any] | Any) -> dict[str, Any]:
    """A whole configuration as plain dicts and lists, from a YAML path, a mapping or an OmegaConf object."""
    if isinstance(source, str | os.PathLike):
        return _load_file(os.fsdecode(source))
    plain = to_plain(source)
    if not isinstance(plain, dict):
        raise ConfigError("", "a config is a YAML file path, a mapping or an OmegaConf DictConfig",
                          value=type(source).__name__)
    return plain


# -- Python objects ------------------------------------------------------------------------------


def _is_omegaconf(value: Any) -> bool:
    return type(value).__module__.startswith("omegaconf")


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _children(value: Any, path: str) -> Iterable[tuple[Any, Any]] | None:
    """The ``(key or index, item)`` pairs of a container, or ``None`` for a scalar."""
    if _is_omegaconf(value):
        from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: PLC0415 (optional: OmegaConf, only reached when the caller uses it)

        if not isinstance(value, DictConfig | ListConfig):
            return None
        children = []
        keys: Iterable[Any] = value.keys() if isinstance(value, DictConfig) else range(len(value))
        for key in keys:
            try:  # a missing value (``???``) is a scalar here, as in OmegaConf.to_container
                children.append((key, None if OmegaConf.is_missing(value, key) else value[key]))
            except Exception as exc:
                raise ConfigError(_join(path, key), f"cannot resolve the OmegaConf config: {exc}") from None
        return children
    if isinstance(value, Mapping):
        return value.items()
    if isinstance(value, list | tuple):
        return enumerate(value)
    return None


class _Extents:
    """Measures a structure once per distinct object, so shared parts cost nothing to count again."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[Any, int, int]] = {}  # id -> (the object, kept alive; values; levels)
        self.open: set[int] = set()  # ids of the containers being measured

    def measure(self, value: Any, path: str, depth: int) -> tuple[int, int]:
        """The values ``value`` expands to and the levels it nests, found ``depth`` levels down at ``path``."""
        if id(value) not in self.known:
            children = _children(value, path)
            if children is None:
                if isinstance(value, int) and abs(value) >= 10**_MAX_INT_DIGITS:
                    raise ConfigError(path, f"integer with more than {_MAX_INT_DIGITS} digits is too large")
                return 1, 0
            if id(value) in self.open:
                raise ConfigError(path, "contains itself (a recursive structure)", allowed="a config is a tree")
            if depth >= _MAX_DEPTH:
                raise ConfigError(path, f"nested more than {_MAX_DEPTH} levels", allowed=_NESTING)
            self.open.add(id(value))
            size, levels = 1, 0
            for key, item in children:
                item_size, item_levels = self.measure(item, _join(path, key), depth + 1)
                size += item_size + isinstance(value, Mapping)
                levels = max(levels, item_levels)
                if size > _MAX_VALUES:
                    raise ConfigError(path, f"expands to more than {_MAX_VALUES:,} values",
                                      allowed="a shared list or mapping counts each time it appears")
            self.open.discard(id(value))
            self.known[id(value)] = value, size, levels + 1
        _, size, levels = self.known[id(value)]
        if depth + levels > _MAX_DEPTH:
            raise ConfigError(path, f"nested more than {_MAX_DEPTH} levels", allowed=_NESTING)
        return size, levels


def _copy(value: Any) -> Any:
    if _is_omegaconf(value):
        from omegaconf import OmegaConf  # noqa: PLC0415 (optional: OmegaConf)

        try:
            return OmegaConf.to_container(value, resolve=True)
        except Exception as exc:
            raise ConfigError("", f"cannot resolve the OmegaConf config: {exc}") from None
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(item) for item in value]
    return value


def to_plain(value: Any) -> Any:
    """A fresh copy of ``value`` with mappings, tuples and OmegaConf containers turned into dicts and lists.

    Refused with a :class:`ConfigError` at the key path: a structure that contains itself, nesting over 100
    levels, over 1,000,000 values once shared parts are counted each time, and integers over 30 digits.
    """
    _Extents().measure(value, "", 0)
    return _copy(value)
