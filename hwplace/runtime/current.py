"""Who this process is, when it hosts a worker: its :class:`~hwplace.contracts.records.WorkerContext`.

Set by the worker host (:mod:`hwplace.runtime.hosting`) before the worker is constructed; read by what a
worker is handed and uses without a ``self`` (a :class:`hwplace.WeightSync`). Imports the layers below.
"""

from __future__ import annotations

from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import HwplaceError

_context: list[WorkerContext] = []


def set_worker_context(context: WorkerContext) -> None:
    _context[:] = [context]


def worker_context(what: str) -> WorkerContext:
    """This process's worker context; ``HwplaceError`` saying ``what`` needs a worker when there is none."""
    if not _context:
        raise HwplaceError(f"{what} runs inside a worker (a method of a hwplace.Worker), not on the driver")
    return _context[0]
