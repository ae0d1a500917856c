"""The zygote of a process cluster: ``python -m hwplace.testing.processes.zygote FD MODULE...``.

It imports hwplace's worker host and the modules named (torch, say) once, then forks each worker from itself, so
a worker starts in milliseconds instead of importing them again (torch alone takes about 2 s of CPU). It talks to
the driver over the Unix socket ``FD``, one pickle per message:

- the driver's ``("fork", env, cwd, start)``, with its standard output and error passed beside it (SCM_RIGHTS),
  is answered ``("forked", pid)``: the child takes that environment, folder and those two streams, as a new
  interpreter started then would, and runs :func:`~hwplace.testing.processes.worker_main.run` with ``start``;
- ``("exited", pid, returncode)`` follows when a child ends (``returncode`` as ``subprocess`` gives it: minus
  the signal's number for a signal); the zygote reaps its children.

It is single-threaded, so that a fork copies a process in which no other thread held a lock, and imports without
running anything (no thread pool of torch's or OpenMP's has started). It exits when the driver's end of the socket
closes; its children live on, each ending with its own connection to the driver. Imports the worker host and
this package's wire.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import select
import signal
import socket
import sys
import traceback
import warnings
from typing import Any

from hwplace.testing.processes import worker_main
from hwplace.testing.processes.wire import read, write


def _child(sock: socket.socket, wakeup: tuple[int, int], env: dict[str, str], cwd: str, fds: list[int],
           start: Any) -> None:
    """In the forked child: become the worker a new interpreter would have been, then run it; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sock.close()
        for fd in wakeup:
            os.close(fd)
        for fd, standard in zip(fds, (1, 2), strict=True):
            os.dup2(fd, standard)
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [cwd, *paths, *(p for p in sys.path[1:] if p not in paths)]
        random.seed()  # every child its own random numbers, not the zygote's
        numpy_random = sys.modules.get("numpy.random")
        if numpy_random is not None:
            numpy_random.seed()
        worker_main.run(*start)
        code = 0
    except BaseException:  # whatever it was, the child ends here and says why
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream: nothing more to say
                stream.flush()
        os._exit(code)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        write(sock, ("exited", pid, os.waitstatus_to_exitcode(status)))


def serve(sock: socket.socket) -> None:
    wakeup_read, wakeup = os.pipe()
    os.set_blocking(wakeup, False)
    os.set_blocking(wakeup_read, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup descriptor is written
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is for the driver and the workers
    signal.set_wakeup_fd(wakeup)
    while True:
        ready, _, _ = select.select([sock.fileno(), wakeup_read], [], [])
        if wakeup_read in ready:
            while True:
                try:
                    if not os.read(wakeup_read, 512):
                        break
                except BlockingIOError:
                    break
            _reap(sock)
        if sock.fileno() in ready:
            try:
                (_, env, cwd, start), fds = read(sock)
            except (EOFError, ConnectionError):
                return
            with warnings.catch_warnings():
                # Python 3.12 warns of fork() in a process with other threads: here only a preloaded library's
                # idle pool (OpenBLAS's, loaded with numpy), which prepares for a fork itself (pthread_atfork)
                warnings.filterwarnings("ignore", message=".*fork\\(\\) may lead to deadlocks",
                                        category=DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                _child(sock, (wakeup_read, wakeup), env, cwd, fds, start)
            for fd in fds:
                os.close(fd)
            write(sock, ("forked", pid))
            _reap(sock)


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    for name in argv[1:]:
        importlib.import_module(name)
    write(sock, ("ready", os.getpid()))
    serve(sock)


if __name__ == "__main__":
    main(sys.argv[1:])
