"""The suite as two pytest processes at once: what the ``fake`` tox env runs (``tox -e fake -- ARGS`` runs
``pytest ARGS`` alone instead).

Most of the suite's wall time is spent waiting (worker processes starting, Ray clusters coming up, deaths being
noticed, a fresh clone's install), not computing: on the 2-core CI machine the whole suite took 21 minutes in one
process, and the two shards below 13 minutes side by side. Each shard is a pytest session of its own,
with its own local Ray cluster and its own temporary folder, so nothing is shared between them but the machine.

The split is by folder, each shard about half the time: the Ray plugin's tests, the quick start on a fresh clone,
the docs' code and the application's tests in one; everything else, the GPU check's CPU mode too, in the other.
In green fresh-clone CI runs the second shard still ran 41 and 49 s longer than the first (883 against 834 s) with
only the application's snapshots and status tests in the first, one core idle meanwhile; the application's other
files took 31 s alone. Each shard's output is
written to a file while it runs (``HWPLACE_SHARD_LOGS``, default a temporary folder, named at the start) and
printed whole when both are done; the exit status is the first failing shard's, else 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ONE = ["tests/plugins", "tests/test_fresh_clone.py", "tests/test_docs.py", "tests/application"]
SHARDS = {"ray plugin, fresh clone, docs, application": ONE,
          "the rest": ["tests", *(f"--ignore={path}" for path in ONE)]}


def main(args: list[str]) -> int:
    if args:  # a selection of the caller's: as pytest would run it
        return subprocess.call([sys.executable, "-m", "pytest", *args], cwd=ROOT)
    logs = Path(os.environ.get("HWPLACE_SHARD_LOGS") or tempfile.mkdtemp(prefix="hwplace-shards-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"the suite in {len(SHARDS)} shards at once; their output as they run: {logs}", flush=True)
    started = time.monotonic()
    running = []
    for index, (name, selection) in enumerate(SHARDS.items()):
        log = logs / f"shard-{index}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([sys.executable, "-m", "pytest", f"--basetemp={logs / f'tmp-{index}'}",
                                        *selection], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        running.append((name, log, process))
    codes = []
    for name, log, process in running:
        code = process.wait()
        codes.append(code)
        print(f"\n===== shard {name!r}: exit {code} =====", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
    print(f"\n===== {len(SHARDS)} shards in {time.monotonic() - started:.0f} s: "
          + ", ".join(f"{name!r} exit {code}" for (name, _, _), code in zip(running, codes, strict=True)), flush=True)
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
