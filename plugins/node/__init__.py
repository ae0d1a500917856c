"""The plain-node backend: each node is one resource; it reports CPUs, memory and address."""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import hwplace


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _address(hostname: str) -> str:
    try:
        return socket.gethostbyname(hostname)
    except OSError:
        return "127.0.0.1"


class PlainNode(hwplace.HardwareBackend):
    """The node itself, as one resource; it asks for no isolation variables."""

    name = "node"
    kind = "node"

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        hostname = socket.gethostname()
        properties = {
            "hostname": hostname,
            "address": _address(hostname),
            "cpus": _cpu_count(),
            "memory_bytes": _memory_bytes(),
        }
        return [hwplace.Device(0, f"{platform.system()} {platform.machine()}", properties=properties)]


@hwplace.hookimpl
def hwplace_hardware_backends() -> list[hwplace.HardwareBackend]:
    return [PlainNode()]
