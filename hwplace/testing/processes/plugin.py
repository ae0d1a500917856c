"""The plugin object that registers a process cluster's executor with hwplace's plugin manager.

The driver registers it for a :func:`~hwplace.testing.process_cluster` block; each worker process registers
it too, with the executor it was handed, so that the worker's channels, messaging and turns find it by name.
Imports the contracts.
"""

from __future__ import annotations

import pluggy

from hwplace.contracts.executor import Executor

hookimpl = pluggy.HookimplMarker("hwplace")  # the marker hwplace.hookimpl is (the face is not imported here)


class ExecutorPlugin:
    """A plugin providing one executor object."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    @hookimpl
    def hwplace_executors(self) -> list[Executor]:
        return [self.executor]

    def __repr__(self) -> str:
        return f"<ExecutorPlugin {self.executor!r}>"
