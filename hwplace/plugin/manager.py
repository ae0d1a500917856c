"""The one owner of pluggy: discovers plugins, collects what their hooks provide and runs detection safely.

Call sites use the typed methods of :class:`PluginManager`; nothing else touches ``pm.hook``. Hooks are
called through pluggy (so hook wrappers work), but every plugin is registered behind a guard: a plain
hook implementation that raises, exits or returns something unusable is reported by name and the others
carry on.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pluggy

from hwplace.contracts import hookspecs
from hwplace.contracts.executor import Executor, check_executor
from hwplace.contracts.hardware import HardwareBackend, check_backend
from hwplace.foundation.errors import PluginError
from hwplace.foundation.frozen import freeze
from hwplace.foundation.settings import DISABLED_PLUGINS, TRACE_PLUGINS, read_detect_timeout, read_flag, read_list
from hwplace.foundation.wording import did_you_mean, safe_repr
from hwplace.plugin.detection import BoundedDetect, Detection
from hwplace.plugin.records import BackendInfo, PluginFailure, Provided

ENTRY_POINT_GROUP = "hwplace"
RUNTIME_DISTRIBUTION = "(registered at run time)"

def failures_note(manager: PluginManager) -> str:
    """For a message about a backend or executor that is not registered: the plugins that failed, if any."""
    failures = manager.failures
    return f"; it may come from a plugin that failed: {'; '.join(map(str, failures))}" if failures else ""


class PluginManager:
    """Loads hwplace plugins and gives typed access to what they provide.

    ``HWPLACE_DISABLED_PLUGINS=a,b`` blocks plugins by name; ``HWPLACE_TRACE_PLUGINS=1`` prints every hook
    call, every ``detect`` and their results to stderr. Each manager runs a backend's ``detect`` once per
    set of configs and keeps the result until asked to refresh.
    """

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self._pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self._pm.add_hookspecs(hookspecs)
        self._objects: dict[str, object] = {}  # plugin name -> the object registered under it
        self._distributions: dict[str, str] = {}
        self._load_failures: list[PluginFailure] = []
        self._hook_failures: dict[str, list[PluginFailure]] = {}
        self._provided: dict[str, dict[str, Any]] = {}  # hook name -> {item name: Provided}
        self._origins: dict[int, str] = {}  # id of an object a plugin returned -> plugin name
        self._detections: dict[tuple[str, Any] | None, Detection] = {}
        self._running: dict[tuple[str, Any], threading.Thread] = {}
        self._lock = threading.RLock()
        self.disabled = frozenset(read_list(DISABLED_PLUGINS))
        self.tracing = read_flag(TRACE_PLUGINS)
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
            if ep.name in self._objects:  # before importing it: two packages claim one name
                raise self._name_taken(ep.name, dist)
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as exc:  # a broken plugin must not take the others down
                self._fail_load(ep.name, dist, f"import of {ep.value!r} failed: {safe_repr(exc)}")
                continue
            try:
                self.register(plugin, name=ep.name, distribution=dist)
            except PluginError as exc:
                self._fail_load(ep.name, dist, str(exc))

    def _fail_load(self, name: str, dist: str, error: str) -> None:
        self._load_failures.append(PluginFailure(name, dist, error))
        self._trace(f"plugin {name!r} from {dist} not loaded: {error}")

    def register(self, plugin: object, name: str | None = None, distribution: str | None = None) -> str:
        """Register a plugin object or module; returns its name. Blocked names are ignored.

        A plugin that is not usable (a hook with a wrong signature, ``wrapper=True`` on a plain function,
        a name or an object registered already) raises :class:`PluginError`.
        """
        name = name or self.default_name(plugin)
        dist = distribution or RUNTIME_DISTRIBUTION
        with self._lock:
            if self._pm.is_blocked(name):
                return name
            if name in self._objects:
                raise self._name_taken(name, dist)
            for other, obj in self._objects.items():
                if obj is plugin:
                    raise PluginError(f"plugin {name!r} ({dist}) is {safe_repr(plugin)}, which is already "
                                      f"registered as plugin {other!r} ({self._distributions[other]})")
            proxy = self._guarded(plugin, name)
            try:
                self._pm.register(proxy, name=name)
            except (pluggy.PluginValidationError, ValueError) as exc:
                raise PluginError(f"plugin {name!r} ({dist}) cannot be registered: {exc}") from None
            unknown = self._unknown_hooks(proxy)
            if unknown:
                self._pm.unregister(name=name)
                raise PluginError(f"plugin {name!r} ({dist}) cannot be registered: {unknown}", plugins=(name,))
            self._objects[name] = plugin
            self._distributions[name] = dist
            self._provided.clear()
        self._trace(f"registered plugin {name!r} from {dist}")
        return name

    def _unknown_hooks(self, proxy: object) -> str | None:
        """What pluggy's ``check_pending`` would refuse in one plugin: an implementation of no hwplace hook."""
        known = [n for n in dir(hookspecs) if n.startswith(f"{ENTRY_POINT_GROUP}_")]
        for caller in self._pm.get_hookcallers(proxy) or ():
            if not caller.has_spec():
                return (f"{caller.name} is not a hwplace hook{did_you_mean(caller.name, known)} "
                        f"(hooks: {', '.join(known)})")
        return None

    def default_name(self, plugin: object) -> str:
        """The name ``register`` gives a plugin registered without one."""
        return self._pm.get_canonical_name(plugin)

    def _name_taken(self, name: str, dist: str) -> PluginError:
        return PluginError(f"two plugins are named {name!r}: one from {self._distributions[name]}, one from {dist}; "
                           "uninstall or disable one (HWPLACE_DISABLED_PLUGINS)", plugins=(name,))

    def unregister(self, name: str) -> None:
        """Remove the plugin registered under ``name``."""
        with self._lock:
            if name in self._objects:
                self._pm.unregister(name=name)
            self._objects.pop(name, None)
            self._distributions.pop(name, None)
            self._provided.clear()

    def plugin(self, name: str) -> object | None:
        """The object registered under ``name``, or ``None``."""
        return self._objects.get(name)

    def name_of(self, plugin: object) -> str | None:
        """The name ``plugin`` (the very object) is registered under, or ``None``."""
        return next((name for name, obj in self._objects.items() if obj is plugin), None)

    def plugins(self) -> dict[str, str]:
        """Registered plugin names and the distribution each came from."""
        return dict(self._distributions)

    @property
    def failures(self) -> list[PluginFailure]:
        """Plugins that failed to load, or whose hooks raised or returned something unusable."""
        self.backends()
        self.executors()
        return [*self._load_failures, *(f for fs in self._hook_failures.values() for f in fs)]

    def _guarded(self, plugin: object, name: str) -> object:
        """A stand-in for ``plugin`` whose plain hook implementations never raise and record what they return."""
        proxy = _Guarded(name)
        for attr in dir(plugin):
            if not attr.startswith(f"{ENTRY_POINT_GROUP}_"):
                continue
            try:
                opts = self._pm.parse_hookimpl_opts(plugin, attr)
                function = getattr(plugin, attr)
            except Exception as exc:
                raise PluginError(f"plugin {name!r}: reading {attr} raised {safe_repr(exc)}") from None
            if opts is None or not callable(function):
                continue
            if opts.get("wrapper") or opts.get("hookwrapper"):
                setattr(proxy, attr, function)  # pluggy validates wrappers itself at registration
            else:
                setattr(proxy, attr, self._guard(name, attr, function, opts))
        return proxy

    def _guard(self, name: str, hook: str, function: Callable[..., Any], opts: Any) -> Callable[..., Any]:
        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                result = function(*args, **kwargs)
            except (Exception, SystemExit) as exc:
                self._hook_failed(name, f"{hook} raised {safe_repr(exc)}", hook)
                return None
            self._trace(f"{hook}() [plugin {name}] -> {safe_repr(result, short=False)}")
            if not isinstance(result, list | tuple):
                self._hook_failed(name, f"{hook} returned {safe_repr(result)}, not a list", hook)
                return None
            for item in result:
                self._origins[id(item)] = name
            return list(result)

        setattr(guarded, f"{ENTRY_POINT_GROUP}_impl", opts)
        return guarded

    def _hook_failed(self, plugin: str, error: str, hook: str) -> None:
        dist = self._distributions.get(plugin, RUNTIME_DISTRIBUTION)
        self._hook_failures.setdefault(hook, []).append(PluginFailure(plugin, dist, error))
        self._trace(f"plugin {plugin!r}: {error}")

    # -- what hooks provide --------------------------------------------------------------------------

    def _collect(self, hook: str, noun: str, check: Callable[[object], str | None]) -> dict[str, Any]:
        """Call ``hook`` through pluggy once; validate and name what it returned, by item name."""
        with self._lock:
            if hook in self._provided:
                return self._provided[hook]
            self._hook_failures[hook] = []
            self._origins.clear()
            try:
                results = getattr(self._pm.hook, hook)()
            except (Exception, SystemExit) as exc:  # only a hook wrapper can raise here
                self._hook_failed("(a hook wrapper)", f"{hook} raised {safe_repr(exc)}", hook)
                results = []
            provided: dict[str, Provided[Any]] = {}
            for result in results:
                for item in result if isinstance(result, list | tuple) else [result]:
                    plugin = self._origins.get(id(item), "(a hook wrapper)")
                    dist = self._distributions.get(plugin, RUNTIME_DISTRIBUTION)
                    problem = check(item)
                    if problem is not None:
                        self._hook_failed(plugin, problem, hook)
                        continue
                    other = provided.get(item.name)
                    if other is not None:
                        if other.item is item:
                            continue
                        raise PluginError(
                            f"two {noun} are named "
                            f"{item.name!r}: one from plugin {other.plugin!r} (distribution {other.distribution}), "
                            f"one from plugin {plugin!r} (distribution {dist}); uninstall or disable one "
                            "(HWPLACE_DISABLED_PLUGINS)", plugins=(other.plugin, plugin))
                    info_type = BackendInfo if isinstance(item, HardwareBackend) else Provided
                    provided[item.name] = info_type(item, plugin, dist)
            self._origins.clear()
            self._provided[hook] = provided
            return provided

    def backends(self) -> Mapping[str, BackendInfo]:
        """Every usable backend by name (read-only). Two backends claiming one name raise :class:`PluginError`."""
        return types.MappingProxyType(self._collect("hwplace_hardware_backends", "backends", check_backend))

    def backend(self, name: str) -> BackendInfo:
        """The backend called ``name``; :class:`PluginError` naming the registered ones when there is none."""
        return _named(self.backends(), name, "hardware backend")

    def backends_of_kind(self, kind: str) -> list[BackendInfo]:
        """The backends of one kind (``"accelerator"``, ``"device"`` or ``"node"``), in registration order."""
        return [info for info in self.backends().values() if info.kind == kind]

    def node_backend(self) -> BackendInfo:
        """The one backend of kind ``node``: what a node-kind resource is. :class:`PluginError` when none or several."""
        found = self.backends_of_kind("node")
        if len(found) != 1:
            names = ", ".join(f"{b.name!r} ({b.distribution})" for b in found)
            raise PluginError(
                f"exactly one backend of kind 'node' must be registered, found {names or 'none'}; "
                "it is what a node-kind resource is (group 'node', or groups without hardware). The built-in "
                f"one is the 'node' plugin{self._disabled_hint()}")
        return found[0]

    def executors(self) -> Mapping[str, Provided[Executor]]:
        """Every usable executor by name (read-only)."""
        return types.MappingProxyType(self._collect("hwplace_executors", "executors", check_executor))

    def executor(self, name: str) -> Executor:
        """The executor called ``name``; :class:`PluginError` naming the registered ones when there is none."""
        return _named(self.executors(), name, "executor", self._disabled_hint()).item

    def _disabled_hint(self) -> str:
        return f" (disabled here: HWPLACE_DISABLED_PLUGINS={','.join(sorted(self.disabled))})" if self.disabled else ""

    # -- detection ----------------------------------------------------------------------------------

    def detect(
        self,
        name: str,
        configs: Sequence[Mapping[str, Any]] = (),
        *,
        timeout: float | None = None,
        refresh: bool = False,
    ) -> Detection:
        """Run one backend's ``detect`` in a bounded time, once per configs; failures are reported, never raised.

        A detect that timed out keeps its thread until it returns; it is not started again meanwhile.
        """
        backend = self.backend(name).backend
        try:
            key: tuple[str, Any] | None = (name, freeze(configs))
        except TypeError:  # configs that are not plain data (a caller's own objects): not cached
            key = None
        with self._lock:
            if not refresh and key in self._detections:
                return self._detections[key]
            running = self._running.get(key) if key is not None else None
            if running is not None and running.is_alive():
                return Detection(name, error="an earlier detect is still running (it timed out and has not returned)")
            call = BoundedDetect(name, backend, configs)
            if key is not None:
                self._running[key] = call.thread
        detection = call.result(read_detect_timeout() if timeout is None else timeout)
        if key is not None:
            with self._lock:
                self._detections[key] = detection
        outcome = detection.error or safe_repr(list(detection.devices), short=False)
        self._trace(f"{name}.detect({safe_repr(list(configs), short=False)}) -> {outcome}")
        return detection

    def _trace(self, message: str) -> None:
        if self.tracing:
            print(f"hwplace trace: {message}", file=sys.stderr, flush=True)


class _Guarded:
    """What pluggy registers in a plugin's place; one per plugin, equal only to itself (unlike a namespace:
    two plugins without hooks must not look like one plugin registered twice)."""

    def __init__(self, name: str) -> None:
        self._plugin_name = name

    def __repr__(self) -> str:
        return f"<guarded plugin {self._plugin_name!r}>"


P = TypeVar("P", bound=Provided[Any])


def _named(provided: Mapping[str, P], name: str, noun: str, hint: str = "") -> P:
    """``provided[name]``, or a :class:`PluginError` naming what is registered."""
    if name not in provided:
        raise PluginError(f"no {noun} is named {name!r}; registered: {', '.join(provided) or 'none'}"
                          f"{did_you_mean(name, provided)}{hint}")
    return provided[name]
