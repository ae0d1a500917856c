"""Running the driver's tool under a hard time bound: a hung ``npu-smi`` (a wedged driver) never hangs hwplace."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

MAX_OUTPUT = 1_000_000  # characters kept of an answer; a real table is a few kilobytes


@dataclass(frozen=True)
class Answer:
    """What a command printed, and how it exited."""

    returncode: int
    stdout: str
    stderr: str

    def first_words(self) -> str:
        """The first non-empty line it printed (stderr first), for a message."""
        for text in (self.stderr, self.stdout):
            line = next((line.strip() for line in text.splitlines() if line.strip()), "")
            if line:
                return line[:200]
        return "and printed nothing"


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Kill the command and everything it started (its own session), and reap it."""
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        process.kill()
    try:
        process.communicate(timeout=1)
    except subprocess.TimeoutExpired:  # a descendant left the session and still holds the pipes: let go of them
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=1)


def run_all(commands: Sequence[Sequence[str]], timeout: float) -> list[Answer | str]:
    """Run the commands side by side; each gives an :class:`Answer`, or a string saying why there is none.

    All must answer within ``timeout`` seconds from now; one that does not is killed with whatever it
    started. Nothing here raises for a missing, broken or hanging command.
    """
    started: list[subprocess.Popen[bytes] | str] = []
    for command in commands:
        try:
            started.append(subprocess.Popen(
                list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, close_fds=True))
        except OSError as exc:
            started.append(f"{' '.join(command)} could not be started: {exc.strerror or exc}")
    deadline = time.monotonic() + timeout
    results: list[Answer | str] = []
    try:
        for command, process in zip(commands, started, strict=True):
            if isinstance(process, str):
                results.append(process)
                continue
            try:
                out, err = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop(process)
                results.append(f"{' '.join(command)} did not answer within {timeout:g} s and was killed")
                continue
            results.append(Answer(process.returncode, out[:MAX_OUTPUT].decode("utf-8", "replace"),
                                  err[:MAX_OUTPUT].decode("utf-8", "replace")))
    finally:  # interrupted (KeyboardInterrupt, ...): leave nothing running behind
        for process in started:
            if not isinstance(process, str) and process.returncode is None:
                _stop(process)
    return results
