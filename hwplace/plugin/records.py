"""What the plugin manager hands out: an item a plugin's hook provided, with the plugin and distribution it
came from, and a plugin that failed. Records only; imports the contracts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from hwplace.contracts.hardware import HardwareBackend

T = TypeVar("T")


@dataclass(frozen=True)
class Provided(Generic[T]):
    """Something a plugin's hook provided (a backend, an executor), and where it came from."""

    item: T
    plugin: str
    distribution: str


class BackendInfo(Provided[HardwareBackend]):
    """A registered hardware backend and where it came from."""

    @property
    def backend(self) -> HardwareBackend:
        return self.item

    @property
    def name(self) -> str:
        return self.item.name

    @property
    def kind(self) -> str:
        return self.item.kind


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded or whose hook failed; the others carry on."""

    plugin: str
    distribution: str
    error: str

    def __str__(self) -> str:
        return f"plugin {self.plugin!r} ({self.distribution}): {self.error}"
