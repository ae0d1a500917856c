"""Whether a process runs, for the tests of what must leave nothing running behind it."""

from __future__ import annotations


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: this container's first process may not reap what it inherits)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
