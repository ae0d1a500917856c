"""Files another process of this node holds open, reached through ``/proc/<pid>/fd/<fd>``: a channel lane's slots,
a weight sync's segments and boards.

A file is named by the holder's pid, the descriptor there and its inode, which tells a reused descriptor or pid
from the file meant. :func:`open_peer` opens one; :class:`KeptMappings` keeps read-only mappings of such files for
a reader that comes back to them (populated once, not faulted in again on each read), the most recently used
last, at most ``keep``, and lets go of a file's mapping once its holder has let go of the file. Imports the
standard library only.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

Key = tuple[int, int, int]  # (pid, fd, inode)


def peer_path(pid: int, fd: int) -> str:
    return f"/proc/{pid}/fd/{fd}"


def open_peer(pid: int, fd: int, inode: int, flags: int = os.O_RDONLY, path: str = "") -> int | None:
    """A descriptor of this process's own for the file (``path`` where the holder named one, as off Linux), or
    None when it is gone or is another file now. Raises what ``os.open`` raises other than a missing file."""
    try:
        opened = os.open(path or peer_path(pid, fd), flags | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    if os.fstat(opened).st_ino != inode:
        os.close(opened)
        return None
    return opened


def still_held(pid: int, fd: int, inode: int) -> bool:
    """Whether process ``pid`` still holds the file as descriptor ``fd``."""
    try:
        return os.stat(peer_path(pid, fd)).st_ino == inode
    except OSError:
        return False


class KeptMappings:
    """Read-only shared mappings of peers' files, populated when made (``MAP_POPULATE``), by key; not thread-safe
    (a caller that shares one holds its own lock)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._kept: dict[Key, mmap.mmap] = {}

    def get(self, key: Key, size: int, path: str = "") -> mmap.mmap | None:
        """The mapping of the whole file ``key`` names, kept or made now, when it holds at least ``size`` bytes;
        else (gone, another file now, too short, or not mappable) None."""
        mapping = self._kept.pop(key, None)
        if mapping is None or len(mapping) < size:
            self.prune()
            mapping = self._map(key, path)
            if mapping is None or len(mapping) < size:
                return None
        self._kept[key] = mapping  # the most recently used last
        while len(self._kept) > self.keep:
            del self._kept[next(iter(self._kept))]
        return mapping

    def clear(self) -> None:
        self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self) -> Iterator[Key]:
        return iter(list(self._kept))

    def _map(self, key: Key, path: str) -> mmap.mmap | None:
        try:
            opened = open_peer(*key, path=path)
        except OSError:
            return None
        if opened is None:
            return None
        try:  # a description of its own, never locked: the mapping must not keep a holder's lock
            return mmap.mmap(opened, 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                             prot=mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(opened)

    def prune(self) -> None:
        """Let go of the mappings of files their holders have let go (or that ended with them); :meth:`get` does
        before it maps a file."""
        for key in [key for key in self._kept if not still_held(*key)]:
            del self._kept[key]
