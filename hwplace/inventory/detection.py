"""Detection on one node: what every backend finds here, plus the devices a config declares for this node.

An executor runs :func:`detect_here` on each node while it discovers the cluster. Imports the contracts and
the plugin manager.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hwplace.contracts.hardware import Device
from hwplace.plugin.manager import PluginManager
from hwplace.plugin.session import get_plugin_manager


def detect_node_hardware(
    declared: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    manager: PluginManager,
    refresh: bool = False,
) -> tuple[dict[str, tuple[Device, ...]], dict[str, str]]:
    """Run detection here, on this node: every accelerator and node backend, plus the declared devices.

    ``declared`` maps a device backend's name to this node's configs for it. Returns the devices by
    backend name and the problems found (by backend name, or ``plugin 'x'``).
    """
    hardware: dict[str, tuple[Device, ...]] = {}
    problems = {f"plugin {f.plugin!r}": f"({f.distribution}) {f.error}" for f in manager.failures}
    backends = manager.backends()
    for name, info in backends.items():
        if info.kind == "device" and name not in declared:
            continue
        detection = manager.detect(name, declared.get(name, ()), refresh=refresh)
        if detection.error is not None:
            problems[name] = detection.error
        elif detection.devices:
            hardware[name] = detection.devices
    for name in sorted(set(declared) - set(backends)):
        problems[name] = "no such backend is registered on this node"
    return hardware, problems


def detect_here(
    declared: Mapping[str, Sequence[Mapping[str, Any]]],
) -> tuple[dict[str, tuple[Device, ...]], dict[str, str]]:
    """Run every backend's detection on this node (an executor runs it on each node during ``discover``).

    ``declared`` maps a device backend's name to this node's configs for it. Returns the devices and the
    problems found, by backend name (or ``plugin 'x'``). Cached per process, like all detection.
    """
    return detect_node_hardware(declared, manager=get_plugin_manager())
