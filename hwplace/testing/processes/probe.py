"""Hardware detection on a simulated node: ``python -m hwplace.testing.processes.probe OUT`` runs in a child
with the node's environment, reads the node's declared device configs (pickled) from standard input and
writes what every backend detects there, pickled, to ``OUT``. :func:`probe_nodes` runs it for each node at
once. Imports the inventory, the foundation and this package.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from hwplace.foundation.errors import ConfigError
from hwplace.inventory.detection import detect_here
from hwplace.plugin.detection import detect_timeout
from hwplace.testing.processes.wire import child_env

STARTUP_ALLOWANCE = 60.0  # seconds a probe's interpreter may take to start, on top of the detection timeout

Detected = tuple[dict[str, Any], dict[str, str]]  # devices by backend, problems


def probe_nodes(node_envs: Sequence[Mapping[str, str]], declared: Sequence[Mapping[str, Any]]) -> list[Detected]:
    """What every backend detects on each node (a child with that node's environment each, all at once)."""
    timeout = detect_timeout() + STARTUP_ALLOWANCE
    with tempfile.TemporaryDirectory(prefix="hwplace-probe-") as folder:
        outs = [os.path.join(folder, f"node{rank}.pickle") for rank in range(len(node_envs))]
        children = [subprocess.Popen([sys.executable, "-m", __name__, out], stdin=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=child_env(env))
                    for env, out in zip(node_envs, outs, strict=True)]
        found = []
        for rank, (child, configs, out) in enumerate(zip(children, declared, outs, strict=True)):
            try:
                _, errors = child.communicate(pickle.dumps(dict(configs)), timeout=timeout)
            except subprocess.TimeoutExpired:
                for other in children:
                    other.kill()
                    other.wait()
                raise ConfigError("cluster", f"simulated node {rank} did not answer hardware detection within "
                                  f"{timeout:g} s", allowed="HWPLACE_DETECT_TIMEOUT bounds each backend") from None
            if child.returncode != 0:
                for other in children:
                    other.kill()
                    other.wait()
                lines = errors.decode(errors="replace").strip().splitlines() or [f"exit code {child.returncode}"]
                raise ConfigError("cluster", f"hardware detection failed on simulated node {rank}: {lines[-1]}")
            with open(out, "rb") as answer:
                found.append(pickle.load(answer))
        return found


def main() -> None:
    declared = pickle.load(sys.stdin.buffer)
    hardware, problems = detect_here(declared)
    with open(sys.argv[1], "wb") as out:
        pickle.dump((dict(hardware), dict(problems)), out)


if __name__ == "__main__":
    main()
