"""The :class:`Worker` base class, and what an executor runs inside a worker process to host one.

A job subclasses ``Worker``; ``MyWorker.create_group(*args).launch(...)`` starts one process per placement.
In each process, :func:`start_worker` sets the environment, loads the class and constructs it; then
:func:`run_method` (or :func:`run_method_async`) runs each call and turns any exception into a
:class:`RemoteFailure`, so that an executor never loses a traceback and never kills the process over it.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hwplace.errors import HwplaceError, WorkerError

if TYPE_CHECKING:
    from hwplace.channel import Channel
    from hwplace.group import GroupLauncher
    from hwplace.placement import Placement

LOG_LEVEL_VARIABLE = "HWPLACE_LOG_LEVEL"


@dataclass(frozen=True)
class WorkerContext:
    """Who a worker is: its group, rank, group size, placement, the environment hwplace set for it, and the
    name of the executor running it (its channels are started through that executor)."""

    group: str
    rank: int
    world_size: int
    placement: Placement
    env: Mapping[str, str]
    executor: str = ""


class Worker:
    """Base class of a job's workers. Subclass it; hwplace constructs one instance per process of a group.

    Inside a worker, ``self.rank``, ``self.world_size``, ``self.placement``, ``self.group_name`` and
    ``self.node_rank`` say who it is, ``self.log_info(...)`` (and ``log_debug``, ``log_warning``,
    ``log_error``) log with the group, rank and node in front, and ``self.create_channel(...)`` and
    ``self.connect_channel(...)`` open channels. Methods may be ``async def``: they then run
    concurrently on the worker's event loop, while plain methods run one at a time, in call order, on one
    thread (the one the constructor ran on).
    """

    _hwplace_context: WorkerContext | None = None

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> GroupLauncher:
        """A group of this worker class, each constructed with ``args`` and ``kwargs``; ``.launch(...)`` starts it."""
        from hwplace.group import GroupLauncher

        return GroupLauncher(cls, args, kwargs)

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
                       maxsize: int = 0) -> Channel:
        """Start a new channel called ``name``; see :meth:`hwplace.Channel.create`.

        Its host runs on this worker's node, or on the node of worker ``group_rank_affinity`` of group
        ``group_affinity`` (this worker's group when only the rank is given; rank 0 when only the group is).
        """
        from hwplace.channel import Channel

        context = self._context
        if group_affinity is None and group_rank_affinity is not None:
            group_affinity = context.group
        return Channel.create(name, maxsize, group_affinity=group_affinity, group_rank_affinity=group_rank_affinity)

    def connect_channel(self, name: str) -> Channel:
        """The existing channel called ``name``; see :meth:`hwplace.Channel.connect`."""
        from hwplace.channel import Channel

        return Channel.connect(name)

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


@dataclass(frozen=True)
class RemoteFailure:
    """An exception raised in a worker, carried back to the driver as a value.

    ``summary`` is ``"Type: message"``, ``traceback`` the formatted traceback and ``pickled`` the exception
    itself when it pickles (``None`` otherwise).
    """

    summary: str
    traceback: str
    pickled: bytes | None = None

    @classmethod
    def capture(cls, exc: BaseException, *, skip: int = 1) -> RemoteFailure:
        """The failure for ``exc``, its traceback without the ``skip`` outermost frames (hwplace's own)."""
        tb = exc.__traceback__
        for _ in range(skip):
            if tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
        try:
            pickled: bytes | None = pickle.dumps(exc)
        except Exception:
            pickled = None
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        return cls(f"{type(exc).__name__}: {exc}", text, pickled)

    def exception(self) -> BaseException | None:
        """The original exception, when it could be carried over and can be rebuilt here."""
        if self.pickled is None:
            return None
        try:
            exc = pickle.loads(self.pickled)
        except Exception:
            return None
        return exc if isinstance(exc, BaseException) else None

    def error(self, what: str, *, group: str, rank: int, node_rank: int) -> WorkerError:
        """The :class:`WorkerError` the driver raises for this failure (``from`` the original exception)."""
        error = WorkerError(f"{what} raised {self.summary}", group=group, rank=rank, node_rank=node_rank,
                            remote_traceback=self.traceback)
        error.__cause__ = self.exception()
        return error


def start_worker(
    load_class: Callable[[], type[Worker]],
    context: WorkerContext,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> Worker | RemoteFailure:
    """Host a worker in this process: set its environment, then load its class and construct it.

    The environment is set before ``load_class`` runs, so modules the class imports see it. Anything the
    loading or the constructor raises comes back as a :class:`RemoteFailure`.
    """
    os.environ.update(context.env)
    if context.executor:
        from hwplace.executor import set_current_executor

        set_current_executor(context.executor)
    try:
        _configure_logging()
        cls = load_class()
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise TypeError(f"{cls!r} is not a subclass of hwplace.Worker")
        worker = cls.__new__(cls)
        worker._hwplace_context = context
        worker.__init__(*args, **kwargs)  # type: ignore[misc]
    except BaseException as exc:  # a constructor calling sys.exit must not take the process down unreported
        return RemoteFailure.capture(exc)
    return worker


def _configure_logging() -> None:
    logger = logging.getLogger("hwplace.worker")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(os.environ.get(LOG_LEVEL_VARIABLE, "INFO").upper())


def find_method(worker: Worker, method: str) -> Callable[..., Any]:
    """The bound public method ``method`` of ``worker``."""
    if method.startswith("_"):
        raise AttributeError(f"{method!r} is private; groups call public methods only")
    fn = getattr(worker, method)
    if not callable(fn):
        raise TypeError(f"{type(worker).__name__}.{method} is not a method")
    return fn  # type: ignore[no-any-return]


def run_method(worker: Worker, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Run a plain method; what it raises comes back as a :class:`RemoteFailure`."""
    try:
        return find_method(worker, method)(*args, **kwargs)
    except BaseException as exc:
        return RemoteFailure.capture(exc)


async def run_method_async(worker: Worker, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Run an ``async def`` method; what it raises comes back as a :class:`RemoteFailure`."""
    try:
        return await find_method(worker, method)(*args, **kwargs)
    except BaseException as exc:
        return RemoteFailure.capture(exc)
