"""What a hardware backend is: the :class:`HardwareBackend` base class and the :class:`Device` record."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

Kind = Literal["accelerator", "device", "node"]
KINDS: tuple[Kind, ...] = ("accelerator", "device", "node")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class Device:
    """One unit of hardware a backend found on a node.

    ``index`` is node-local and counts from 0 among the devices of one backend on one node; it is what
    placement strings and ``isolation_env`` refer to. ``healthy`` is False when the device is present but
    unusable, and ``reason`` then says why.
    """

    index: int
    model: str
    healthy: bool = True
    reason: str = ""
    properties: Mapping[str, Any] = field(default_factory=dict)


class HardwareBackend:
    """Base class of every hardware backend; subclass it in your plugin.

    Set ``name`` (unique; the YAML ``hardware.type``) and ``kind``:

    - ``"accelerator"``: found on every node without declaration (GPUs, NPUs);
    - ``"device"``: declared per node in ``hardware.configs`` (robots);
    - ``"node"``: the node itself (the built-in plain-node backend).
    """

    name: ClassVar[str] = ""
    kind: ClassVar[Kind] = "accelerator"

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[Device]:
        """Run on the node; return its devices, or ``[]`` when there are none.

        For ``device`` backends ``configs`` holds this node's ``hardware.configs`` entries, and the device
        at position i answers entry i. For the other kinds it is empty.
        """
        raise NotImplementedError(f"{type(self).__name__}.detect")

    def isolation_env(self, local_ids: Sequence[int]) -> dict[str, str]:
        """Environment variables that make a process see only these node-local devices."""
        return {}

    def check_config(self, config: Mapping[str, Any]) -> None:
        """Reject a ``hardware.configs`` entry this backend cannot use, raising ``ValueError``.

        Called before detection, on the driver; ``node_rank`` has already been checked by hwplace.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.kind})>"


def check_backend(backend: object) -> str | None:
    """Say what is wrong with a backend object a plugin returned, or ``None`` when it is usable."""
    if not isinstance(backend, HardwareBackend):
        return f"{backend!r} is not a hwplace.HardwareBackend"
    if not isinstance(backend.name, str) or not _NAME.match(backend.name):
        return (
            f"{type(backend).__name__}.name is {backend.name!r}; a backend name is lower-case letters, "
            "digits, '.', '_' and '-', starting with a letter or digit"
        )
    if backend.kind not in KINDS:
        return f"backend {backend.name!r} has kind {backend.kind!r}; allowed: {', '.join(KINDS)}"
    return None
