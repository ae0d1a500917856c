"""Processes of hwplace's Ray actors end with their node's raylet.

A Ray worker process whose raylet dies (killed, out of memory, its node's agent stopped) is orphaned: Ray
marks its actors dead, but the process may run on, a channel host still taking puts that nobody will get, a
worker still holding its accelerator. Each hwplace actor process watches its raylet (its parent process)
and exits when it goes; its clients see their connections break (``ChannelLost``) at once. Linux only
(``pidfd_open``, ``/proc``); elsewhere nothing is watched.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading

_watching: list[int] = []


def exit_with_raylet() -> None:
    """Exit this process when its parent, the raylet that started it, ends; once per process."""
    parent = os.getppid()
    if _watching or not hasattr(os, "pidfd_open"):
        return
    try:
        with open(f"/proc/{parent}/comm") as comm:
            if "raylet" not in comm.read():
                return  # not started by a raylet (a driver, a test): nothing to watch
        descriptor = os.pidfd_open(parent)
    except OSError:
        return
    _watching.append(parent)
    threading.Thread(target=_watch, args=(parent, descriptor), name="hwplace-raylet-watch", daemon=True).start()


def _watch(parent: int, descriptor: int) -> None:
    if os.getppid() == parent:  # else the raylet ended before its descriptor was opened
        with contextlib.suppress(OSError):
            select.select([descriptor], [], [])  # readable once the process has ended: no polling
    os._exit(1)
