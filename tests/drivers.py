"""Drivers for tests: code run in a fresh Python process, which must exit 0 and print JSON last
(:func:`run_driver`); a job's files written into a folder (:func:`write_job`) and ``hwplace run`` on them in this
process (:func:`run_job`)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from hwplace.application.cli import main


def run_driver(code: str, *argv: str, timeout: float, **popen: Any) -> Any:
    """Run ``code`` (with ``argv``) in a new interpreter; assert it exited 0 and return the JSON its last line
    of output holds. ``popen`` goes to :func:`subprocess.run` (``env``, ``cwd``)."""
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout,
                          check=False, **popen)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_job(folder: Path, name: str, config: str, **modules: str) -> Path:
    """Write the job file ``name`` holding ``config`` into ``folder``, and beside it each of ``modules`` as
    ``<key>.py`` (the entry point's module); the job file's path."""
    for module, code in modules.items():
        (folder / f"{module}.py").write_text(code)
    path = folder / name
    path.write_text(config)
    return path


def run_job(*argv: str) -> tuple[int, str, str]:
    """``hwplace run ARGV`` in this process: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = main(["run", *argv], out, err)
    return code, out.getvalue(), err.getvalue()
