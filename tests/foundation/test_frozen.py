"""hwplace.frozen: the read-only mapping behind Device.properties and Placement.env, and freeze()."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwplace.foundation.frozen import FrozenDict, freeze

MUTATIONS: dict[str, Callable[[FrozenDict[str, Any]], object]] = {
    "setitem": lambda d: d.__setitem__("a", 9),
    "setitem-new": lambda d: d.__setitem__("new", 9),
    "delitem": lambda d: d.__delitem__("a"),
    "clear": lambda d: d.clear(),
    "pop": lambda d: d.pop("a"),
    "pop-default": lambda d: d.pop("missing", None),
    "popitem": lambda d: d.popitem(),
    "setdefault": lambda d: d.setdefault("new", 1),
    "setdefault-existing": lambda d: d.setdefault("a"),
    "update": lambda d: d.update({"a": 9}),
    "update-kwargs": lambda d: d.update(b=2),
    "update-empty": lambda d: d.update(),
    "ior": lambda d: d.__ior__({"a": 9}),
}


@pytest.mark.parametrize("mutate", MUTATIONS.values(), ids=list(MUTATIONS))
def test_every_mutating_method_raises_and_changes_nothing(mutate: Callable[[FrozenDict[str, Any]], object]) -> None:
    frozen = FrozenDict({"a": 1})
    with pytest.raises(TypeError, match=r"^FrozenDict is read-only; copy it with dict\(\.\.\.\) to change it$"):
        mutate(frozen)
    assert frozen == {"a": 1}


def test_augmented_or_assignment_is_refused() -> None:
    frozen: FrozenDict[str, int] = FrozenDict({"a": 1})
    alias = frozen
    with pytest.raises(TypeError, match="read-only"):
        frozen |= {"b": 2}
    assert alias == {"a": 1}


def test_or_builds_a_new_plain_dict() -> None:
    frozen = FrozenDict({"a": 1})
    merged = frozen | {"b": 2}
    assert merged == {"a": 1, "b": 2}
    assert frozen == {"a": 1}


def test_it_reads_like_a_dict() -> None:
    frozen = FrozenDict({"a": 1, "b": [2]})
    assert isinstance(frozen, dict)
    assert frozen["a"] == 1
    assert frozen.get("c", 3) == 3
    assert list(frozen) == ["a", "b"]
    assert frozen == {"a": 1, "b": [2]}
    assert repr(frozen) == "FrozenDict({'a': 1, 'b': [2]})"
    assert json.dumps(frozen) == '{"a": 1, "b": [2]}'


def test_no_instance_dict_to_sneak_attributes_in() -> None:
    frozen = FrozenDict({"a": 1})
    with pytest.raises(AttributeError, match="no attribute"):
        frozen.extra = 1  # type: ignore[attr-defined]


def test_hash_is_by_content_and_order_free() -> None:
    a = FrozenDict({"x": 1, "y": (2, 3)})
    b = FrozenDict({"y": (2, 3), "x": 1})
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b, FrozenDict({"x": 2})}) == 2
    assert {a: "found"}[b] == "found"


def test_unhashable_values_make_it_unhashable() -> None:
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        hash(FrozenDict({"x": [1]}))


def test_pickle_round_trip_keeps_type_and_content() -> None:
    frozen = FrozenDict({"a": 1, "nested": FrozenDict({"b": (1, 2)})})
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(frozen, protocol=protocol))
        assert type(again) is FrozenDict
        assert type(again["nested"]) is FrozenDict
        assert again == frozen
        with pytest.raises(TypeError, match="read-only"):
            again["a"] = 2


def test_deepcopy_and_copy_stay_frozen() -> None:
    inner = [1, 2]
    frozen = FrozenDict({"a": inner})
    deep = copy.deepcopy(frozen)
    shallow = copy.copy(frozen)
    for again in (deep, shallow):
        assert type(again) is FrozenDict
        assert again == frozen
        with pytest.raises(TypeError, match="read-only"):
            again["a"] = []
    assert deep["a"] is not inner
    assert shallow["a"] is inner


def test_dict_of_it_is_a_mutable_copy() -> None:
    frozen = FrozenDict({"a": 1})
    mutable = dict(frozen)
    assert type(mutable) is dict
    mutable["a"] = 2
    mutable["b"] = 3
    assert frozen == {"a": 1}
    assert mutable == {"a": 2, "b": 3}


# -- freeze ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scalar", ["s", 0, -5, 1.5, True, False, None])
def test_scalars_are_returned_as_they_are(scalar: Any) -> None:
    assert freeze(scalar) is scalar


def test_mappings_become_frozen_dicts_and_lists_tuples_all_the_way_down() -> None:
    frozen = freeze({"a": [1, {"b": [2]}], "c": ({"d": None},)})
    assert frozen == {"a": (1, {"b": (2,)}), "c": ({"d": None},)}
    assert type(frozen) is FrozenDict
    assert type(frozen["a"]) is tuple
    assert type(frozen["a"][1]) is FrozenDict
    assert type(frozen["a"][1]["b"]) is tuple
    assert type(frozen["c"][0]) is FrozenDict


def test_an_already_frozen_dict_is_kept() -> None:
    frozen = FrozenDict({"a": 1})
    assert freeze(frozen) is frozen


def test_freeze_copies_so_later_changes_do_not_leak_in() -> None:
    source: dict[str, Any] = {"a": [1], "b": {"c": 1}}
    frozen = freeze(source)
    source["a"].append(2)
    source["b"]["c"] = 2
    source["new"] = 1
    assert frozen == {"a": (1,), "b": {"c": 1}}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (object(), r"^value is a object; allowed: strings, numbers, booleans, None, and lists or string-keyed "
                   r"mappings of those$"),
        ({1: "x"}, r"^value: key 1 is not a string$"),
        ({"a": {None: 1}}, r"^value\['a'\]: key None is not a string$"),
        ({"a": [1, {2}]}, r"^value\['a'\]\[1\] is a set;"),
        ([b"x"], r"^value\[0\] is a bytes;"),
        ((1, (2, 3j)), r"^value\[1\]\[1\] is a complex;"),
        ({"a": {"b": frozenset()}}, r"^value\['a'\]\['b'\] is a frozenset;"),
    ],
)
def test_non_json_values_are_refused_naming_where(value: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        freeze(value)


def test_where_prefixes_the_path() -> None:
    with pytest.raises(TypeError, match=r"^cfg\.port\['ids'\]\[2\] is a bytearray;"):
        freeze({"ids": [0, 1, bytearray()]}, "cfg.port")


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)


def is_deep_frozen(value: Any) -> bool:
    if isinstance(value, dict):
        return type(value) is FrozenDict and all(is_deep_frozen(v) for v in value.values())
    if isinstance(value, list):
        return False
    if isinstance(value, tuple):
        return all(is_deep_frozen(v) for v in value)
    return True


@given(json_like)
def test_freeze_any_json_like_value(value: Any) -> None:
    frozen = freeze(value)
    assert is_deep_frozen(frozen)
    assert json.loads(json.dumps(frozen)) == json.loads(json.dumps(value))
    assert freeze(frozen) == frozen
    again = pickle.loads(pickle.dumps(frozen))
    assert again == frozen
    assert is_deep_frozen(again)
    hash(frozen)
