"""Tests of reading a config (hwplace.loading): hostile and broken input is a ConfigError, fast and bounded.

Covers duplicate keys, alias bombs and recursive anchors, absurd nesting, bad files (encoding, size, path),
oversized integers, YAML 1.2 booleans, and the same limits for dicts and OmegaConf containers built in Python.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from hwplace import ConfigError, load_config
from hwplace.config import loading
from hwplace.config.loading import to_plain

FILE = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])

# -- helpers ----------------------------------------------------------------------------------------


def write(tmp_path: Path, content: str | bytes, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def outcome(source: Any) -> dict[str, Any] | ConfigError:
    """What ``load_config(source)`` gives: the config, or the ConfigError it raised (anything else propagates)."""
    try:
        return load_config(source)
    except ConfigError as error:
        return error


CALL_BUDGET = 200_000
"""The function calls (Python and C) a refusal may take: the work done, counted, rather than a wall-clock time
that a loaded machine stretches (the times are in ``benchmarks/hostile_config.py``)."""


def counted(source: Any) -> tuple[dict[str, Any] | ConfigError, int]:
    """``outcome(source)`` and the number of function calls it made."""
    calls = 0

    def count(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        result = outcome(source)
    finally:
        sys.setprofile(None)
    return result, calls


def fails(source: Any, *fragments: str, budget: int = CALL_BUDGET) -> ConfigError:
    """Load ``source`` expecting exactly a ConfigError, within a bounded amount of work, whose message holds
    every fragment."""
    error, calls = counted(source)
    assert type(error) is ConfigError, f"loaded {error!r}"
    message = str(error)
    assert calls < budget, f"took {calls} calls: {message}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "set_int_max_str_digits" not in message
    return error


def file_fails(tmp_path: Path, content: str | bytes, *fragments: str) -> ConfigError:
    """A file holding ``content`` fails to load, naming the file and the fragments; the key path is empty."""
    path = write(tmp_path, content)
    error = fails(path, str(path), *fragments)
    assert error.path == ""
    return error


def nested_lists(levels: int, inner: Any = 0) -> Any:
    value = inner
    for _ in range(levels):
        value = [value]
    return value


@contextmanager
def limits(**values: int) -> Iterator[None]:
    """Lower the module's limits (``MAX_VALUES=50``), so boundaries are cheap to test."""
    patches: dict[str, Any] = {f"_{name}": value for name, value in values.items()}
    with mock.patch.multiple(loading, **patches):
        yield


def expanded_size(value: Any) -> int:
    """The values a structure expands to: every scalar, list, mapping and key, shared parts counted each time."""
    if isinstance(value, dict):
        return 1 + sum(1 + expanded_size(item) for item in value.values())
    if isinstance(value, list):
        return 1 + sum(expanded_size(item) for item in value)
    return 1


def container_ids(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [id(value), *(i for item in value.values() for i in container_ids(item))]
    if isinstance(value, list):
        return [id(value), *(i for item in value for i in container_ids(item))]
    return []


# -- 1. duplicate keys ------------------------------------------------------------------------------


def test_duplicate_key_names_the_key_both_lines_and_the_file(tmp_path: Path) -> None:
    text = "cluster:\n  component_placement:\n    actor: 0-3\n    rollout: 4\n    actor: 4-7\n"
    error = file_fails(tmp_path, text, "key 'actor' is written twice", "lines 3 and 5", ":5:")
    assert error.allowed == "write each key once"


@pytest.mark.parametrize(("text", "key", "lines"), [
    ("a: 1\nb: 2\na: 3\n", "a", (1, 3)),
    ("top:\n  mid:\n    - x: 1\n      y: 2\n      x: 3\n", "x", (3, 5)),
    ("a: {b: 1, c: 2, b: 3}\n", "b", (1, 1)),
    ("a: 1\n'a': 2\n", "a", (1, 2)),
    ("1: a\n+1: b\n", "+1", (1, 2)),
    ("true: a\nTRUE: b\n", "TRUE", (1, 2)),
    ("c:\n  <<: &base {x: 1, x: 2}\n", "x", (2, 2)),
    ("s: !!set {a, b, a}\n", "a", (1, 1)),
])
def test_duplicate_keys_at_any_level_and_spelling(tmp_path: Path, text: str, key: str, lines: tuple[int, int]) -> None:
    file_fails(tmp_path, text, f"key {key!r} is written twice", f"lines {lines[0]} and {lines[1]}")


@pytest.mark.parametrize(("text", "expected"), [
    ("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", {"x": 3, "y": 2}),
    ("base: &b {x: 1, y: 2}\nc:\n  x: 3\n  <<: *b\n", {"x": 3, "y": 2}),
    ("base: &b {x: 1}\nother: &o {x: 2, z: 0}\nc: {<<: [*b, *o], y: 5}\n", {"x": 1, "z": 0, "y": 5}),
    # a mapping that merges is itself merged, in several places, before its own turn to be built
    ("a: &a {k: 1}\nx:\n  y:\n    b: &b {<<: *a, k: 2}\nc: {<<: *b}\nd: {<<: [*b, *a], k: 5}\n", {"k": 5}),
])
def test_merge_keys_may_be_overridden(tmp_path: Path, text: str, expected: dict[str, Any]) -> None:
    loaded = load_config(write(tmp_path, text))
    assert loaded[next(reversed(loaded))] == expected


def test_same_key_in_different_mappings_is_fine(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, "a: {x: 1}\nb: {x: 2}\nc: [{x: 3}, {x: 4}]\n"))
    assert loaded == {"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 3}, {"x": 4}]}


Tree = list[tuple[str, Any]]
trees = st.recursive(
    st.integers(0, 9),
    lambda children: st.lists(st.tuples(st.sampled_from("abc"), children), min_size=1, max_size=4),
    max_leaves=25,
).filter(lambda tree: isinstance(tree, list))


def render(tree: Tree, indent: int, lines: list[str], duplicates: set[tuple[str, int, int]]) -> Any:
    """Writes ``tree`` as block YAML into ``lines``; collects its duplicate keys; returns what it should load as."""
    first: dict[str, int] = {}
    expected: dict[str, Any] = {}
    for key, value in tree:
        lines.append(f"{' ' * indent}{key}:" + ("" if isinstance(value, list) else f" {value}"))
        line = len(lines)
        if key in first:
            duplicates.add((key, first[key], line))
        first.setdefault(key, line)
        expected[key] = render(value, indent + 2, lines, duplicates) if isinstance(value, list) else value
    return expected


@FILE
@given(tree=trees)
def test_generated_mappings_load_or_name_a_duplicate(tmp_path: Path, tree: Tree) -> None:
    lines: list[str] = []
    duplicates: set[tuple[str, int, int]] = set()
    expected = render(tree, 0, lines, duplicates)
    path = write(tmp_path, "\n".join(lines) + "\n")
    if not duplicates:
        assert load_config(path) == expected
        return
    message = str(fails(path, str(path), "is written twice"))
    assert any(f"key {key!r} is written twice in one mapping (lines {a} and {b})" in message
               for key, a, b in duplicates), message


# -- 2. alias bombs, recursive anchors, shared and recursive Python structures ----------------------


def laughs(levels: int, width: int = 9) -> str:
    lines = ["l0: &l0 [lol]"]
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_fast(tmp_path: Path) -> None:
    file_fails(tmp_path, laughs(9), "expands to more than 1,000,000 values", "an alias counts as every value")


def test_merge_key_bomb_is_refused_fast(tmp_path: Path) -> None:
    lines = ["m0: &m0 {k: 1}"] + [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}" for i in range(1, 40)]
    file_fails(tmp_path, "\n".join(lines) + "\n", "expands to more than 1,000,000 values")


def test_mapping_bomb_is_refused_fast(tmp_path: Path) -> None:
    lines = ["d0: &d0 {k: v}"] + [f"d{i}: &d{i} {{a: *d{i - 1}, b: *d{i - 1}}}" for i in range(1, 60)]
    file_fails(tmp_path, "\n".join(lines) + "\n", "expands to more than 1,000,000 values")


def test_small_laughs_load_and_equal_their_expansion(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, laughs(2, width=2)))
    assert loaded["l2"] == [[["lol"], ["lol"]], [["lol"], ["lol"]]]


@pytest.mark.parametrize("text", [
    "a: &x [*x]\n",
    "a: &x {b: *x}\n",
    "a: &x {b: [c, {d: *x}]}\n",
    "a: &x {<<: *x}\n",
    "a: &x [1, &y [*x]]\n",
])
def test_recursive_anchor_is_refused(tmp_path: Path, text: str) -> None:
    file_fails(tmp_path, text, ":1: alias *x", "inside its own anchor")


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), count=st.integers(1, 8))
def test_yaml_values_are_counted_with_aliases_expanded(tmp_path: Path, data: st.DataObject, count: int) -> None:
    lines: list[str] = []
    anchors: list[Any] = []
    for index in range(count):
        aliases = st.sampled_from(range(index)).map(lambda j: f"*a{j}") if index else st.nothing()
        choices = st.integers(0, 9) | aliases
        items = data.draw(st.lists(choices, max_size=4))
        lines.append(f"a{index}: &a{index} [{', '.join(map(str, items))}]")
        anchors.append([anchors[int(item[2:])] if isinstance(item, str) else item for item in items])
    expected = {f"a{index}": anchor for index, anchor in enumerate(anchors)}
    path = write(tmp_path, "\n".join(lines) + "\n")
    with limits(MAX_VALUES=60):
        if expanded_size(expected) > 60:
            fails(path, str(path), "expands to more than 60 values")
        else:
            assert load_config(path) == expected


def test_recursive_python_structures_are_refused() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    assert fails({"a": {"b": loop}}, "contains itself").path == "a.b[1]"
    ring: dict[str, Any] = {"next": {}}
    ring["next"]["next"] = ring
    assert fails({"ring": ring}, "contains itself").path == "ring.next.next"
    with pytest.raises(ConfigError, match="contains itself"):
        to_plain(loop)


def test_python_bomb_of_shared_lists_is_refused_fast() -> None:
    bomb: Any = ["lol"]
    for _ in range(80):
        bomb = [bomb, bomb]
    error = fails({"x": bomb}, "expands to more than 1,000,000 values", "counts each time it appears")
    assert error.path.startswith("x")


@settings(deadline=None, max_examples=200)
@given(data=st.data(), count=st.integers(1, 8))
def test_python_values_are_counted_with_shared_parts_repeated(data: st.DataObject, count: int) -> None:
    nodes: list[Any] = []
    for _ in range(count):
        choices = st.integers(0, 9) | (st.sampled_from(nodes) if nodes else st.nothing())
        items = data.draw(st.lists(choices, max_size=4))
        nodes.append(items if data.draw(st.booleans()) else {f"k{i}": item for i, item in enumerate(items)})
    config = {"root": nodes[-1], "first": nodes[0]}
    with limits(MAX_VALUES=60):
        if expanded_size(config) > 60:
            fails(config, "expands to more than 60 values")
        else:
            plain = load_config(config)
            assert plain == config
            ids = container_ids(plain)
            assert len(ids) == len(set(ids)), "to_plain returns a tree: shared parts are copied"
            assert not set(ids) & set(container_ids(config))


@pytest.mark.parametrize(("pattern", "text"), [(loading.BOOL_TEXT, "true"), (loading.INT_TEXT, "12"),
                                               (loading._OVERRIDE_KEY, "job.steps")])
def test_the_patterns_end_at_the_end_of_the_text(pattern: Any, text: str) -> None:
    # a YAML plain scalar and a stripped override key cannot end with a newline: only the pattern can show it
    assert pattern.match(text) is not None
    assert pattern.match(text + "\n") is None  # "$" matched before a final newline


def test_omegaconf_interpolation_bomb_is_refused_fast() -> None:
    levels = {"l0": [1, 2], **{f"l{i}": [f"${{l{i - 1}}}", f"${{l{i - 1}}}"] for i in range(1, 60)}}
    fails(OmegaConf.create(levels), "expands to more than 1,000,000 values")


def test_omegaconf_interpolation_to_its_parent_is_refused() -> None:
    error = fails(OmegaConf.create({"a": {"b": "${a}"}}), "cannot resolve the OmegaConf config")
    assert error.path == "a.b"


def test_omegaconf_inside_a_dict_and_missing_values_still_convert() -> None:
    config = OmegaConf.create({"n": 2, "cluster": {"num_nodes": "${n}", "later": "???"}, "xs": [1, "???"]})
    plain = load_config({"outer": config, "t": (1, 2)})
    assert plain == {"outer": {"n": 2, "cluster": {"num_nodes": 2, "later": "???"}, "xs": [1, "???"]}, "t": [1, 2]}
    assert type(plain["outer"]["xs"]) is list


def test_omegaconf_missing_value_used_by_an_interpolation_is_refused() -> None:
    error = fails(OmegaConf.create({"a": "???", "b": "${a}"}), "cannot resolve the OmegaConf config")
    assert error.path == "b"


# -- 3. absurd nesting ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "a: " + "[" * 5000 + "]" * 5000,
    "a: " + "[" * 50000,
    "a: " + "{b: " * 3000 + "}" * 3000,
    "".join(f"{' ' * level}- \n" for level in range(500)),
    "".join(f"{' ' * level}k{level}:\n" for level in range(300)),
])
def test_deep_yaml_is_refused(tmp_path: Path, text: str) -> None:
    file_fails(tmp_path, text, "nested more than 100 levels", "at most 100 levels deep")


@FILE
@given(levels=st.integers(90, 110), flow=st.booleans())
def test_yaml_nesting_limit_counts_the_top_mapping(tmp_path: Path, levels: int, flow: bool) -> None:
    if flow:
        text = "a: " + "[" * levels + "]" * levels + "\n"
    else:
        text = "a:\n" + "".join(f"{' ' * (level + 1)}- \n" for level in range(levels))
    path = write(tmp_path, text)
    if levels + 1 > 100:
        fails(path, f"{path}:", "nested more than 100 levels")
    else:
        assert load_config(path)["a"] == (nested_lists(levels - 1, []) if flow else nested_lists(levels, None))


def test_depth_counts_what_aliases_repeat(tmp_path: Path) -> None:
    text = "x: &x " + "[" * 60 + "]" * 60 + "\ny: " + "[" * 45 + "*x" + "]" * 45 + "\n"
    file_fails(tmp_path, text, ":2: nested more than 100 levels")


def stack_depth() -> int:
    frame: FrameType | None = sys._getframe()
    depth = 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def test_recursion_error_from_a_deep_caller_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "a: " + "[" * 90 + "]" * 90 + "\n")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(stack_depth() + 120)
    try:
        with pytest.raises(ConfigError, match="nested too deeply to read") as caught:
            load_config(path)
    finally:
        sys.setrecursionlimit(limit)
    assert str(path) in str(caught.value)


def test_deep_python_dict_is_refused_with_its_path() -> None:
    error = fails({"a": nested_lists(5000)}, "nested more than 100 levels")
    assert error.path == "a" + "[0]" * 99


@given(levels=st.integers(90, 110))
def test_python_nesting_limit_counts_the_top_mapping(levels: int) -> None:
    config = {"a": nested_lists(levels)}
    if levels + 1 > 100:
        fails(config, "nested more than 100 levels")
    else:
        assert load_config(config) == config


def test_python_depth_counts_shared_parts_where_they_appear() -> None:
    shared = nested_lists(60)
    fails({"x": shared, "y": nested_lists(45, shared)}, "nested more than 100 levels")
    assert load_config({"x": shared, "y": nested_lists(30, shared)})["y"] == nested_lists(30, shared)


# -- 4. the file itself -----------------------------------------------------------------------------


def test_file_that_is_not_utf8_names_offset_and_line(tmp_path: Path) -> None:
    error = file_fails(tmp_path, b"a: 1\nb: caf\xe9\n", "is not UTF-8", "byte 0xe9 at offset 11", "(line 2)")
    assert error.allowed == "save the file as UTF-8"


def test_utf16_file_is_not_utf8(tmp_path: Path) -> None:
    file_fails(tmp_path, "a: 1\n".encode("utf-16"), "is not UTF-8", "at offset 0")


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, b"\xef\xbb\xbfa: 1\n")) == {"a": 1}


@FILE
@given(prefix=st.text(max_size=20), junk=st.binary(min_size=1, max_size=8), suffix=st.binary(max_size=8))
def test_invalid_utf8_anywhere_reports_the_first_bad_offset(tmp_path: Path, prefix: str, junk: bytes,
                                                          suffix: bytes) -> None:
    data = prefix.encode() + junk + suffix
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        file_fails(tmp_path, data, "is not UTF-8", f"at offset {exc.start} ")
    else:
        result = outcome(write(tmp_path, data))
        assert isinstance(result, dict) or "UTF-8" not in str(result)


@pytest.mark.parametrize("name", ["a\0b.yaml", "bad\udcff\ud800.yaml"])
def test_path_the_os_cannot_take_is_config_error(tmp_path: Path, name: str) -> None:
    error = fails(str(tmp_path / name), "cannot read config file")
    assert error.path == ""


def test_file_over_the_limit_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as file:
        file.truncate(64 * 1024 * 1024)  # sparse: no disk used, and parsing it would take minutes
    fails(path, str(path), "is larger than 1 MiB")


def test_file_size_limit_is_exact(tmp_path: Path) -> None:
    text = "a: " + "x" * 60 + "\n"
    with limits(MAX_FILE_BYTES=len(text)):
        assert load_config(write(tmp_path, text)) == {"a": "x" * 60}
        fails(write(tmp_path, text + " "), "is larger than")


def test_missing_file_and_directory_keep_their_errors(tmp_path: Path) -> None:
    fails(tmp_path / "nope.yaml", "cannot read config file", "nope.yaml", "No such file or directory")
    fails(tmp_path, "cannot read config file", "Is a directory")


# -- 5. integers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("literal", "digits"), [
    ("9" * 5000, 5000),
    ("-" + "1" * 31, 31),
    ("!!int " + "7" * 4400, 4400),
    ("!!int 0x" + "f" * 40, 40),
    ("!!int 1_000_000_000_000_000_000_000_000_000_000", 31),
])
def test_long_integer_is_refused_with_file_and_line(tmp_path: Path, literal: str, digits: int) -> None:
    error = file_fails(tmp_path, f"ok: 1\nbig: {literal}\n", ":2:", f"integer with {digits} digits is too large")
    assert error.allowed == "an integer has at most 30 digits"


@FILE
@given(digits=st.text("0123456789", min_size=1, max_size=60).filter(lambda d: d == "0" or d[0] != "0"),
       sign=st.sampled_from(["", "-", "+"]))
def test_integer_literals_up_to_30_digits_load(tmp_path: Path, digits: str, sign: str) -> None:
    path = write(tmp_path, f"n: {sign}{digits}\n")
    if len(digits) > 30:
        fails(path, f"integer with {len(digits)} digits is too large")
    else:
        assert load_config(path) == {"n": int(sign + digits)}


def test_python_integer_too_large_is_refused_with_its_path() -> None:
    error = fails({"cluster": {"num_nodes": 10**5000}}, "integer with more than 30 digits is too large")
    assert error.path == "cluster.num_nodes"
    assert load_config({"n": -(10**30) + 1}) == {"n": -(10**30) + 1}


# -- 6. syntax errors, empty files, bad scalars -----------------------------------------------------


@pytest.mark.parametrize("text", ["a: [1, 2\n", "a: b: c\n", "a: 'open\n", "- a\nb: c\n", "a: 1\n---\nb: 2\n",
                                  "a: \0\n", "a: *nowhere\n", "a: &x 1\nb: &x 2\n", "a: !!python/name:os.system\n",
                                  "? !!set x\n: 1\n", "? [a]\n: 1\n", "a: !!map x\n", "a: !!int {}\n"])
def test_invalid_yaml_names_the_file_and_line(tmp_path: Path, text: str) -> None:
    error = file_fails(tmp_path, text, "is not valid YAML")
    assert "<unicode string>" not in str(error)
    assert f'in "{tmp_path / "config.yaml"}"' in str(error)


@pytest.mark.parametrize("text", ["", "\n\n", "   \n\t\n", "\t", "# only a comment\n", "# a\n\n  # b\n", "\ufeff\n"])
def test_empty_file_says_so(tmp_path: Path, text: str) -> None:
    file_fails(tmp_path, text, "is empty", "must hold a mapping at the top level")


@pytest.mark.parametrize(("text", "kind"), [("- a\n", "list"), ("just text\n", "str"), ("---\n", "NoneType"),
                                            ("7\n", "int")])
def test_top_level_that_is_not_a_mapping_keeps_its_error(tmp_path: Path, text: str, kind: str) -> None:
    assert file_fails(tmp_path, text, "must hold a mapping at the top level").value == kind


@pytest.mark.parametrize(("scalar", "tag"), [
    ("2024-13-45", "timestamp"),
    ("!!timestamp soon", "timestamp"),
    ("!!int abc", "int"),
    ("!!int ''", "int"),
    ("!!float x", "float"),
    ("!!float ''", "float"),
    ("!!bool maybe", "bool"),
])
def test_scalar_its_tag_cannot_hold_names_the_line(tmp_path: Path, scalar: str, tag: str) -> None:
    file_fails(tmp_path, f"a: 1\nb: {scalar}\n", ":2: cannot read", f"as {tag}")


yaml_pieces = st.sampled_from([
    "a", "b", ":", ": ", " ", "  ", "\n", "- ", "[", "]", "{", "}", ",", "? ", "&x ", "*x", "&y ", "*y", "<<: ",
    "!!int ", "!!bool ", "!!float ", "!!timestamp ", "!!binary ", "!!set ", "!!omap ", "!!map ", "!!seq ", "!!str ",
    "'", '"', "#", "1", "99999999999999999999999999999999", "2024-13-45", "yes", "true", "~", "---\n", "...\n",
    "%YAML 1.1\n", "|\n", ">\n", "\t", "\\", "\0", "\x85", "\ufeff", "é",
])


@FILE
@given(text=st.lists(yaml_pieces, max_size=40).map("".join) | st.text(max_size=60))
def test_any_text_loads_or_is_a_config_error(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    result = outcome(path)
    if isinstance(result, ConfigError):
        assert str(path) in str(result)
        assert "set_int_max_str_digits" not in str(result)


@FILE
@given(data=st.binary(max_size=80))
def test_any_bytes_load_or_are_a_config_error(tmp_path: Path, data: bytes) -> None:
    outcome(write(tmp_path, data))


# -- 7. booleans the YAML 1.2 way -------------------------------------------------------------------


@pytest.mark.parametrize(("word", "value"), [(w, True) for w in ("true", "True", "TRUE")] +
                         [(w, False) for w in ("false", "False", "FALSE")])
def test_yaml_12_booleans(tmp_path: Path, word: str, value: bool) -> None:
    assert load_config(write(tmp_path, f"v: {word}\n{word}: k\n")) == {"v": value, value: "k"}


@pytest.mark.parametrize("word", ["yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF",
                                  "y", "Y", "n", "N", "tRUE", "fAlse"])
def test_yaml_11_booleans_stay_strings(tmp_path: Path, word: str) -> None:
    assert load_config(write(tmp_path, f"v: {word}\n{word}: k\nl: [{word}]\n")) == {"v": word, word: "k", "l": [word]}


@FILE
@given(word=st.from_regex(r"[A-Za-z]{1,6}", fullmatch=True))
def test_a_plain_word_is_a_string_unless_a_12_boolean_or_null(tmp_path: Path, word: str) -> None:
    loaded = load_config(write(tmp_path, f"v: {word}\n"))["v"]
    if word in ("true", "True", "TRUE", "false", "False", "FALSE"):
        assert loaded is (word.lower() == "true")
    elif word in ("null", "Null", "NULL"):
        assert loaded is None
    else:
        assert loaded == word


scalars = (st.none() | st.booleans() | st.integers(-(10**30) + 1, 10**30 - 1)
           | st.floats(allow_nan=False) | st.text(max_size=12))
documents = st.dictionaries(
    st.text(max_size=8),
    st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                     max_size=3), max_leaves=12),
    max_size=5,
)


@FILE
@given(document=documents)
def test_whatever_safe_dump_writes_loads_back_unchanged(tmp_path: Path, document: dict[str, Any]) -> None:
    assert load_config(write(tmp_path, yaml.safe_dump(document) if document else "{}\n")) == document


# -- 8. what load_config accepts --------------------------------------------------------------------


@pytest.mark.parametrize("source", [None, 3, 1.5, [1, 2], (1,), b"config.yaml", object()])
def test_load_config_of_something_else_is_config_error(source: Any) -> None:
    error = fails(source, "a config is a YAML file path, a mapping or an OmegaConf DictConfig")
    assert error.value == type(source).__name__


def test_to_plain_copies_tuples_and_mappings_and_keeps_scalars() -> None:
    marker = object()
    source = {"a": (1, [2, {"b": marker}]), "c": "x"}
    plain = to_plain(source)
    assert plain == {"a": [1, [2, {"b": marker}]], "c": "x"}
    assert plain["a"][1][1]["b"] is marker
    assert to_plain(7) == 7
