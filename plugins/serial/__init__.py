"""The ``serial-robot`` backend: robots on serial ports, through pyserial.

Each ``hardware.configs`` entry names one robot by port path, pyserial URL or USB identity, with its baud
rate and an optional handshake; detection opens each port exclusively, runs the handshake and reports the
robot healthy or not, with the reason. A worker owns the robots in ``HWPLACE_SERIAL_ROBOTS`` and opens one
with :func:`open_robot`, which takes the port exclusively. pyserial is imported only when a port is used.
See docs/backends/serial-robot.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import hwplace
from hwplace_plugins.serial.config import RobotConfig, UsbIdentity, parse_config
from hwplace_plugins.serial.detect import detect_robots
from hwplace_plugins.serial.errors import (
    RobotBusy,
    RobotDisconnected,
    RobotNotPlaced,
    RobotTimeout,
    RobotUnavailable,
    SerialRobotError,
)
from hwplace_plugins.serial.opening import match_usb
from hwplace_plugins.serial.port import ENV_VARIABLE, PlacedRobot, open_robot, placed_robots, robots_env


class SerialRobot(hwplace.HardwareBackend):
    """One robot per ``hardware.configs`` entry, on a serial port; isolated by ``HWPLACE_SERIAL_ROBOTS``."""

    name = "serial-robot"
    kind = "device"

    def check_config(self, config: Mapping[str, Any]) -> None:
        parse_config(config)

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        return detect_robots(configs)

    def isolation_env(self, devices: Sequence[hwplace.Device]) -> dict[str, str]:
        """``HWPLACE_SERIAL_ROBOTS``: the owned robots as a JSON list of ``{name, port or usb, baudrate}``."""
        return robots_env(devices)


@hwplace.hookimpl
def hwplace_hardware_backends() -> list[hwplace.HardwareBackend]:
    return [SerialRobot()]


__all__ = [
    "ENV_VARIABLE",
    "PlacedRobot",
    "RobotBusy",
    "RobotConfig",
    "RobotDisconnected",
    "RobotNotPlaced",
    "RobotTimeout",
    "RobotUnavailable",
    "SerialRobot",
    "SerialRobotError",
    "UsbIdentity",
    "hwplace_hardware_backends",
    "match_usb",
    "open_robot",
    "parse_config",
    "placed_robots",
]
