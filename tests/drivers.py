"""A driver of its own for a test: code run in a fresh Python process, which must exit 0 and print JSON last."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def run_driver(code: str, *argv: str, timeout: float, **popen: Any) -> Any:
    """Run ``code`` (with ``argv``) in a new interpreter; assert it exited 0 and return the JSON its last line
    of output holds. ``popen`` goes to :func:`subprocess.run` (``env``, ``cwd``)."""
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout,
                          check=False, **popen)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
