"""The fake env's two shards (.ci/shards.py) run the whole suite once: every path the first names exists, and the
second runs everything else."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_shards():
    spec = importlib.util.spec_from_file_location("shards", ROOT / ".ci" / "shards.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shards_split_the_suite_without_a_gap_or_an_overlap() -> None:
    shards = load_shards()
    first, second = shards.SHARDS.values()
    assert first == shards.ONE
    assert all((ROOT / path).exists() for path in first), first
    assert second[0] == "tests"
    assert sorted(second[1:]) == sorted(f"--ignore={path}" for path in first)
    assert all(path.startswith("tests/") for path in first)
