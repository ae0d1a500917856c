"""hwplace.testing.local_ray_cluster and the pytest plugin, around the session's local Ray cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from drivers import run_driver

import hwplace
from hwplace.testing import local_ray_cluster
from hwplace_plugins.ray.pytest_plugin import LocalRay

ray = pytest.importorskip("ray")


def test_the_session_cluster_has_the_configured_shape(hwplace_local_ray: LocalRay) -> None:
    assert (hwplace_local_ray.num_nodes, hwplace_local_ray.accelerators_per_node) == (2, 4)
    assert ray.is_initialized()
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2


def test_a_second_local_cluster_in_a_connected_process_is_refused(hwplace_local_ray: LocalRay) -> None:
    with pytest.raises(hwplace.ConfigError, match="local_ray_cluster: this process is already connected to Ray"), \
            local_ray_cluster():
        pass


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_nodes": 0}, r"num_nodes: must be an integer from 1 to"),
    ({"accelerators_per_node": [1, 2, 3]}, r"accelerators_per_node: gives 3 counts for num_nodes=2"),
    ({"accelerators_per_node": -1}, r"accelerators_per_node: -1 is not a count"),
    ({"cpus_per_node": 0}, r"cpus_per_node: must be a positive integer"),
])
def test_bad_shapes_are_refused_before_ray_starts(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=message), local_ray_cluster(**kwargs):  # type: ignore[arg-type]
        pass


def child_processes() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[1] == str(os.getpid()) and fields[0] != "Z":
                found.add(int(entry))
    return found


@pytest.mark.parametrize("value", [1.5, None, ["a"], {"b": 1}])
def test_a_non_string_environment_value_is_refused_naming_its_key_before_ray_starts(value: object) -> None:
    before = child_processes()
    with pytest.raises(hwplace.ConfigError, match=r"^env_vars\.FOO: "), \
            local_ray_cluster(1, env_vars={"FOO": value}):  # type: ignore[dict-item]
        pass
    assert child_processes() <= before  # nothing started, nothing left behind


def test_the_pytest_plugin_loads_without_importing_ray() -> None:
    code = "import sys, hwplace_plugins.ray.pytest_plugin; print('ray' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_the_pytest_plugin_is_registered_for_any_suite() -> None:
    from importlib.metadata import entry_points

    found = [ep.value for ep in entry_points(group="pytest11") if ep.name == "hwplace-ray"]
    assert found == ["hwplace_plugins.ray.pytest_plugin"]


INTERRUPTED_START = r"""
import json, os, signal, threading, time
import hwplace

# Ctrl-C as a terminal delivers it: a suite started in the background by a shell ignores SIGINT, and so would
# this interpreter, which inherits that.
signal.signal(signal.SIGINT, signal.default_int_handler)

def children():
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[1] == str(os.getpid()) and fields[0] != "Z":
                found.add(int(entry))
    return found
from hwplace.testing import local_ray_cluster

def raylets():
    return [p for p in children() if open(f"/proc/{p}/comm").read().strip() == "raylet"]

def interrupt_when_node_1_starts():
    while len(raylets()) < 2:
        time.sleep(0.01)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

threading.Thread(target=interrupt_when_node_1_starts, daemon=True).start()
found = {}
try:
    with local_ray_cluster(4):  # two more nodes to start after node 1: time for the interrupt on a loaded machine
        found["started"] = True
except KeyboardInterrupt:
    found["interrupted"] = True
time.sleep(1)
left = []
for pid in children():  # zombies are not counted (their parent reaps them at its exit)
    try:
        left.append(open(f"/proc/{pid}/comm").read().strip())
    except OSError:
        pass
found["left"] = left
print(json.dumps(found))
"""


@pytest.mark.time_limit(150)
def test_a_start_interrupted_while_a_worker_node_starts_leaves_no_ray_process() -> None:
    # SIGINT reaches the driver once node 1's raylet runs, before the node is up: Ray does not track it yet.
    found = run_driver(INTERRUPTED_START, timeout=120)
    assert found == {"interrupted": True, "left": []}
