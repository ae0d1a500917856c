"""The fake env's shards (.ci/shards.py) run the whole suite once: every path the named shards list exists, no
two list the same or one inside another, and the last runs everything else."""

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
    *named, rest = shards.SHARDS.values()
    assert named == list(shards.NAMED.values())
    paths = [path for selection in named for path in selection]
    assert all((ROOT / path).exists() for path in paths), paths
    assert all(path.startswith("tests/") for path in paths)
    assert not [(a, b) for a in paths for b in paths if a != b and (a + "/").startswith(b.rstrip("/") + "/")]
    assert len(set(paths)) == len(paths)
    assert rest[0] == "tests"
    assert sorted(rest[1:]) == sorted(f"--ignore={path}" for path in paths)
