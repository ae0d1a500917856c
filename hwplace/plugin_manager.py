"""The one owner of pluggy: discovers plugins, collects their backends and runs detection safely.

Call sites use the typed methods of :class:`PluginManager`; nothing else touches ``pm.hook``.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pluggy

from hwplace import hookspecs
from hwplace.errors import PluginError
from hwplace.hardware import Device, HardwareBackend, check_backend

ENTRY_POINT_GROUP = "hwplace"
RUNTIME_DISTRIBUTION = "(registered at run time)"
DEFAULT_DETECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class BackendInfo:
    """A registered backend and where it came from."""

    backend: HardwareBackend
    plugin: str
    distribution: str

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def kind(self) -> str:
        return self.backend.kind


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded or whose hook failed; the others carry on."""

    plugin: str
    distribution: str
    error: str


@dataclass(frozen=True)
class Detection:
    """The outcome of one backend's ``detect`` on one node."""

    backend: str
    devices: tuple[Device, ...] = ()
    error: str | None = None
    seconds: float = 0.0


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _env_list(name: str) -> list[str]:
    return [part.strip() for part in os.environ.get(name, "").split(",") if part.strip()]


def detect_timeout() -> float:
    """The time bound of one ``detect`` call: ``HWPLACE_DETECT_TIMEOUT`` seconds, 10 by default."""
    raw = os.environ.get("HWPLACE_DETECT_TIMEOUT", "")
    try:
        value = float(raw) if raw else DEFAULT_DETECT_TIMEOUT
    except ValueError:
        raise PluginError(f"HWPLACE_DETECT_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise PluginError(f"HWPLACE_DETECT_TIMEOUT must be positive, got {raw!r}")
    return value


class PluginManager:
    """Loads hwplace plugins and gives typed access to what they provide.

    ``HWPLACE_DISABLED_PLUGINS=a,b`` blocks plugins by name; ``HWPLACE_TRACE_PLUGINS=1`` prints every hook
    call, every ``detect`` and their results to stderr.
    """

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self._pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self._pm.add_hookspecs(hookspecs)
        self._distributions: dict[str, str] = {}
        self._load_failures: list[PluginFailure] = []
        self._backends: dict[str, BackendInfo] | None = None
        self._hook_failures: list[PluginFailure] = []
        self.disabled = frozenset(_env_list("HWPLACE_DISABLED_PLUGINS"))
        self.tracing = _env_flag("HWPLACE_TRACE_PLUGINS")
        for name in self.disabled:
            self._pm.set_blocked(name)
        if load_entry_points:
            self.load_entry_points()

    # -- registration -------------------------------------------------------------------------------

    def load_entry_points(self) -> None:
        """Register every plugin of the ``hwplace`` entry-point group that is not disabled."""
        seen: set[tuple[str, str]] = set()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if (ep.name, ep.value) in seen or self._pm.is_blocked(ep.name):
                continue
            seen.add((ep.name, ep.value))
            dist = ep.dist.name if ep.dist is not None else "(unknown distribution)"
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not take the others down
                self._load_failures.append(PluginFailure(ep.name, dist, f"import failed: {exc!r}"))
                self._trace(f"load {ep.name} from {dist} failed: {exc!r}")
                continue
            self.register(plugin, name=ep.name, distribution=dist)

    def register(self, plugin: object, name: str | None = None, distribution: str | None = None) -> str:
        """Register a plugin object or module; returns its name. Blocked names are ignored."""
        name = name or self._pm.get_canonical_name(plugin)
        if self._pm.is_blocked(name):
            return name
        dist = distribution or RUNTIME_DISTRIBUTION
        if name in self._distributions:
            raise PluginError(
                f"two plugins are named {name!r}: one from {self._distributions[name]}, one from {dist}"
            )
        self._pm.register(plugin, name=name)
        self._distributions[name] = dist
        self._backends = None
        self._trace(f"registered plugin {name!r} from {dist}")
        return name

    def unregister(self, name: str) -> None:
        """Remove a plugin registered under ``name``."""
        self._pm.unregister(name=name)
        self._distributions.pop(name, None)
        self._backends = None

    def plugins(self) -> dict[str, str]:
        """Registered plugin names and the distribution each came from."""
        return dict(self._distributions)

    @property
    def failures(self) -> list[PluginFailure]:
        """Plugins that failed to import or whose hook raised or returned something unusable."""
        self._collect()
        return [*self._load_failures, *self._hook_failures]

    # -- backends -----------------------------------------------------------------------------------

    def backends(self) -> dict[str, BackendInfo]:
        """Every usable backend by name. Two backends claiming one name raise :class:`PluginError`."""
        return dict(self._collect())

    def backend(self, name: str) -> BackendInfo:
        """The backend called ``name``; :class:`KeyError` when there is none."""
        return self._collect()[name]

    def _collect(self) -> dict[str, BackendInfo]:
        if self._backends is not None:
            return self._backends
        backends: dict[str, BackendInfo] = {}
        failures: list[PluginFailure] = []
        hook = self._pm.hook.hwplace_hardware_backends
        for impl in hook.get_hookimpls():  # registration order
            plugin, dist = impl.plugin_name, self._distributions.get(impl.plugin_name, RUNTIME_DISTRIBUTION)
            try:
                returned = impl.function()
            except Exception as exc:
                failures.append(PluginFailure(plugin, dist, f"hwplace_hardware_backends raised {exc!r}"))
                self._trace(f"hwplace_hardware_backends() [plugin {plugin}] raised {exc!r}")
                continue
            self._trace(f"hwplace_hardware_backends() [plugin {plugin}] -> {returned!r}")
            if not isinstance(returned, list | tuple):
                failures.append(PluginFailure(plugin, dist, f"hwplace_hardware_backends returned {returned!r}, "
                                              "not a list of backends"))
                continue
            for backend in returned:
                problem = check_backend(backend)
                if problem is not None:
                    failures.append(PluginFailure(plugin, dist, problem))
                    continue
                other = backends.get(backend.name)
                if other is not None:
                    raise PluginError(
                        f"two backends are named {backend.name!r}: one from plugin {other.plugin!r} "
                        f"(distribution {other.distribution}), one from plugin {plugin!r} "
                        f"(distribution {dist}); uninstall or disable one (HWPLACE_DISABLED_PLUGINS)"
                    )
                backends[backend.name] = BackendInfo(backend, plugin, dist)
        self._backends, self._hook_failures = backends, failures
        return backends

    # -- detection ----------------------------------------------------------------------------------

    def detect(
        self, name: str, configs: Sequence[Mapping[str, Any]] = (), *, timeout: float | None = None
    ) -> Detection:
        """Run one backend's ``detect`` in a bounded time; failures are reported, never raised."""
        backend = self.backend(name).backend
        timeout = detect_timeout() if timeout is None else timeout
        result: list[Any] = []
        error: list[BaseException] = []

        def target() -> None:
            try:
                result.append(backend.detect(configs))
            except BaseException as exc:
                error.append(exc)

        start = time.perf_counter()
        thread = threading.Thread(target=target, name=f"hwplace-detect-{name}", daemon=True)
        thread.start()
        thread.join(timeout)
        seconds = time.perf_counter() - start
        if thread.is_alive():
            detection = Detection(name, error=f"detect did not finish within {timeout:g} s", seconds=seconds)
        elif error:
            detection = Detection(name, error=f"detect raised {error[0]!r}", seconds=seconds)
        else:
            detection = _checked(name, backend, result[0], configs, seconds)
        self._trace(f"{name}.detect({list(configs)!r}) -> {detection.error or list(detection.devices)!r}")
        return detection

    def _trace(self, message: str) -> None:
        if self.tracing:
            print(f"hwplace trace: {message}", file=sys.stderr, flush=True)


def _checked(
    name: str, backend: HardwareBackend, devices: Any, configs: Sequence[Mapping[str, Any]], seconds: float
) -> Detection:
    if not isinstance(devices, list | tuple) or not all(isinstance(d, Device) for d in devices):
        return Detection(name, error=f"detect returned {devices!r}, not a list of hwplace.Device", seconds=seconds)
    indexes = [d.index for d in devices]
    if indexes != list(range(len(devices))):
        return Detection(name, error=f"detect returned device indexes {indexes}; expected 0..n-1 in order",
                         seconds=seconds)
    if backend.kind == "device" and len(devices) != len(configs):
        return Detection(name, error=f"detect returned {len(devices)} devices for {len(configs)} configs",
                         seconds=seconds)
    return Detection(name, devices=tuple(devices), seconds=seconds)


_manager: PluginManager | None = None
_manager_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, created (and entry points loaded) on first use."""
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = PluginManager()
        return _manager

