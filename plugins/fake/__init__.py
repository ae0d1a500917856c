"""The fake backend: accelerators counted from ``HWPLACE_FAKE_ACCELERATORS``, each with the memory
``HWPLACE_FAKE_ACCELERATOR_MEMORY`` gives (``memory_bytes``, default 80GiB); robots from the config.

It behaves like a real backend in every other way, so the whole engine can be exercised anywhere.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import hwplace
from hwplace.names import (
    DEFAULT_FAKE_ACCELERATOR_MEMORY,
    FAKE_ACCELERATOR,
    FAKE_ACCELERATOR_MEMORY,
    FAKE_ACCELERATORS,
    FAKE_ROBOT,
    FAKE_ROBOTS,
    FAKE_VISIBLE_DEVICES,
)

COUNT_VARIABLE = FAKE_ACCELERATORS
MAX_ACCELERATORS = 4096  # per node; a larger count is a typo, refused before anything is allocated
ROBOT_KEYS = ("node_rank", "name", "model", "unhealthy")


class FakeAccelerator(hwplace.HardwareBackend):
    """``HWPLACE_FAKE_ACCELERATORS`` accelerators on each node, isolated by ``FAKE_VISIBLE_DEVICES``, each of
    ``HWPLACE_FAKE_ACCELERATOR_MEMORY`` bytes (an amount such as ``40GiB``; default 80GiB)."""

    name = FAKE_ACCELERATOR
    kind = "accelerator"

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        raw = os.environ.get(COUNT_VARIABLE, "").strip()
        if not raw or raw == "0":
            return hwplace.NoDevices(f"{COUNT_VARIABLE} is {'0' if raw else 'not set'} on this node: set it to a "
                                     "count to give the node fake accelerators")
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 6 and int(raw) <= MAX_ACCELERATORS):
            raise ValueError(f"{COUNT_VARIABLE} must be an integer from 0 to {MAX_ACCELERATORS}, got {raw[:20]!r}")
        memory = _memory()
        host = socket.gethostname()
        return [
            hwplace.Device(i, "hwplace fake accelerator",
                           properties={"uuid": f"FAKE-{host}-{i}", "memory_bytes": memory})
            for i in range(int(raw))
        ]

    def isolation_env(self, devices: Sequence[hwplace.Device]) -> dict[str, str]:
        return {FAKE_VISIBLE_DEVICES: ",".join(str(d.index) for d in devices)}


def _memory() -> int:
    """``HWPLACE_FAKE_ACCELERATOR_MEMORY`` in bytes (digits alone are bytes), read as offline inventories read it."""
    raw = os.environ.get(FAKE_ACCELERATOR_MEMORY, "").strip() or DEFAULT_FAKE_ACCELERATOR_MEMORY
    return hwplace.parse_size(int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 20 else raw,
                              FAKE_ACCELERATOR_MEMORY)


class FakeRobot(hwplace.HardwareBackend):
    """One robot per ``hardware.configs`` entry; ``unhealthy: "reason"`` makes one report a fault."""

    name = FAKE_ROBOT
    kind = "device"

    def check_config(self, config: Mapping[str, Any]) -> None:
        unknown = sorted(set(config) - set(ROBOT_KEYS))
        if unknown:
            raise ValueError(f"unknown fake-robot key(s) {unknown}; allowed: {', '.join(ROBOT_KEYS)}")
        for key in ("name", "model", "unhealthy"):
            if key in config and not isinstance(config[key], str):
                raise ValueError(f"fake-robot {key} must be a string, got {config[key]!r}")
        if "," in config.get("name", ""):
            raise ValueError(f"a fake-robot name may not contain ',' (FAKE_ROBOTS lists names with commas), "
                             f"got {config['name']!r}")

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        return [
            hwplace.Device(
                i,
                str(config.get("model", "hwplace fake robot")),
                healthy="unhealthy" not in config,
                reason=str(config.get("unhealthy", "")),
                properties={"name": str(config.get("name", f"fake-robot-{i}"))},
            )
            for i, config in enumerate(configs)
        ]

    def isolation_env(self, devices: Sequence[hwplace.Device]) -> dict[str, str]:
        """The robots' names: a robot is known by what its config calls it, not by its position."""
        return {FAKE_ROBOTS: ",".join(str(d.properties.get("name", f"fake-robot-{d.index}")) for d in devices)}


@hwplace.hookimpl
def hwplace_hardware_backends() -> list[hwplace.HardwareBackend]:
    return [FakeAccelerator(), FakeRobot()]
