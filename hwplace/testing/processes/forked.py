"""The driver's end of a process cluster's zygote (:mod:`~hwplace.testing.processes.zygote`), and the workers it
forks, held as :class:`subprocess.Popen` holds a child (``pid``, ``poll``, ``wait``, ``kill``).

The zygote starts on the first fork and ends with the cluster. A worker is forked only where a new interpreter
would start the same: this interpreter, and the same variables that Python and the dynamic loader read when they
start (``PYTHON*`` but ``PYTHONPATH``, which the child applies to its import path, and ``LD_*``); otherwise
:meth:`Zygote.fork` returns None and the caller starts a new interpreter. Should the zygote end early, its
children still running are killed and reported so, and the next fork starts a new zygote. Imports the errors
and this package's wire.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from hwplace.foundation.errors import ConfigError
from hwplace.testing.processes.wire import child_env, read, write

ZYGOTE = "hwplace.testing.processes.zygote"
STOP_WAIT = 10.0  # seconds to wait for a killed child whose zygote has ended


def _startup_keys(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if (k.startswith("PYTHON") and k != "PYTHONPATH") or k.startswith("LD_")}


class ForkedProcess:
    """A worker the zygote forked: its pid once forked, and its return code once it ended."""

    def __init__(self) -> None:
        self.pid = 0
        self.returncode: int | None = None
        self._forked = threading.Event()
        self._ended = threading.Event()

    def _set_pid(self, pid: int) -> None:
        self.pid = pid
        self._forked.set()

    def _set_ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(ZYGOTE, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def _end_orphan(self) -> None:
        """Its zygote is gone, so no one will say how it ends: kill it and wait until it has ended."""
        try:
            ended = os.pidfd_open(self.pid)
        except OSError:  # already gone
            ended = -1
        self.kill()
        if ended >= 0:
            select.select([ended], [], [], STOP_WAIT)  # readable once the process has ended
            os.close(ended)
        self._set_ended(-signal.SIGKILL)

    def kill(self) -> None:
        if self.returncode is None and self.pid > 0:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)


class Zygote:
    """Forks workers from one process that imported hwplace's worker host and ``preload`` (module names)."""

    def __init__(self, preload: Sequence[str]) -> None:
        self.preload = tuple(preload)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._env: dict[str, str] = {}
        self._waiting: list[ForkedProcess] = []  # forks asked for, in order, awaiting their pid
        self._children: dict[int, ForkedProcess] = {}

    def fork(self, env: Mapping[str, str], start: tuple[Any, ...]) -> ForkedProcess | None:
        """A worker forked with ``env`` (its whole environment) that runs ``worker_main.run(*start)``; None where
        a new interpreter would start differently, or the zygote could not start."""
        forked = ForkedProcess()
        with self._lock:
            if _startup_keys(env) != _startup_keys(self._env if self._sock is not None else child_env({})):
                return None  # checked first: a zygote started only to be refused would cost a preload for nothing
            if self._sock is None and not self._start():
                return None
            assert self._sock is not None
            self._waiting.append(forked)
            try:
                write(self._sock, ("fork", dict(env), os.getcwd(), start), [1, 2])
            except OSError:
                self._waiting.remove(forked)
                return None
        forked._forked.wait()
        return forked if forked.pid > 0 else None

    def _start(self) -> bool:
        """Under the lock: start the zygote and wait until it has imported what it preloads."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._env = child_env({})
        try:
            self._process = subprocess.Popen([sys.executable, "-m", ZYGOTE, str(theirs.fileno()), *self.preload],
                                             pass_fds=[theirs.fileno()], env=self._env, stdin=subprocess.DEVNULL)
        except OSError:
            ours.close()
            return False
        finally:
            theirs.close()
        try:
            kind, _ = read(ours)[0]
        except (EOFError, OSError):
            kind = "ended"
        if kind != "ready":
            ours.close()
            self._process.wait()
            raise ConfigError("preload", "the process cluster's zygote could not import these modules (its error is "
                              "on standard error)", value=list(self.preload), allowed="modules every worker can import")
        self._sock = ours
        threading.Thread(target=self._read, args=(ours, self._process), name="hwplace-zygote", daemon=True).start()
        return True

    def _read(self, sock: socket.socket, process: subprocess.Popen[bytes]) -> None:
        try:
            while True:
                message, _ = read(sock)
                with self._lock:
                    if message[0] == "forked":
                        forked = self._waiting.pop(0)
                        self._children[message[1]] = forked
                        forked._set_pid(message[1])
                    elif message[0] == "exited":
                        ended = self._children.pop(message[1], None)
                        if ended is not None:
                            ended._set_ended(message[2])
        except (EOFError, OSError):
            pass
        with self._lock:  # the zygote ended: no one can tell how its children end, so none may run on
            if self._sock is sock:
                self._sock = None
            sock.close()
            for forked in self._waiting:
                forked._set_pid(0)
            self._waiting = []
            children, self._children = self._children, {}
        for forked in children.values():
            forked._end_orphan()
        process.wait()

    def stop(self) -> None:
        """End the zygote; a child of it still running then is killed (a cluster's groups are stopped before)."""
        with self._lock:
            sock, process = self._sock, self._process
            self._sock = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
