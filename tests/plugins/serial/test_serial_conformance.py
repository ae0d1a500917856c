"""The serial-robot backend passes the conformance kit every backend author runs (on loop:// robots)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from hwplace.testing.conformance import BackendConformance
from hwplace_plugins import serial


class TestSerialRobot(BackendConformance):
    plugin = serial
    backend_name = "serial-robot"
    configs: ClassVar[Sequence[Mapping[str, Any]]] = (
        {"name": "left", "url": "loop://", "baudrate": 115200, "handshake": {"send": "PING\\n", "expect": "PING"}},
        {"name": "right", "url": "loop://", "baudrate": 9600},
        {"name": "gone", "port": "/dev/hwplace-no-such-tty", "baudrate": 9600},
    )
