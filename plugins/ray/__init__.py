"""The Ray executor plugin: workers as Ray actors pinned to their nodes (``pip install 'hwplace[ray]'``).

Registered through the ``hwplace`` entry-point group like any third-party plugin. Importing it does not
import Ray; connecting a cluster does.
"""

from __future__ import annotations

import hwplace
from hwplace_plugins.ray.executor import RayExecutor


@hwplace.hookimpl
def hwplace_executors() -> list[hwplace.Executor]:
    return [RayExecutor()]
