"""The hooks a hwplace plugin may implement. One function per hook; no logic lives here."""

from __future__ import annotations

import pluggy

from hwplace.contracts.executor import Executor
from hwplace.contracts.hardware import HardwareBackend

_spec = pluggy.HookspecMarker("hwplace")


@_spec
def hwplace_hardware_backends() -> list[HardwareBackend]:
    """Return the hardware backends this plugin provides (added in 0.1)."""
    raise NotImplementedError


@_spec
def hwplace_executors() -> list[Executor]:
    """Return the executors this plugin provides; ``cluster.executor`` picks one by name (added in 0.2)."""
    raise NotImplementedError
