"""A module's names loaded on first use (PEP 562), the way hwplace's faces and ``runtime.deferred`` give theirs."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from hwplace.foundation.lazy import on_first_use


@pytest.fixture
def face() -> Iterator[types.ModuleType]:
    module = types.ModuleType("hwplace_face_under_test")
    module.__getattr__ = on_first_use(module.__name__, {  # type: ignore[method-assign]
        "dumps": "json", "loads_json": "json:loads", "decoder": "hwplace_face_under_test.decoder"})
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_a_name_is_loaded_from_its_home_on_first_use_and_kept(face: types.ModuleType) -> None:
    import json

    assert "dumps" not in vars(face)
    assert face.dumps is json.dumps
    assert vars(face)["dumps"] is json.dumps  # kept: the next use does not come back to __getattr__
    assert face.loads_json is json.loads  # another name there


def test_a_name_whose_home_is_the_module_of_that_name_is_that_module(face: types.ModuleType) -> None:
    decoder = types.ModuleType("hwplace_face_under_test.decoder")
    sys.modules[decoder.__name__] = decoder
    try:
        assert face.decoder is decoder
    finally:
        del sys.modules[decoder.__name__]


def test_a_name_it_does_not_give_is_an_attribute_error_naming_the_module(face: types.ModuleType) -> None:
    with pytest.raises(AttributeError, match="module 'hwplace_face_under_test' has no attribute 'dump'"):
        face.dump  # noqa: B018
