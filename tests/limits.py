"""One alarm for the tests: a block that must end within some seconds raises instead of hanging (SIGALRM).

Used by the ``time_limit`` marker (conftest.py), by the docs' runner and by the property tests of the grammar.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def alarm(seconds: int, error: Callable[[], BaseException], *, again_every: int | None = None,
          where_possible: bool = False) -> Iterator[None]:
    """Raises ``error()`` in the main thread once the block has run ``seconds``; with ``again_every``, again
    every that many seconds until the block ends (for code that catches everything, as doctest does).

    The previous SIGALRM handler is back, and no alarm is pending, after the block. SIGALRM cannot interrupt
    a block stuck in C code. Where no SIGALRM can be set (no such signal here, or not the main thread) the
    block runs without a limit with ``where_possible``, and the ``with`` raises otherwise.
    """

    def expire(signum: int, frame: Any) -> None:
        if again_every is not None:
            signal.alarm(again_every)
        raise error()

    try:
        previous = signal.signal(signal.SIGALRM, expire)
    except (AttributeError, ValueError):  # no SIGALRM here, or not the main thread
        if not where_possible:
            raise
        yield
        return
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
