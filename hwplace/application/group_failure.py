"""How ``hwplace run`` ends a job whose group used up its restarts (SPEC §12), wherever its entry point waits.

The group's supervisor learns of the last death on a thread of its own; the entry point may be blocked anywhere
on the main thread (a ``threading.Event().wait()``, a channel, a loop of its own). Only a signal reaches such a
wait, so the supervisor's listener sends the main thread :data:`GROUP_FAILED_SIGNAL`, whose handler raises
:class:`GroupFailed` there. It is a signal of hwplace's own, not SIGINT: a process started in the background by
a shell (``nohup hwplace run job.yaml &``) ignores SIGINT from birth, so Python never raises KeyboardInterrupt
in it, and an entry point may handle SIGINT itself. Imports the foundation and the runtime's restarts.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from hwplace.foundation.errors import WorkerError
from hwplace.runtime.restarts import on_group_failure

GROUP_FAILED_SIGNAL = signal.SIGRTMIN + 5 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
"""The signal that wakes the main thread when a group uses up its restarts: a real-time one (Linux), which
neither Ray, torch nor the shell use; SIGUSR2 where there is none."""


class GroupFailed(BaseException):
    """A group used up its restarts: raised on the main thread wherever the entry point was (a BaseException,
    so that an entry point's ``except Exception`` does not swallow the job's end)."""


@contextlib.contextmanager
def ended_by_group_failure(failures: list[WorkerError]) -> Iterator[None]:
    """For the block: a group that uses up its restarts appends its last death to ``failures`` and, where the
    block runs on the main thread, raises :class:`GroupFailed` in it (once; later failures are only recorded,
    so that shutting the job down is not interrupted)."""
    main = threading.get_ident()
    on_main = threading.current_thread() is threading.main_thread()
    lock = threading.Lock()
    state = {"active": True, "raised": False}

    def raise_failure(signum: int, frame: Any) -> None:
        if not state["raised"]:
            state["raised"] = True
            raise GroupFailed

    def failed(error: WorkerError) -> None:
        with lock:
            failures.append(error)
            if on_main and state["active"] and threading.get_ident() != main:
                signal.pthread_kill(main, GROUP_FAILED_SIGNAL)

    previous = signal.signal(GROUP_FAILED_SIGNAL, raise_failure) if on_main else None
    remove = on_group_failure(failed)
    try:
        yield
    finally:
        remove()
        with lock:
            state["active"] = False  # no signal is sent from now on
        if on_main:  # one sent before stays harmless: ignored, never the default (which ends the process)
            signal.signal(GROUP_FAILED_SIGNAL, signal.SIG_IGN if previous in (signal.SIG_DFL, None) else previous)
