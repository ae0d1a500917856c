"""``backend_plugin``: a throwaway plugin object that provides given hardware backends and executors, for
tests that need one registered (with ``registered_plugin`` or ``PluginManager.register``).

Part of the testing layer, the top of the core: it may import from every layer below it (here the
contracts), never from the package faces.
"""

from __future__ import annotations

from collections.abc import Sequence

import pluggy

from hwplace.contracts.executor import Executor
from hwplace.contracts.hardware import HardwareBackend

_hookimpl = pluggy.HookimplMarker("hwplace")  # what ``hwplace.hookimpl`` is; the face is not imported here


class BackendPlugin:
    """A plugin whose hooks return the hardware backends and the executors it was built with, the same
    objects at every call. Build it with :func:`backend_plugin`."""

    def __init__(self, backends: Sequence[HardwareBackend], executors: Sequence[Executor]) -> None:
        self.backends = list(backends)
        self.executors = list(executors)

    @_hookimpl
    def hwplace_hardware_backends(self) -> list[HardwareBackend]:
        return list(self.backends)

    @_hookimpl
    def hwplace_executors(self) -> list[Executor]:
        return list(self.executors)

    def __repr__(self) -> str:
        return f"backend_plugin({', '.join(map(repr, [*self.backends, *self.executors]))})"


def backend_plugin(*provided: HardwareBackend | Executor) -> BackendPlugin:
    """A plugin providing ``provided``: each a :class:`~hwplace.HardwareBackend` (returned by its
    ``hwplace_hardware_backends`` hook) or an :class:`~hwplace.executor.Executor` (by ``hwplace_executors``),
    in the order given::

        with registered_plugin(backend_plugin(MyTPU()), plugin_manager=manager):
            ...

    Anything else is a ``TypeError``; a plugin whose hooks misbehave is one to write by hand.
    """
    wrong = [item for item in provided if not isinstance(item, (HardwareBackend, Executor))]
    if wrong:
        raise TypeError(f"backend_plugin takes hwplace.HardwareBackend and hwplace.executor.Executor instances, "
                        f"not {', '.join(repr(item) for item in wrong)}")
    return BackendPlugin([item for item in provided if isinstance(item, HardwareBackend)],
                         [item for item in provided if isinstance(item, Executor)])
