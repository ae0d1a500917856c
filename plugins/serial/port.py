"""The worker side: which robots this process was placed on, and opening one exclusively.

hwplace puts the robots a worker owns into its environment as ``HWPLACE_SERIAL_ROBOTS``, a JSON list in
the order of the placement (``[{"name": "left", "port": "/dev/ttyUSB0", "baudrate": 115200}, ...]``); a
robot declared by USB identity and not resolved while planning carries ``"usb"`` instead of ``"port"``, and
is looked up when it is opened.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import hwplace
from hwplace_plugins.serial.config import (
    USB_KEYS,
    UsbIdentity,
    check_baudrate,
    check_usb,
    default_name,
    did_you_mean,
    show,
)
from hwplace_plugins.serial.errors import (
    RobotBusy,
    RobotDisconnected,
    RobotNotPlaced,
    RobotTimeout,
    RobotUnavailable,
    SerialRobotError,
)
from hwplace_plugins.serial.opening import (
    BUSY,
    PYSERIAL_MISSING,
    classify_open_error,
    import_pyserial,
    list_ports,
    open_port,
    resolve_usb,
)

ENV_VARIABLE = "HWPLACE_SERIAL_ROBOTS"
MAX_ENV = 1 << 20  # bytes of HWPLACE_SERIAL_ROBOTS; more is no placement hwplace made


@dataclass(frozen=True)
class PlacedRobot:
    """One robot this process owns: its position in ``HWPLACE_SERIAL_ROBOTS``, name, port and line speed."""

    position: int
    name: str
    baudrate: int
    port: str | None = None
    usb: UsbIdentity | None = None

    @property
    def where(self) -> str:
        return self.port or f"USB {self.usb}"


def robot_record(device: hwplace.Device) -> dict[str, Any]:
    """The ``HWPLACE_SERIAL_ROBOTS`` entry for a detected or planned device (whose properties are its config)."""
    props = device.properties
    port = props.get("port") or props.get("url")
    usb: UsbIdentity | None = None
    if not port and isinstance(props.get("usb"), Mapping):
        try:
            usb = check_usb({k: v for k, v in props["usb"].items() if k in USB_KEYS})
        except ValueError:
            usb = None
    name = props.get("name") or (default_name(str(port) if port else None, None, usb) if port or usb
                                 else f"serial-robot-{device.index}")
    record: dict[str, Any] = {"name": str(name)}
    if port:
        record["port"] = str(port)
    elif usb is not None:
        record["usb"] = usb.as_dict()
    record["baudrate"] = props.get("baudrate")
    return record


def robots_env(devices: Sequence[hwplace.Device]) -> dict[str, str]:
    records = [robot_record(d) for d in devices]
    return {ENV_VARIABLE: json.dumps(records, separators=(",", ":"), ensure_ascii=True)}


def _not_placed(problem: str) -> RobotNotPlaced:
    return RobotNotPlaced(f"this process has no serial robots placed: {problem} (open_robot works in a worker "
                          "that hwplace placed on a serial-robot node group)")


def placed_robots(environ: Mapping[str, str] | None = None) -> list[PlacedRobot]:
    """The robots this process owns, from ``HWPLACE_SERIAL_ROBOTS`` (``environ`` defaults to ``os.environ``)."""
    raw = (os.environ if environ is None else environ).get(ENV_VARIABLE)
    if raw is None:
        raise _not_placed(f"{ENV_VARIABLE} is not set")
    if len(raw) > MAX_ENV:
        raise _not_placed(f"{ENV_VARIABLE} is {len(raw)} characters long, more than any placement makes")
    try:
        records = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _not_placed(f"{ENV_VARIABLE} is not JSON ({exc}): {show(raw)}") from None
    if not isinstance(records, list) or not records:
        raise _not_placed(f"{ENV_VARIABLE} is not a non-empty JSON list of robots: {show(raw)}")
    return [_placed(i, record) for i, record in enumerate(records)]


def _placed(position: int, record: Any) -> PlacedRobot:
    def bad(problem: str) -> RobotNotPlaced:
        return _not_placed(f"{ENV_VARIABLE}[{position}] {problem}: {show(json.dumps(record), 200)}")

    if not isinstance(record, dict):
        raise bad("is not a JSON object")
    name = record.get("name")
    if not isinstance(name, str) or not name:
        raise bad("has no name")
    try:
        baudrate = check_baudrate(record.get("baudrate"))
        usb = check_usb(record["usb"]) if record.get("usb") is not None else None
    except ValueError as exc:
        raise bad(f"is not a robot record ({exc})") from None
    port = record.get("port")
    if port is not None and (not isinstance(port, str) or not port or "\0" in port):
        raise bad("has a port that is not a path or URL")
    if port is None and usb is None:
        raise bad("has neither a port nor a USB identity (was it planned without one?)")
    return PlacedRobot(position, name, baudrate, port, usb)


def find_robot(which: int | str, robots: Sequence[PlacedRobot]) -> PlacedRobot:
    """The robot at position ``which`` (an int), or named ``which`` (a string)."""
    names = [r.name for r in robots]
    listing = ", ".join(f"{r.position}: {r.name!r}" for r in robots)
    if isinstance(which, int) and not isinstance(which, bool):
        if 0 <= which < len(robots):
            return robots[which]
        raise RobotNotPlaced(f"this process has {len(robots)} serial robot(s) ({listing}); there is no "
                             f"position {which}")
    if isinstance(which, str):
        found = [r for r in robots if r.name == which]
        if len(found) == 1:
            return found[0]
        if found:
            raise RobotNotPlaced(f"{len(found)} of this process's serial robots are named {which!r} ({listing}); "
                                 "open it by position, or give the robots distinct names")
        raise RobotNotPlaced(f"this process has no serial robot named {which!r}; it has {listing}"
                             f"{did_you_mean(which, names)}")
    raise TypeError(f"open_robot(which) takes a position (int) or a robot name (str), got {show(which)}")


_GUARDED: dict[type, type] = {}


def _guarded(base: type) -> type:
    """``base`` (a pyserial Serial class) with its I/O errors turned into errors that name the robot's port."""
    if base in _GUARDED:
        return _GUARDED[base]
    serial = import_pyserial()
    failures: tuple[type[BaseException], ...] = (serial.SerialException, OSError)
    try:
        import termios  # noqa: PLC0415 (POSIX only)

        failures += (termios.error,)
    except ImportError:  # not on a POSIX system
        pass

    def guard(name: str) -> Callable[..., Any]:
        unguarded = getattr(base, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return unguarded(self, *args, **kwargs)
            except failures as exc:
                raise self._robot_error(name, exc) from exc

        method.__name__ = name
        return method

    def robot_error(self: Any, action: str, exc: BaseException) -> Exception:
        robot = f"serial robot {self.robot_name!r} on {self.port}"
        if isinstance(exc, serial.SerialTimeoutException):
            return RobotTimeout(f"{robot}: {action} timed out after {self.write_timeout:g} s (write_timeout)",
                                port=self.port)
        if isinstance(exc, serial.PortNotOpenError):
            return SerialRobotError(f"{robot}: {action} on a closed port (it was closed in this process)",
                                    port=self.port)
        return RobotDisconnected(f"{robot}: {action} failed, the robot is gone (unplugged, or its port went "
                                 f"away): {exc}", port=self.port)

    unguarded_in_waiting = getattr(base, "in_waiting").fget  # noqa: B009 (a property of pyserial's class)

    def in_waiting(self: Any) -> int:
        try:
            return int(unguarded_in_waiting(self))
        except failures as exc:
            raise self._robot_error("in_waiting", exc) from exc

    namespace: dict[str, Any] = {name: guard(name) for name in (
        "read", "write", "flush", "reset_input_buffer", "reset_output_buffer", "send_break") if hasattr(base, name)}
    namespace.update(__module__=__name__, _robot_error=robot_error, in_waiting=property(in_waiting), robot_name="",
                     __doc__=f"{base.__doc__ or base.__name__}\n\nOpened by hwplace's open_robot: I/O errors name "
                             "the robot and its port.")
    cls = type(f"Robot{base.__name__}", (base,), namespace)
    _GUARDED[base] = cls
    return cls


def open_robot(
    which: int | str = 0,
    *,
    timeout: float | None = None,
    write_timeout: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> Any:
    """Open one of this process's robots, exclusively: a pyserial ``Serial``, already open.

    ``which`` is its position in the placement (0 for the first) or its name. ``timeout`` and
    ``write_timeout`` are pyserial's (``None`` blocks; a read returns early when the robot is unplugged).
    Raises :class:`RobotBusy` when another process holds the port, :class:`RobotUnavailable` when it cannot
    be opened, :class:`RobotNotPlaced` when this process has no such robot; once open, reads and writes
    raise :class:`RobotDisconnected` (the robot was unplugged) or :class:`RobotTimeout`, naming the port.
    """
    robot = find_robot(which, placed_robots(environ))
    try:
        serial = import_pyserial()
    except ImportError:
        raise RobotUnavailable(f"serial robot {robot.name!r} ({robot.where}): {PYSERIAL_MISSING}",
                               port=robot.port) from None
    port = robot.port
    if port is None:
        assert robot.usb is not None
        try:
            found, reason = resolve_usb(robot.usb, list_ports(serial))
        except Exception as exc:
            raise RobotUnavailable(f"serial robot {robot.name!r}: listing the serial ports to find USB "
                                   f"{robot.usb} failed: {type(exc).__name__}: {exc}") from exc
        if found is None:
            raise RobotUnavailable(f"serial robot {robot.name!r}: {reason}")
        port = str(found.device)
    try:
        conn = open_port(serial, port, robot.baudrate, timeout=timeout, write_timeout=write_timeout, wrap=_guarded)
    except (serial.SerialException, OSError, ValueError) as exc:
        kind, reason = classify_open_error(exc, port)
        if kind == BUSY:
            raise RobotBusy(f"serial robot {robot.name!r}: {port} is in use by another process (a robot is "
                            "driven by one process at a time)", port=port) from None
        raise RobotUnavailable(f"serial robot {robot.name!r}: {reason}", port=port) from None
    conn.robot_name = robot.name
    return conn


__all__ = ["ENV_VARIABLE", "PlacedRobot", "find_robot", "open_robot", "placed_robots", "robots_env"]
