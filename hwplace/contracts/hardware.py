"""What a hardware backend is: the :class:`HardwareBackend` base class and the :class:`Device` record."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from hwplace.foundation.frozen import FrozenDict, freeze
from hwplace.foundation.wording import safe_repr

Kind = Literal["accelerator", "device", "node"]
KINDS: tuple[Kind, ...] = ("accelerator", "device", "node")
PLUGIN_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
BACKEND_ALIASES = {  # what people call a backend, for the did-you-mean of a type name that names none
    "gpu": "cuda", "gpus": "cuda", "nvidia": "cuda", "nvidia-gpu": "cuda", "cuda-gpu": "cuda",
    "ascend": "npu", "npus": "npu", "huawei": "npu", "fake": "fake-accelerator", "serial": "serial-robot",
    "robot": "serial-robot",
}
"""What a backend's or executor's name may be: 1 to 64 lower-case letters, digits, '.', '_' and '-'."""


@dataclass(frozen=True)
class Device:
    """One unit of hardware a backend found on a node; immutable and picklable.

    ``index`` is node-local and counts from 0 among the devices of one backend on one node; it is what
    placement refers to. ``healthy`` is False when the device is present but unusable, and ``reason`` then
    says why. ``properties`` holds free-form, JSON-like facts (a UUID, a physical id, a port path); it is
    stored as a read-only mapping, lists becoming tuples.
    """

    index: int
    model: str
    healthy: bool = True
    reason: str = ""
    properties: Mapping[str, Any] = field(default_factory=FrozenDict)

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise TypeError(f"Device.index must be a non-negative integer, got {safe_repr(self.index)}")
        for name in ("model", "reason"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Device.{name} must be a string, got {safe_repr(getattr(self, name))}")
        if not isinstance(self.healthy, bool):
            raise TypeError(f"Device.healthy must be True or False, got {safe_repr(self.healthy)}")
        if not isinstance(self.properties, Mapping):
            raise TypeError(f"Device.properties must be a mapping, got {safe_repr(self.properties)}")
        object.__setattr__(self, "properties", freeze(self.properties, "Device.properties"))


class NoDevices(list):  # type: ignore[type-arg]
    """What ``detect`` returns when there is no such hardware here: an empty list that says why.

    ``return hwplace.NoDevices("pynvml is not installed: pip install 'hwplace[cuda]'")``. It is not an
    error: placement sees no devices, and ``hwplace hardware`` shows the reason.
    """

    def __init__(self, reason: str) -> None:
        super().__init__()
        if not isinstance(reason, str):
            raise TypeError(f"NoDevices(reason) takes a string, got {safe_repr(reason)}")
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return NoDevices, (self.reason,)


class HardwareBackend:
    """Base class of every hardware backend; subclass it in your plugin.

    Set ``name`` (unique; the YAML ``hardware.type``) and ``kind``:

    - ``"accelerator"``: found on every node without declaration (GPUs, NPUs);
    - ``"device"``: declared per node in ``hardware.configs`` (robots);
    - ``"node"``: the node itself (the built-in plain-node backend).
    """

    name: ClassVar[str] = ""
    kind: ClassVar[Kind] = "accelerator"
    collective_backend: ClassVar[str] = "gloo"
    """The torch.distributed backend for tensors on this hardware (``"nccl"`` for CUDA); optional, ``"gloo"``
    (tensors in host memory) by default. Messaging between two workers uses it when both ends have it."""

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[Device]:
        """Run on the node; return its devices, or ``[]`` (``NoDevices(reason)``) when there are none.

        For ``device`` backends ``configs`` holds this node's ``hardware.configs`` entries, and the device
        at position i answers entry i. For the other kinds it is empty.
        """
        raise NotImplementedError(f"{type(self).__name__}.detect")

    def isolation_env(self, devices: Sequence[Device]) -> dict[str, str]:
        """Environment variables that make a process see only ``devices`` (its own, in index order)."""
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
        return f"{safe_repr(backend)} is not a hwplace.HardwareBackend"
    cls = type(backend).__name__
    try:
        name, kind = backend.name, backend.kind
    except Exception as exc:
        return f"reading {cls}.name and .kind raised {safe_repr(exc)}"
    if not isinstance(name, str) or not PLUGIN_NAME.match(name):
        return (f"{cls}.name is {safe_repr(name)}; a backend name is 1 to 64 lower-case letters, digits, "
                "'.', '_' and '-', starting with a letter or digit")
    if not isinstance(kind, str) or kind not in KINDS:
        return f"backend {name!r} has kind {safe_repr(kind)}; allowed: {', '.join(KINDS)}"
    return None
