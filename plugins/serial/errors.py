"""The errors a worker's serial robot raises; all are :class:`hwplace.HwplaceError`."""

from __future__ import annotations

import hwplace


class SerialRobotError(hwplace.HwplaceError):
    """A serial robot cannot be used; the message names the robot and its port.

    ``port`` is the port path or pyserial URL concerned, where one is known.
    """

    def __init__(self, message: str, *, port: str | None = None) -> None:
        super().__init__(message)
        self.port = port


class RobotNotPlaced(SerialRobotError, LookupError):
    """This process has no robots placed (``HWPLACE_SERIAL_ROBOTS`` missing or garbled), or not the one asked for."""


class RobotBusy(SerialRobotError):
    """Another process holds the robot's port (exclusively, through ``open_robot``)."""


class RobotUnavailable(SerialRobotError):
    """The robot's port cannot be opened: no such port, permission denied, no USB match, a bad URL."""


class RobotDisconnected(SerialRobotError):
    """Reading or writing the robot failed after it was opened: it was unplugged, or its port went away."""


class RobotTimeout(SerialRobotError, TimeoutError):
    """A write did not complete within the ``write_timeout`` the robot was opened with."""


__all__ = ["RobotBusy", "RobotDisconnected", "RobotNotPlaced", "RobotTimeout", "RobotUnavailable", "SerialRobotError"]
