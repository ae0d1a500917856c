"""The :class:`Worker` base class: what a job subclasses, and what a worker sees of itself.

``MyWorker.create_group(*args).launch(...)`` starts one process per placement (:mod:`hwplace.runtime.group`);
hosting the worker in its process is :mod:`hwplace.runtime.hosting`. Imports the layers below and
:mod:`hwplace.runtime.deferred`, through which it reaches the group launcher, channels, messaging and turns on
first use: a worker process loads none of them until its worker uses them.
"""

from __future__ import annotations

import logging
from typing import Any

from hwplace.contracts.records import Placement, WorkerContext
from hwplace.foundation.errors import HwplaceError
from hwplace.runtime import deferred


class Worker:
    """Base class of a job's workers. Subclass it; hwplace constructs one instance per process of a group.

    Inside a worker, ``self.rank``, ``self.world_size``, ``self.placement``, ``self.group_name`` and
    ``self.node_rank`` say who it is, ``self.log_info(...)`` (and ``log_debug``, ``log_warning``,
    ``log_error``) log with the group, rank and node in front, and ``self.create_channel(...)`` and
    ``self.connect_channel(...)`` open channels. Methods may be ``async def``: they then run
    concurrently on the worker's event loop, while plain methods run one at a time, in call order, on one
    thread (the one the constructor ran on, with no event loop running). A worker that carries state across a
    job's steps (a data cursor, an optimizer) may define ``state_dict()`` and ``load_state_dict(state)``:
    ``job.snapshot`` records the first on every rank, and a resumed job's ``job.launch`` calls the second
    (docs/resilience.md).
    """

    _hwplace_context: WorkerContext | None = None

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> deferred.GroupLauncher:
        """A group of this worker class, each constructed with ``args`` and ``kwargs``; ``.launch(...)`` starts it."""
        return deferred.GroupLauncher(cls, args, kwargs)

    @property
    def _context(self) -> WorkerContext:
        if self._hwplace_context is None:
            raise HwplaceError(f"this {type(self).__name__} is not running in a worker group; start it with "
                               f"{type(self).__name__}.create_group(...).launch(...)")
        return self._hwplace_context

    @property
    def rank(self) -> int:
        return self._context.rank

    @property
    def world_size(self) -> int:
        return self._context.world_size

    @property
    def placement(self) -> Placement:
        return self._context.placement

    @property
    def group_name(self) -> str:
        return self._context.group

    @property
    def node_rank(self) -> int:
        return self._context.placement.node_rank

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger that puts ``[group rank R node N]`` in front of each message."""
        context = self._context
        return _WorkerLogger(logging.getLogger(f"hwplace.worker.{context.group}"),
                             {"prefix": f"[{context.group} rank {context.rank} node {context.placement.node_rank}]"})

    def create_channel(self, name: str, group_affinity: str | None = None, group_rank_affinity: int | None = None,
                       maxsize: int = 0) -> deferred.Channel:
        """Start a new channel called ``name``; see :meth:`hwplace.Channel.create`.

        Its host runs on this worker's node, or on the node of worker ``group_rank_affinity`` of group
        ``group_affinity`` (this worker's group when only the rank is given; rank 0 when only the group is).
        """
        context = self._context
        if group_affinity is None and group_rank_affinity is not None:
            group_affinity = context.group
        return deferred.Channel.create(name, maxsize, group_affinity=group_affinity,
                                       group_rank_affinity=group_rank_affinity)

    def turn(self, timeout: float | None = None) -> deferred.Turn:
        """``with self.turn():`` exclusive use of this worker's accelerators among groups that share them.

        First come, first served; re-entrant; released if this worker dies. ``onload()`` (if defined) runs on
        entering after another group's turn, ``offload()`` on leaving while another group waits. An elapsed
        ``timeout`` raises ``TimeoutError``. See docs/rl.md, "Turns on shared accelerators".
        """
        turns = self.__dict__.get("_hwplace_turns")
        if turns is None:
            turns = self.__dict__["_hwplace_turns"] = deferred.Turns(self)
        return deferred.Turn(turns, timeout)

    def connect_channel(self, name: str) -> deferred.Channel:
        """The existing channel called ``name``; see :meth:`hwplace.Channel.connect`."""
        return deferred.Channel.connect(name)

    def send(self, obj: Any, group: str, rank: int, async_op: bool = False) -> Any:
        """Send ``obj`` (a tensor, an array or any picklable value) to worker ``rank`` of ``group``; see docs/rl.md.

        Returns when it is sent (a message of up to 4 KiB: once it is copied and queued; a failure to deliver it
        is raised by a later send), or at once with a handle (``wait()``) when ``async_op`` is true.
        """
        return deferred.messenger(self._context).pair(group, rank).send(obj, async_op)

    def recv(self, group: str, rank: int, async_op: bool = False, timeout: float | None = None) -> Any:
        """The next message from worker ``rank`` of ``group`` (in send order); ``TimeoutError`` after ``timeout``."""
        return deferred.messenger(self._context).recv(group, rank, async_op, timeout)

    def broadcast(self, obj: Any, src: tuple[str, int], groups: tuple[str, ...]) -> Any:
        """``obj`` of the worker ``src`` (a (group, rank)), on every member of ``groups``; each of them calls it."""
        return deferred.messenger(self._context).broadcast(obj, src, groups)

    def log_debug(self, message: str, *args: Any) -> None:
        self.logger.debug(message, *args)

    def log_info(self, message: str, *args: Any) -> None:
        self.logger.info(message, *args)

    def log_warning(self, message: str, *args: Any) -> None:
        self.logger.warning(message, *args)

    def log_error(self, message: str, *args: Any) -> None:
        self.logger.error(message, *args)


class _WorkerLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"{self.extra['prefix']} {msg}" if self.extra else msg, kwargs
