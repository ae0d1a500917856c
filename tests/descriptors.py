"""A check shared by the tests of what holds a file descriptor (segments, boards, slot locks)."""

from __future__ import annotations

import os
from collections.abc import Callable


def closes_once(fd: int, close: Callable[[], None]) -> None:
    """Call ``close`` (of what holds descriptor ``fd``) twice, another file of this process given the number in
    between: that file must still be open after the second call."""
    other = os.open(os.devnull, os.O_RDONLY)  # while ``fd`` is open: a number of its own
    try:
        close()
        os.dup2(other, fd)  # another file now has the number the closed one had
        try:
            close()
            os.fstat(fd)  # still open
        finally:
            os.close(fd)
    finally:
        os.close(other)
