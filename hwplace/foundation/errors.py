"""The one error hierarchy of hwplace, rooted at :class:`HwplaceError`."""

from __future__ import annotations

import queue
from typing import Any

from hwplace.foundation.wording import safe_repr


class HwplaceError(Exception):
    """Base of every error hwplace raises on purpose."""


def _rebuild(cls: type[HwplaceError], args: tuple[Any, ...], kwargs: dict[str, Any]) -> HwplaceError:
    return cls(*args, **kwargs)


class ConfigError(HwplaceError, ValueError):
    """A configuration value breaks a rule.

    ``path`` is the key path (``cluster.node_groups[1].node_ranks``), ``value`` the offending value and
    ``allowed`` a short statement of what would be accepted.
    """

    def __init__(self, path: str, problem: str, *, value: Any = None, allowed: str | None = None) -> None:
        self.path = path
        self.problem = problem
        self.value = value
        self.allowed = allowed
        message = f"{path}: {problem}" if path else problem
        if value is not None:
            message += f" (got {safe_repr(value)})"
        if allowed:
            message += f"; {allowed}"
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes (a worker's error) with its fields
        return _rebuild, (type(self), (self.path, self.problem), {"value": self.value, "allowed": self.allowed})


class PlacementError(HwplaceError, ValueError):
    """A placement cannot be realised.

    ``component`` names the component (or is ``None`` for a strategy used directly), ``text`` is the whole
    placement string, ``span`` the ``(start, end)`` offsets of the offending entry in it, and ``rank`` the
    process rank concerned, where one is.
    """

    def __init__(
        self,
        reason: str,
        *,
        component: str | None = None,
        text: str | None = None,
        span: tuple[int, int] | None = None,
        rank: int | None = None,
    ) -> None:
        self.reason = reason
        self.component = component
        self.text = text
        self.span = span
        self.rank = rank
        super().__init__(self._message())

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes (a worker's error) with its fields
        return _rebuild, (type(self), (self.reason,), {"component": self.component, "text": self.text,
                                                       "span": self.span, "rank": self.rank})

    @property
    def entry(self) -> str | None:
        """The offending entry of the placement string, as written."""
        if self.text is None or self.span is None:
            return None
        return self.text[self.span[0] : self.span[1]]

    def _message(self) -> str:
        where = []
        if self.component is not None:
            where.append(f"component {self.component!r}")
        if self.entry is not None:
            where.append(f"entry {safe_repr(self.entry)} of {safe_repr(self.text)}")
        return f"{', '.join(where)}: {self.reason}" if where else self.reason

    def located(self, component: str, text: str, span: tuple[int, int] | None) -> PlacementError:
        """The same error, placed in a component's placement string."""
        return PlacementError(self.reason, component=component, text=text, span=span, rank=self.rank)


class PluginError(HwplaceError):
    """A plugin or hardware backend is broken or conflicts with another; ``plugins`` names the ones involved."""

    def __init__(self, message: str, *, plugins: tuple[str, ...] = ()) -> None:
        self.plugins = plugins
        super().__init__(message)


class WorkerError(HwplaceError, RuntimeError):
    """A worker's constructor or method raised, or its process died.

    ``group`` and ``rank`` name the worker, ``node_rank`` its node, and ``remote_traceback`` is the traceback
    as formatted in the worker (``None`` when the process died without one). ``restarted`` is true when the
    process died and its group restarts it in place (SPEC §12): calls made after the restart reach the new one.
    """

    def __init__(
        self,
        problem: str,
        *,
        group: str | None = None,
        rank: int | None = None,
        node_rank: int | None = None,
        remote_traceback: str | None = None,
        restarted: bool = False,
    ) -> None:
        self.problem = problem
        self.restarted = restarted
        self.group = group
        self.rank = rank
        self.node_rank = node_rank
        self.remote_traceback = remote_traceback
        where = []
        if group is not None:
            where.append(f"group {group!r}")
        if rank is not None:
            where.append(f"rank {rank}")
        if node_rank is not None:
            where.append(f"on node {node_rank}")
        message = f"{' '.join(where)}: {problem}" if where else problem
        if remote_traceback:
            message += "\n\nRemote traceback:\n" + remote_traceback.rstrip()
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_worker_error, (self.problem, self.group, self.rank, self.node_rank, self.remote_traceback,
                                       self.restarted)


def _rebuild_worker_error(
    problem: str, group: str | None, rank: int | None, node_rank: int | None, remote_traceback: str | None,
    restarted: bool = False,
) -> WorkerError:
    return WorkerError(problem, group=group, rank=rank, node_rank=node_rank, remote_traceback=remote_traceback,
                       restarted=restarted)


class CallCancelled(HwplaceError):
    """A call on a worker group was cancelled (``Handle.cancel()``) before it finished."""


class ChannelClosed(HwplaceError):
    """The channel was closed."""


class ChannelEmpty(HwplaceError, queue.Empty):
    """A non-blocking get found the queue empty."""


class ChannelFull(HwplaceError, queue.Full):
    """A non-blocking put found the queue full."""


class ChannelTimeout(HwplaceError, TimeoutError):
    """A channel operation did not complete within its timeout."""


class ChannelNotHeld(HwplaceError, LookupError):
    """An acknowledgement (``channel.ack(taken)``, ``put(..., ack=taken)``) named items this process does not
    hold: already acknowledged, or given back when its connection to the channel's host closed. Nothing was
    acknowledged (and a ``put``'s item did not enter)."""


class ChannelLost(HwplaceError, ConnectionError):
    """The process hosting a channel is gone (it died, or its node did); the channel's items are lost with it."""


class WeightSyncError(HwplaceError):
    """A weight sync failed: a bucket whose digest does not match (corrupted or partial), a rank that is not
    the source or a target, or a state dict it cannot carry. The previous version stays the latest."""


# Users meet these classes as hwplace.errors.X (and hwplace.X): tracebacks and pickles name that public module,
# which re-exports them, rather than this layer's path.
for _error in (HwplaceError, ConfigError, PlacementError, PluginError, WorkerError, ChannelClosed, ChannelEmpty,
               ChannelFull, ChannelTimeout, ChannelLost, CallCancelled, WeightSyncError,
               ChannelNotHeld):
    _error.__module__ = "hwplace.errors"
