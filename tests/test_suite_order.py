"""The order the suite runs in: tox's ``fake`` env hands whole files to two pytest processes in the order
collected (pytest-xdist's ``--dist loadfile --no-loadscope-reorder``), and tests/conftest.py collects the slowest
files first (``SLOWEST_FIRST``); every file it names exists, and the rest keep the order pytest found them in."""

from __future__ import annotations

import configparser
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import SLOWEST_FIRST, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Item:
    """What the ordering hook reads of a collected test: its id and its markers."""

    nodeid: str
    markers: list[Any] = field(default_factory=list)

    def get_closest_marker(self, name: str) -> Any:
        return next((marker for marker in self.markers if marker.name == name), None)

    def add_marker(self, marker: Any) -> None:
        self.markers.append(marker)


def test_every_file_named_slowest_first_is_a_test_file_of_the_suite() -> None:
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST), SLOWEST_FIRST
    for path in SLOWEST_FIRST:
        assert path.startswith("tests/"), path
        assert Path(path).name.startswith("test_"), path
        assert (ROOT / path).is_file(), path


def test_the_slowest_files_come_first_in_their_order_and_the_rest_as_found() -> None:
    found = ["tests/a/test_x.py::test_1", f"{SLOWEST_FIRST[1]}::test_b[ray]", "tests/a/test_x.py::test_2",
             f"{SLOWEST_FIRST[0]}::test_a", f"{SLOWEST_FIRST[1]}::test_b[processes]", "tests/test_y.py::test_3"]
    items = [Item(nodeid) for nodeid in found]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [found[3], found[1], found[4], found[0], found[2], found[5]]


def test_the_fake_env_distributes_whole_files_in_the_collected_order() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    command = tox["testenv:fake"]["commands"].strip()
    assert command.startswith("pytest {posargs:"), command
    assert command.endswith("}"), command
    args = shlex.split(command[len("pytest {posargs:"):-1])
    assert args[args.index("--dist") + 1] == "loadfile", args
    assert "--no-loadscope-reorder" in args, args
    assert int(args[args.index("-n") + 1]) >= 2, args
