"""A second executor, for tests and machines without Ray: simulated nodes on this machine, workers as child
processes (``hwplace.testing.ProcessExecutor``, ``hwplace.testing.process_cluster``).

It implements the whole executor contract (workers, handles, cancellation, rendezvous, channels, turns,
leases and status) with the standard library, so the runtime's tests run against it as against Ray, and it
shows that the executor is a plugin seam. Part of the testing layer: imports the layers below.
"""

from __future__ import annotations

from hwplace.testing.processes.cluster import process_cluster
from hwplace.testing.processes.executor import ProcessExecutor

__all__ = ["ProcessExecutor", "process_cluster"]
