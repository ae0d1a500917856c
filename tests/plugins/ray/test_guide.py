"""The multi-node guide (docs/guide.md, sections 4 and 5) with the pinned Ray, on one machine: a head and a
worker node started with ``ray start`` (their own ports and temp folders, Ray's token authentication on), a job
run by ``hwplace run`` against the head's address, a driver without the token refused with the reason.

The nodes run with ``--block`` in sessions of their own and are stopped by SIGTERM to those commands, which end
their own Ray processes: nothing else on this machine is touched (``ray stop`` would stop every Ray here).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[3]
RAY = str(Path(sys.executable).with_name("ray"))


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def node_options(folder: Path) -> list[str]:
    """Ports of the node's own (Ray's defaults are fixed numbers another Ray here may hold) and its temp folder."""
    agent, grpc, metrics, env_agent, manager, objects = free_ports(6)
    return [f"--temp-dir={folder}", "--num-cpus=2", f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={grpc}", f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={env_agent}", f"--node-manager-port={manager}",
            f"--object-manager-port={objects}", "--block"]


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[tuple[str, str, dict[str, str]]]:
    """A head (rank 0) and a worker node (rank 1) as the guide starts them; yields the address, the token and the
    environment of a driver elsewhere (no token file of its own)."""
    folder = Path(tempfile.mkdtemp(prefix="hwg", dir="/tmp"))  # short: Ray's socket paths live below it
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    base.update(RAY_TMPDIR=str(folder), HWPLACE_FAKE_ACCELERATORS="4", RAY_AUTH_MODE="token")
    head_env = {**base, "HOME": str(folder / "head-home")}  # its own ~/.ray/auth_token, made by the guide's step
    token = subprocess.run([RAY, "get-auth-token", "--generate"], env=head_env, capture_output=True, text=True,
                           timeout=60, check=True).stdout.strip()
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        start_node(lambda: [RAY, "start", "--head", f"--port={port}", "--include-dashboard=false",
                            *node_options(folder / "head")], {**head_env, "HWPLACE_NODE_RANK": "0"},
                   folder / "head", started)
        wait_for(address, head_env, 1)
        worker_env = {**base, "HOME": str(folder / "worker-home"), "RAY_AUTH_TOKEN": token, "HWPLACE_NODE_RANK": "1"}
        start_node(lambda: [RAY, "start", f"--address={address}", *node_options(folder / "worker")], worker_env,
                   folder / "worker", started)
        wait_for(address, head_env, 2)
        driver_env = {**base, "HOME": str(folder / "driver-home")}
        yield address, token, driver_env
    finally:
        for process in started:
            process.send_signal(signal.SIGTERM)  # `ray start --block` ends the Ray processes it started
        grace = time.monotonic() + 5  # the head, with a worker node attached, takes about 30 s to end its own
        for process in started:
            try:
                process.wait(timeout=max(0.1, grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # its session: the node's Ray processes (start_new_session)
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)


COUNT_NODES = """
import sys, time, ray
ray.init(address=sys.argv[1])
for _ in range(240):
    if sum(n["Alive"] for n in ray.nodes()) >= int(sys.argv[2]):
        break
    time.sleep(0.5)
print(sum(n["Alive"] for n in ray.nodes()))
"""


RAY_GAVE_UP = "The current node timed out during startup"  # Ray's own 30 s for a raylet to register with the GCS
ATTEMPTS = 3


def start_node(command: Callable[[], list[str]], env: dict[str, str], name: Path,
               started: list[subprocess.Popen[bytes]]) -> None:
    """Run ``ray start`` (``command()``: fresh ports each time) until its log says the node runs. Where Ray gave up
    on its own fixed 30 s for the node to register (a machine loaded by other tests can outlast it), that attempt's
    processes are ended (its session) and it starts again, up to ``ATTEMPTS`` times; any other failure fails."""
    for attempt in range(1, ATTEMPTS + 1):
        log = name.with_name(f"{name.name}-{attempt}.log")
        with open(log, "wb") as out:
            process = subprocess.Popen(command(), env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        started.append(process)
        for _ in range(240):
            text = log.read_text(errors="replace")
            if "Ray runtime started" in text or "Error" in text or "Exception" in text:
                break
            time.sleep(0.5)
        if "Ray runtime started" in text:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)  # its traceback written whole
        text = log.read_text(errors="replace")
        if RAY_GAVE_UP not in text or attempt == ATTEMPTS:
            pytest.fail(f"the Ray node did not start (attempt {attempt}):\n{text[-3000:]}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its session: whatever Ray processes that attempt left
        process.wait()
        started.remove(process)


def wait_for(address: str, env: dict[str, str], nodes: int) -> None:
    """Until the cluster counts ``nodes`` alive."""
    done = subprocess.run([sys.executable, "-c", COUNT_NODES, address, str(nodes)], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.stdout.strip() == str(nodes), done.stderr[-3000:]


@pytest.mark.time_limit(420)
def test_the_guide_s_two_nodes_run_the_multinode_example_and_a_driver_without_the_token_is_told_why(
    two_nodes: tuple[str, str, dict[str, str]],
) -> None:
    address, token, env = two_nodes
    refused = subprocess.run([sys.executable, "-m", "hwplace", "run", "examples/rl-grpo/multinode.yaml",
                              f"cluster.address={address}"], cwd=ROOT, env={**env, "RAY_AUTH_MODE": ""},
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert f"hwplace: error: cluster.address: the Ray cluster at {address} refused the connection: it requires " \
           "Ray's token authentication and this process does not use it" in refused.stderr
    ran = subprocess.run([sys.executable, "-m", "hwplace", "run", "examples/rl-grpo/multinode.yaml",
                          f"cluster.address={address}", "job.steps=2", "job.eval_prompts=4"], cwd=ROOT,
                         env={**env, "RAY_AUTH_TOKEN": token}, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert re.search(rf"^cluster: Ray cluster at \S+:{address.rpartition(':')[2]}, 2 nodes: 0 ", ran.stdout, re.M), \
        ran.stdout
