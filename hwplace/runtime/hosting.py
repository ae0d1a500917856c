"""Hosting a worker in its process: what an executor runs there.

:func:`start_worker` sets the environment, loads the class and constructs it (a restarted rank inside a ``restart``
span of the timeline: here, where the worker's own process records its spans); :func:`run_method` (or
:func:`run_method_async`) runs each call and turns any exception into a :class:`RemoteFailure`, so that an
executor never loses a traceback and never kills the process over it. Imports the layers below and
:mod:`hwplace.runtime.worker`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.contracts.records import RestartInfo, WorkerContext
from hwplace.foundation import trace
from hwplace.foundation.errors import WorkerError
from hwplace.foundation.settings import read_log_level, read_trace_dir
from hwplace.foundation.wording import first_line
from hwplace.plugin.session import session
from hwplace.runtime.worker import Worker

RESTART_SPAN = "restart"  # a restarted rank's new process, from loading its class until it serves


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

    The environment is set before ``load_class`` runs, so modules the class imports see it. A restarted rank
    (``context.attempt`` above 0) then runs ``on_restart(info)`` when its class defines it. Anything the
    loading, the constructor or ``on_restart`` raises comes back as a :class:`RemoteFailure`. While tracing, a
    restarted rank's track has a ``restart`` span from before its class is loaded until it serves (or failed).
    """
    os.environ.update(context.env)
    here = session()
    here.worker = context
    if context.executor:
        here.set_executor(context.executor)
    restarting = None
    try:
        _configure_logging()
        _start_tracing(context)
        if context.attempt:
            restarting = trace.begin(RESTART_SPAN, trace.RESTART)
        cls = load_class()
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise TypeError(f"{cls!r} is not a subclass of hwplace.Worker")
        worker = cls.__new__(cls)
        worker._hwplace_context = context
        with trace.call_span("__init__"):
            worker.__init__(*args, **kwargs)  # type: ignore[misc]
        on_restart = getattr(worker, "on_restart", None)
        if context.attempt and callable(on_restart):
            with trace.call_span("on_restart"):
                on_restart(RestartInfo(context.rank, context.attempt, context.cause))
    except BaseException as exc:  # a constructor calling sys.exit must not take the process down unreported
        failure = RemoteFailure.capture(exc)
        _restarted(restarting, context, failed=failure.summary)
        return failure
    _restarted(restarting, context)
    return worker


def _restarted(started: tuple[str, str, int] | None, context: WorkerContext, **notes: str) -> None:
    """End a restarted rank's ``restart`` span (begun when tracing, else ``None``) with its ``attempt`` and
    ``cause``, and write it at once: its process may die again before its first call ends."""
    if started is not None:
        trace.end(started, attempt=context.attempt, cause=context.cause, **notes)
        trace.flush()


def _start_tracing(context: WorkerContext) -> None:
    """Record this worker's spans when its driver traces (``HWPLACE_TRACE_DIR``): a track per worker, named after
    its group and rank, on its node, holding its devices."""
    folder = read_trace_dir()
    if folder is not None:
        placement = context.placement
        trace.start(folder, {"group": context.group, "rank": context.rank, "node": placement.node_rank,
                             "devices": [f"{placement.hardware_type} {index}"
                                         for index in placement.local_hardware_ranks]})


def _configure_logging() -> None:
    logger = logging.getLogger("hwplace.worker")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(read_log_level())


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
    with trace.call_span(method):
        try:
            return find_method(worker, method)(*args, **kwargs)
        except BaseException as exc:
            return RemoteFailure.capture(exc)


async def run_method_async(worker: Worker, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Run an ``async def`` method; what it raises comes back as a :class:`RemoteFailure`.

    A cancelled call (``Handle.cancel()``) stays cancelled: its ``CancelledError`` goes on to the executor.
    """
    with trace.call_span(method):
        try:
            return await find_method(worker, method)(*args, **kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            return RemoteFailure.capture(exc)


def unpicklable_arguments(what: str, group: str, ranks: Sequence[int], args: tuple[Any, ...],
                          kwargs: Mapping[str, Any], dumps: Callable[[Any], Any], error: BaseException) -> WorkerError:
    """The :class:`WorkerError` for a call whose arguments the executor could not pickle (``error``): it names the
    first argument ``dumps`` (the executor's own pickler) refuses, and its type, or says the arguments as a whole."""
    named = [(f"argument {i}", v) for i, v in enumerate(args)] + [(f"argument {k!r}", v) for k, v in kwargs.items()]
    for name, value in named:
        try:
            dumps(value)
        except Exception as cause:  # whatever pickling raises names the culprit
            problem = f"{name}, a {type(value).__module__}.{type(value).__qualname__}, cannot be pickled " \
                      f"({first_line(cause)})"
            break
    else:
        problem = f"its arguments cannot be pickled ({first_line(error)})"
    where = "" if len(ranks) == 1 else f" to ranks {', '.join(map(str, ranks))}"
    return WorkerError(f"{what} was not sent{where}: {problem}; pass plain data, arrays or tensors, or objects "
                       "that pickle", group=group, rank=ranks[0] if len(ranks) == 1 else None)

