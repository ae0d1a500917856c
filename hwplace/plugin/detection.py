"""Running one backend's ``detect`` safely: in a bounded time, on a thread of its own, its answer checked.

A backend that hangs, raises or returns something unusable becomes a :class:`Detection` with an ``error``;
nothing here raises for it. Imports the foundation and the contracts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.contracts.hardware import Device, HardwareBackend, NoDevices
from hwplace.foundation.settings import read_detect_timeout
from hwplace.foundation.wording import safe_repr

MAX_DEVICES = 65_536  # per backend and node; more is a broken backend, not hardware


@dataclass(frozen=True)
class Detection:
    """The outcome of one backend's ``detect`` on one node."""

    backend: str
    devices: tuple[Device, ...] = ()
    error: str | None = None
    seconds: float = 0.0
    absent: str | None = None  # why there are no devices, when the backend said (``NoDevices(reason)``)


def detect_timeout() -> float:
    """The time bound of one ``detect`` call: ``HWPLACE_DETECT_TIMEOUT`` seconds, 10 by default."""
    return read_detect_timeout()


class BoundedDetect:
    """One ``detect`` call, started on a daemon thread at once; :meth:`result` waits for it, bounded."""

    def __init__(self, name: str, backend: HardwareBackend, configs: Sequence[Mapping[str, Any]]) -> None:
        self.name = name
        self.kind = backend.kind
        self.configs = configs
        self._result: list[Any] = []
        self._error: list[BaseException] = []

        def target() -> None:
            try:
                self._result.append(backend.detect(configs))
            except BaseException as exc:
                self._error.append(exc)

        self._start = time.perf_counter()
        self.thread = threading.Thread(target=target, name=f"hwplace-detect-{name}", daemon=True)
        self.thread.start()

    def result(self, timeout: float) -> Detection:
        """What the backend found, or why not; a call still running after ``timeout`` seconds is an error."""
        self.thread.join(timeout)
        seconds = time.perf_counter() - self._start
        if self.thread.is_alive():
            return Detection(self.name, error=f"detect did not finish within {timeout:g} s", seconds=seconds)
        if self._error:
            return Detection(self.name, error=f"detect raised {safe_repr(self._error[0])}", seconds=seconds)
        return _checked(self.name, self.kind, self._result[0], self.configs, seconds)


def _checked(name: str, kind: str, devices: Any, configs: Sequence[Mapping[str, Any]], seconds: float) -> Detection:
    def fail(error: str) -> Detection:
        return Detection(name, error=error, seconds=seconds)

    if not isinstance(devices, list | tuple):
        return fail(f"detect returned {safe_repr(devices)}, not a list of hwplace.Device")
    if len(devices) > MAX_DEVICES:
        return fail(f"detect returned {len(devices)} devices; at most {MAX_DEVICES} per node are allowed")
    if not all(isinstance(d, Device) for d in devices):
        return fail(f"detect returned {safe_repr(devices)}, not a list of hwplace.Device")
    indexes = [d.index for d in devices]
    if indexes != list(range(len(devices))):
        return fail(f"detect returned device indexes {indexes}; expected 0..n-1 in order")
    if kind == "device" and len(devices) != len(configs):
        return fail(f"detect returned {len(devices)} devices for {len(configs)} configs")
    if isinstance(devices, NoDevices) and not devices:
        return Detection(name, seconds=seconds, absent=devices.reason)
    return Detection(name, devices=tuple(devices), seconds=seconds)
