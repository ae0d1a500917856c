"""The Ray executor plugin: workers as Ray actors pinned to their nodes (``pip install 'hwplace[ray]'``).

Registered through the ``hwplace`` entry-point group like any third-party plugin. Importing it does not
import Ray; connecting a cluster does. Nor does it import the executor until one is asked for: a worker process
imports this package for its host (``runtime``) and needs none of the driver's side.
"""

from __future__ import annotations

import hwplace


@hwplace.hookimpl
def hwplace_executors() -> list[hwplace.Executor]:
    from hwplace_plugins.ray.executor import RayExecutor  # noqa: PLC0415 (the driver's side: loaded when asked for)

    return [RayExecutor()]
