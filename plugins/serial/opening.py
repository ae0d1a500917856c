"""Opening a robot's port through pyserial, shared by detection and the worker helper.

pyserial is imported only when a port is opened or listed, never when the plugin is loaded.
"""

from __future__ import annotations

import errno
import importlib
import os
from collections.abc import Iterable, Sequence
from typing import Any

from hwplace_plugins.serial.config import UsbIdentity, show

PYSERIAL_MISSING = "pyserial is not installed: pip install 'hwplace[serial]'"
MISSING, DENIED, BUSY, OTHER = "no such port", "permission denied", "busy", "cannot open"


def import_pyserial() -> Any:
    """The ``serial`` module (pyserial), with ``serial.tools.list_ports`` loaded; ImportError when missing."""
    serial = importlib.import_module("serial")
    importlib.import_module("serial.tools.list_ports")
    if not hasattr(serial, "serial_for_url"):  # another distribution's "serial" module
        raise ImportError(f"the 'serial' module at {getattr(serial, '__file__', '?')} is not pyserial")
    return serial


def _group_hint(port: str) -> str:
    try:
        import grp  # noqa: PLC0415 (POSIX only)

        group = grp.getgrgid(os.stat(port).st_gid).gr_name
    except (ImportError, OSError, KeyError):
        return ""
    return f"; it belongs to group {group!r}: add the user to that group" if group != "root" else ""


def classify_open_error(exc: BaseException, port: str) -> tuple[str, str]:
    """``(kind, reason)`` for an exception raised while opening ``port``; the reason names the port."""
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code == errno.ENOENT:
        return MISSING, f"no such port: {port} does not exist"
    if code in (errno.ENODEV, errno.ENXIO):
        return MISSING, f"no such port: {port} has no device behind it (unplugged?)"
    if code in (errno.EACCES, errno.EPERM):
        return DENIED, f"permission denied: cannot open {port}{_group_hint(port)}"
    if code in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EBUSY) or "exclusively lock" in text:
        return BUSY, f"busy: {port} is in use by another process"
    if code == errno.EISDIR:
        return OTHER, f"not a serial port: {port} is a directory"
    if "Could not configure port" in text:
        return OTHER, f"not a serial port: {port} ({text})"
    prefix = f"could not open port {port}: "
    if text.lower().startswith(prefix.lower()):
        text = text[len(prefix):]
    if port in text or text != str(exc):
        return OTHER, f"cannot open {port}: {text}"
    return OTHER, f"cannot open {port}: {type(exc).__name__}: {text}"


def open_port(serial: Any, target: str, baudrate: int, *, timeout: float | None, write_timeout: float | None,
              wrap: Any = None) -> Any:
    """``target`` (a path or pyserial URL) opened exclusively; ``wrap(cls)`` may subclass pyserial's class.

    Raises whatever pyserial raises; :func:`classify_open_error` says what it means.
    """
    cls = type(serial.serial_for_url(target, do_not_open=True))  # ValueError for an unknown URL scheme
    if wrap is not None:
        cls = wrap(cls)
    conn = cls(None, baudrate=baudrate, timeout=timeout, write_timeout=write_timeout, exclusive=True)
    conn.port = target
    conn.open()
    return conn


def usb_ports(ports: Iterable[Any]) -> list[Any]:
    return [p for p in ports if getattr(p, "vid", None) is not None and getattr(p, "pid", None) is not None]


def _describe(port: Any) -> str:
    serial_number = f" serial_number {port.serial_number!r}" if port.serial_number is not None else ""
    return f"{port.device} (vid 0x{port.vid:04x} pid 0x{port.pid:04x}{serial_number})"


def match_usb(identity: UsbIdentity, ports: Iterable[Any]) -> list[Any]:
    """The ports (``serial.tools.list_ports`` records) whose USB identity matches, in device order."""
    found = [p for p in usb_ports(ports) if p.vid == identity.vid and p.pid == identity.pid
             and (identity.serial_number is None or p.serial_number == identity.serial_number)]
    return sorted(found, key=lambda p: str(p.device))


def resolve_usb(identity: UsbIdentity, ports: Sequence[Any]) -> tuple[Any, str]:
    """``(port, "")`` for the one port matching ``identity``, else ``(None, reason)``."""
    found = match_usb(identity, ports)
    if len(found) == 1:
        return found[0], ""
    if not found:
        attached = usb_ports(ports)
        listing = f"attached: {', '.join(_describe(p) for p in attached)}" if attached else \
            "no USB serial ports are attached"
        return None, f"no such port: no USB serial port matches {identity}; {listing}"
    return None, (f"ambiguous: {len(found)} USB serial ports match {identity}: "
                  f"{', '.join(_describe(p) for p in found)}; add usb.serial_number to pick one")


def list_ports(serial: Any) -> list[Any]:
    return list(serial.tools.list_ports.comports())


__all__ = ["PYSERIAL_MISSING", "classify_open_error", "import_pyserial", "match_usb", "open_port", "resolve_usb",
           "show"]
