"""The GRPO example's environment and robot processes never load torch: what such a process imports (the worker
module environment.py, and what hwplace's worker hosts import before it) leaves torch out. Checked in a fresh
interpreter, as a worker process starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.time_limit(60)

GRPO = Path(__file__).resolve().parents[2] / "examples" / "rl-grpo"
HOSTS = ["hwplace.executor", "hwplace.testing.processes.worker_main", "hwplace_plugins.ray.runtime"]


def loaded(*modules: str) -> set[str]:
    code = (f"import sys; sys.path.insert(0, {str(GRPO)!r})\n"
            + "".join(f"import {name}\n" for name in modules)
            + "print(' '.join(sorted(name for name in sys.modules if name.split('.')[0] == 'torch')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True)
    return set(done.stdout.split())


def test_the_environment_and_robot_workers_import_no_torch() -> None:
    pytest.importorskip("ray")
    assert loaded(*HOSTS, "environment") == set()


def test_the_check_sees_torch_where_a_worker_module_imports_it() -> None:
    pytest.importorskip("torch")
    assert "torch" in loaded(*HOSTS, "policy")
