"""The Ray executor plugin: workers as Ray actors pinned to their nodes (``pip install 'hwplace[ray]'``).

Registered through the ``hwplace`` entry-point group like any third-party plugin. Importing it does not
import Ray; connecting a cluster does. Nor does it import the executor until the hook asks for it: each worker
process imports this package for :mod:`hwplace_plugins.ray.host`, and has no use for the driver's side.
"""

from __future__ import annotations

import hwplace


@hwplace.hookimpl
def hwplace_executors() -> list[hwplace.Executor]:
    from hwplace_plugins.ray.executor import RayExecutor  # noqa: PLC0415 (measured import cost: not in a worker)

    return [RayExecutor()]
