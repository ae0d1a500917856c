"""hwplace's throwaway Ray clusters (``plugins/ray/local_cluster.py``) are found by nobody else."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hwplace_plugins.ray.pytest_plugin import LocalRay

pytest.importorskip("ray")

FIND = """
import ray._private.services as services
print(services.canonicalize_bootstrap_address(None))  # what a plain ray.init() would join; None: a new one
"""


def test_another_process_s_ray_init_does_not_find_a_throwaway_cluster(hwplace_local_ray: LocalRay) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}
    found = subprocess.run([sys.executable, "-c", FIND], env=env, capture_output=True, text=True, timeout=60,
                           check=True).stdout.strip()
    assert found != hwplace_local_ray.address  # another cluster `ray start` made here, or None: never ours
