"""How the Ray executor reaches Ray: addresses checked at once, an embedded local Ray started in a fresh process."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from drivers import run_driver

import hwplace
from hwplace_plugins.ray.connect import check_reachable
from hwplace_plugins.ray.pytest_plugin import LocalRay

pytest.importorskip("ray")


def test_a_listening_address_passes() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")


def test_a_closed_port_fails_at_once() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    with pytest.raises(hwplace.ConfigError, match=rf"^cluster\.address: nothing answers at 127\.0\.0\.1:{port} "
                       r"\(Connection refused\); the address of a running Ray head"):
        check_reachable(f"127.0.0.1:{port}")


@pytest.mark.parametrize("address", ["head", "head:", ":6379", "head:port"])
def test_an_address_that_is_not_host_port_is_refused(address: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=rf"^cluster\.address: '{address}' is not host:port; 'auto', "):
        check_reachable(address)


def run_fresh(code: str) -> dict[str, object]:
    """Run ``code`` in a new Python process that sees no Ray of this machine, and return the JSON it prints last.

    No ``RAY_ADDRESS``, and a Ray temp folder of its own (kept short: it holds Unix sockets), so that a Ray
    running beside the tests is neither found nor disturbed.
    """
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="hwr", dir="/tmp")
    try:
        result: dict[str, object] = run_driver(code, timeout=120, env=env)
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    return result


@pytest.mark.parametrize("address", [None, "local"])
def test_without_a_running_ray_an_embedded_one_starts_and_this_machine_is_discovered(address: str | None) -> None:
    result = run_fresh(
        "import json, ray, hwplace\n"
        f"cluster = hwplace.Cluster({{'num_nodes': 1, 'address': {address!r}}})\n"
        "node = cluster.nodes[0]\n"
        "print(json.dumps({'ray': ray.is_initialized(), 'id': node.node_id == ray.get_runtime_context().get_node_id(),"
        " 'kinds': sorted(node.hardware)}))\n")
    assert result == {"ray": True, "id": True, "kinds": ["node"]}


def test_without_ray_installed_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    with pytest.raises(hwplace.ConfigError, match=r"^cluster\.executor: the Ray executor needs Ray, which is not "
                       r"installed \(.*\); pip install 'hwplace\[ray\]'$"):
        hwplace.Cluster({"num_nodes": 1})


@pytest.mark.parametrize("address", ["127.0.0.1:1", "local"])
def test_a_connected_driver_refuses_an_address_that_is_not_its_cluster(hwplace_local_ray: LocalRay,
                                                                       address: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^cluster\.address: this process is already connected to the Ray "
                       rf"cluster at {re.escape(hwplace_local_ray.address)}, so it cannot "):
        hwplace.Cluster({"num_nodes": 1, "address": address})
    assert hwplace.Cluster({"num_nodes": 1, "address": hwplace_local_ray.address}).num_nodes == 1


NO_HWPLACE_ON_THE_NODES = """
import json, os, sys
import hwplace
from hwplace.testing import local_ray_cluster

# The nodes' workers find this folder first on their PYTHONPATH: a hwplace that is not there, as on nodes
# whose Python environment lacks it (the driver imported the real one before the variable was set).
os.environ["PYTHONPATH"] = sys.argv[1]
with local_ray_cluster(1):
    try:
        hwplace.Cluster({"num_nodes": 1})
        print(json.dumps({"error": None}))
    except hwplace.ConfigError as exc:
        print(json.dumps({"error": str(exc)}))
"""


@pytest.mark.time_limit(180)
def test_a_cluster_whose_workers_cannot_import_hwplace_is_an_error_that_says_so(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "hwplace").mkdir(parents=True)
    (tmp_path / "nodes" / "hwplace" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'hwplace'\", name='hwplace')\n")
    error = run_driver(NO_HWPLACE_ON_THE_NODES, str(tmp_path / "nodes"), timeout=150, cwd=tmp_path)["error"]
    assert re.match(r"cluster: the workers of Ray node \w+ \([\d.]+\) cannot import hwplace \(ModuleNotFoundError: "
                    r"No module named 'hwplace'\): .*; install hwplace .* in the Python environment each node's "
                    r"'ray start' runs in", error), error


@pytest.mark.parametrize(("extra", "found"), [
    ({}, r"RAY_AUTH_TOKEN and RAY_AUTH_TOKEN_PATH are not set, and there is no \S+/\.ray/auth_token"),
    ({"RAY_AUTH_TOKEN_PATH": "{home}/elsewhere"}, r"RAY_AUTH_TOKEN is not set, and RAY_AUTH_TOKEN_PATH names a "
                                                  r"file, but there is no \S+/elsewhere"),
])
@pytest.mark.parametrize("command", [["status"], ["run", "job.yaml", "--nodes", "1x1"]])
def test_token_mode_without_a_token_is_refused_before_ray_starts(tmp_path: Path, command: list[str],
                                                                  extra: dict[str, str], found: str) -> None:
    # Ray's own answer: a native "you have likely discovered a bug in Ray" report, or a head that never starts
    (tmp_path / "quick.py").write_text("def main(job):\n    return 1\n")
    (tmp_path / "job.yaml").write_text("job: {entrypoint: quick.py:main}\n"
                                       "cluster: {num_nodes: 1, component_placement: {a: 0}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({"RAY_AUTH_MODE": "token", "HOME": str(tmp_path)},
               **{k: v.format(home=tmp_path) for k, v in extra.items()})
    done = subprocess.run([sys.executable, "-m", "hwplace", *command], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert re.fullmatch(r"hwplace: error: RAY_AUTH_MODE: is 'token' \(Ray's token authentication\), but this "
                        rf"process has no token: {found}; give it the cluster's token: .*\n", done.stderr), done.stderr
    assert "Traceback" not in done.stderr


def test_status_errors_name_its_own_option_and_never_an_embedded_ray() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a fresh process: connected to no Ray
    done = subprocess.run([sys.executable, "-m", "hwplace", "status", "--address", f"127.0.0.1:{port}"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith(f"hwplace: error: --address: nothing answers at 127.0.0.1:{port} ("), done.stderr
    assert "hwplace status never starts a cluster" in done.stderr
    assert "cluster.address" not in done.stderr  # a job config's words
    assert "embedded" not in done.stderr
