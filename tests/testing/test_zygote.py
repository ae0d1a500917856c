"""A process cluster's zygote (hwplace/testing/processes/zygote.py, forked.py): workers forked from a process that
imported what they need, each as a new interpreter started then would be (its node's environment, the driver's
folder and standard streams, random numbers of its own), exit codes reported as subprocess reports them, a new
interpreter where one would start differently, and nothing left running when the zygote ends."""

from __future__ import annotations

import os
import random
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pids import running

import hwplace
from hwplace.testing import process_cluster
from hwplace.testing.processes.forked import ForkedProcess, Zygote
from hwplace.testing.processes.wire import child_env

pytestmark = pytest.mark.time_limit(120)

PRELOADED = "xml.dom.minidom"  # nothing else here imports it


class Probe(hwplace.Worker):
    def __init__(self) -> None:
        self.had_preloaded = PRELOADED in sys.modules  # before anything of this worker's ran

    def about(self) -> dict[str, object]:
        return {"parent": os.getppid(), "preloaded": self.had_preloaded, "cwd": os.getcwd(),
                "node": os.environ.get("HWPLACE_NODE_RANK"), "random": random.random()}

    def say(self, text: str) -> None:
        print(text, flush=True)
        print(text, file=sys.stderr, flush=True)


@pytest.fixture
def silent_driver() -> Iterator[socket.socket]:
    """A listening socket that accepts and never answers: a child dialling it waits in the handshake."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def start_for(server: socket.socket) -> tuple[tuple[str, int], bytes, str]:
    return server.getsockname(), b"key", "worker-id"


def test_workers_fork_from_the_zygote_as_new_interpreters_would_start(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capfd: pytest.CaptureFixture[str]) -> None:
    with process_cluster(2, 1, preload=[PRELOADED]) as cluster:
        monkeypatch.chdir(tmp_path)
        group = Probe.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 1]), name="probe")
        first, second = group.about().wait()
        assert first["parent"] == second["parent"] != os.getpid()  # the zygote's children, not the driver's
        assert first["preloaded"]
        assert second["preloaded"]
        assert [first["node"], second["node"]] == ["0", "1"]
        assert first["cwd"] == second["cwd"] == str(tmp_path)
        assert first["random"] != second["random"]
        group.execute_on(1).say("written by a forked worker").wait()
        out, err = capfd.readouterr()
        assert "written by a forked worker" in out
        assert "written by a forked worker" in err


def test_without_a_zygote_every_worker_is_a_new_interpreter_of_the_driver() -> None:
    with process_cluster(1, 1, preload=None) as cluster:
        group = Probe.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="probe")
        [about] = group.about().wait()
        assert about["parent"] == os.getpid()
        assert not about["preloaded"]


def test_exit_codes_come_back_as_subprocess_gives_them(silent_driver: socket.socket) -> None:
    zygote = Zygote(())
    try:
        refused = zygote.fork(child_env({}), (("127.0.0.1", 1), b"key", "nobody"))  # no one listens there
        assert isinstance(refused, ForkedProcess)
        assert refused.wait(60) == 1  # the child's error, printed, then exit code 1
        waiting = zygote.fork(child_env({}), start_for(silent_driver))
        assert isinstance(waiting, ForkedProcess)
        assert waiting.poll() is None
        waiting.kill()
        assert waiting.wait(60) == -signal.SIGKILL
    finally:
        zygote.stop()


def test_a_worker_that_would_start_differently_is_not_forked(silent_driver: socket.socket) -> None:
    zygote = Zygote(())
    try:
        assert zygote.fork({**child_env({}), "PYTHONOPTIMIZE": "2"}, start_for(silent_driver)) is None
        assert zygote._process is None  # refused before a zygote was started for it
        assert zygote.fork({**child_env({}), "LD_PRELOAD": "libnothing.so"}, start_for(silent_driver)) is None
        forked = zygote.fork({**child_env({}), "ANY_OTHER": "1"}, start_for(silent_driver))
        assert zygote.fork({**child_env({}), "PYTHONOPTIMIZE": "2"}, start_for(silent_driver)) is None  # running
        assert forked is not None
        forked.kill()
        forked.wait(60)
    finally:
        zygote.stop()


def test_when_the_zygote_ends_its_children_end_and_the_next_fork_starts_a_new_one(
        silent_driver: socket.socket) -> None:
    zygote = Zygote(())
    try:
        child = zygote.fork(child_env({}), start_for(silent_driver))
        assert child is not None
        first = zygote._process
        assert first is not None
        first.kill()  # the zygote alone
        assert child.wait() == -signal.SIGKILL  # no timeout of its own: the module's limit is around it
        assert not running(child.pid)
        again = zygote.fork(child_env({}), start_for(silent_driver))
        assert again is not None
        assert zygote._process is not first
        again.kill()
        assert again.wait() == -signal.SIGKILL
    finally:
        zygote.stop()


def test_preload_names_what_it_cannot_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"preload: no module named 'no_such_module_here' here"):
        hwplace.testing.ProcessExecutor(1, preload=["no_such_module_here"])
    with pytest.raises(hwplace.ConfigError, match=r"preload: no module named 'no_such_package_here.module' here"):
        hwplace.testing.ProcessExecutor(1, preload=["json", "no_such_package_here.module"])
    with pytest.raises(hwplace.ConfigError, match="names of modules"):
        hwplace.testing.ProcessExecutor(1, preload="torch")
    (tmp_path / "breaks_on_import.py").write_text("raise RuntimeError('this module refuses to load')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with process_cluster(1, 1, preload=["breaks_on_import"]) as cluster, \
            pytest.raises(hwplace.ConfigError, match=r"preload: the process cluster's zygote could not import"):
        Probe.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="probe")
