"""The hooks a hwplace plugin may implement. One function per hook; no logic lives here."""

from __future__ import annotations

import pluggy

from hwplace.hardware import HardwareBackend

hookspec = pluggy.HookspecMarker("hwplace")


@hookspec
def hwplace_hardware_backends() -> list[HardwareBackend]:
    """Return the hardware backends this plugin provides (added in 0.1)."""
    raise NotImplementedError
