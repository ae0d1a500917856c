"""mypy passes: ``--strict`` over the library (pyproject.toml's ``[tool.mypy]``) and over the built-in plugins as
installed (``hwplace_plugins``), and over the tests with their own, looser flags. Part of the suite, so that CI
sets up one environment with torch and Ray rather than two (the ``type`` env's own set-up took 57 s of a run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hwplace_plugins

ROOT = Path(__file__).resolve().parent.parent
TESTS_FLAGS = ["--allow-untyped-defs", "--allow-incomplete-defs", "--allow-untyped-calls", "--check-untyped-defs",
               "--no-warn-unused-ignores"]
CHECKS = {"library": [], "plugins": ["-p", "hwplace_plugins"], "tests": [*TESTS_FLAGS, "tests"]}


def plugins_path(tmp_path: Path) -> dict[str, str]:
    """Where mypy finds ``hwplace_plugins``: installed (a wheel: nothing to add), or, in an editable install (an
    import hook mypy does not follow), a folder of the test's own in which that name is a link to plugins/."""
    if Path(hwplace_plugins.__file__).resolve().parent != (ROOT / "plugins").resolve():
        return {}
    (tmp_path / "hwplace_plugins").symlink_to(ROOT / "plugins", target_is_directory=True)
    return {"MYPYPATH": str(tmp_path)}


@pytest.mark.time_limit(280)
@pytest.mark.parametrize("check", CHECKS)
def test_mypy_passes(check: str, tmp_path: Path) -> None:
    env = {**os.environ, **plugins_path(tmp_path), "MYPY_FORCE_COLOR": "0"}
    done = subprocess.run([sys.executable, "-m", "mypy", *CHECKS[check]], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=270, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
