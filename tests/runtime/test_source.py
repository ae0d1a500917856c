"""The source process's side of a weight sync (hwplace.runtime.weight_sync.source), without Ray: what runs
beside a version being laid down."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from hwplace.planning.sync_plan import TRANSPORTS
from hwplace.runtime.weight_sync.source import Source

NO_LINKS: dict[str, list[Any]] = {name: [] for name in TRANSPORTS}


def noted_in(path: Path) -> None:
    path.write_text("2")


@pytest.mark.time_limit(120)
def test_a_process_forked_from_a_source_notes_its_versions_on_a_thread_of_its_own(tmp_path: Path) -> None:
    noted: list[int] = []
    source = Source("forked", None, 1 << 20)
    try:
        source.publish(1, {}, NO_LINKS, noting=lambda: noted.append(1))  # the source's note thread starts
        assert noted == [1]
        child = os.fork()
        if child == 0:  # the child: the thread it inherited the pool of does not exist here
            try:
                source.publish(2, {}, NO_LINKS, noting=lambda: noted_in(tmp_path / "noted"))
            finally:
                os._exit(0)
        deadline = time.monotonic() + 60
        while os.waitpid(child, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                pytest.fail("the forked child's publish never noted its version: its note thread was its parent's")
            time.sleep(0.02)
        assert (tmp_path / "noted").read_text() == "2"
    finally:
        source.close()
