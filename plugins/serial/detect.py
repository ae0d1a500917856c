"""Detection: open each declared robot's port exclusively, run its handshake, and say how it went.

Every robot is probed in a thread of its own, so a node's detection takes about as long as its slowest
robot: at most its handshake timeout plus :data:`OPEN_ALLOWANCE` seconds, and never more than 80% of
hwplace's bound on one detect call (``HWPLACE_DETECT_TIMEOUT``). A probe that overruns is reported
unhealthy ("timed out") and left to finish in the background.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import hwplace
from hwplace_plugins.serial.config import Handshake, RobotConfig, parse_config, show
from hwplace_plugins.serial.opening import (
    PYSERIAL_MISSING,
    classify_open_error,
    import_pyserial,
    list_ports,
    open_port,
    resolve_usb,
)

MODEL = "serial robot"
OPEN_ALLOWANCE = 3.0  # seconds for opening a port (a socket:// connect included), on top of the handshake
POLL = 0.05  # seconds between reads while waiting for a reply
LINE_GRACE = 0.2  # seconds to wait for the rest of a reply's line, to show it whole
MAX_REPLY = 120  # characters of a reply kept in a device's properties or shown in a reason


@dataclass
class Probe:
    """What probing one robot found; filled in by its thread."""

    healthy: bool = False
    reason: str = ""
    properties: dict[str, Any] = field(default_factory=dict)
    reply: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _line(data: bytes) -> str:
    text = data.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", "backslashreplace")
    return text[:MAX_REPLY]


def _read_reply(conn: Any, handshake: Handshake, clock: Any = time.monotonic) -> tuple[bytes, bool]:
    """Read until the reply starts with ``expect`` (True), cannot (False), or the handshake times out (False)."""
    expect = handshake.expect
    deadline = clock() + handshake.timeout
    reply = b""
    matched = False
    while clock() < deadline:
        reply += conn.read(max(1, conn.in_waiting))
        if reply[:len(expect)] != expect[:len(reply)]:
            break  # it cannot start with expect any more
        if len(reply) >= len(expect):
            matched = True
            break
    grace = min(deadline, clock() + LINE_GRACE)  # the rest of the line, to keep or show it whole
    while reply and b"\n" not in reply and len(reply) < 4 * MAX_REPLY and clock() < grace:
        reply += conn.read(max(1, conn.in_waiting))
    return reply, matched


def handshake_reason(conn: Any, handshake: Handshake, port: str) -> tuple[str, str]:
    """``("", reply line)`` when the robot answers as expected, else ``(reason, "")``."""
    if handshake.send:
        conn.reset_input_buffer()  # what an earlier session left unread is no reply to this one
        conn.write(handshake.send)
    reply, matched = _read_reply(conn, handshake)
    if matched:
        return "", _line(reply)
    after = f"after sending {show(handshake.send)}" if handshake.send else "of opening it (no handshake.send)"
    expected = f"expected a reply starting with {show(handshake.expect)}"
    if not reply:
        return f"no reply: {port} sent nothing within {handshake.timeout:g} s {after}; {expected}", ""
    if reply[:len(handshake.expect)] == handshake.expect[:len(reply)]:
        return (f"no reply: {port} sent only {show(reply)} within {handshake.timeout:g} s {after}; "
                f"{expected}"), ""
    return f"wrong reply: {port} answered {show(reply)} {after}; {expected}", ""


def _probe(serial: Any, target: str, robot: RobotConfig, probe: Probe) -> None:
    try:
        try:
            conn = open_port(serial, target, robot.baudrate, timeout=POLL,
                             write_timeout=robot.handshake.timeout if robot.handshake else OPEN_ALLOWANCE)
        except (serial.SerialException, OSError, ValueError) as exc:
            probe.reason = classify_open_error(exc, target)[1]
            return
        try:
            if robot.handshake is not None:
                probe.reason, reply = handshake_reason(conn, robot.handshake, target)
                probe.reply = reply if not probe.reason else None
        finally:
            conn.close()
        probe.healthy = not probe.reason
    except Exception as exc:  # a failing robot is reported as unhealthy, never as a failing backend
        probe.reason = f"{target}: talking to the robot failed: {type(exc).__name__}: {exc}"
    finally:
        probe.done.set()


def _bound(robot: RobotConfig) -> float:
    return OPEN_ALLOWANCE + (robot.handshake.timeout if robot.handshake else 0.0)


def detect_robots(configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
    """One :class:`hwplace.Device` per config entry, healthy or with the reason it is not."""
    try:
        serial = import_pyserial()
    except ImportError:
        if not configs:
            return hwplace.NoDevices(PYSERIAL_MISSING)
        serial = None
    if not configs:
        return hwplace.NoDevices("no serial robots are declared for this node (hardware.configs)")
    robots: list[RobotConfig | None] = []
    probes: list[Probe] = []
    for config in configs:
        probe = Probe()
        probes.append(probe)
        try:
            robot: RobotConfig | None = parse_config(config)
        except ValueError as exc:
            robot, probe.reason = None, f"invalid config: {exc}"
        robots.append(robot)
        if robot is not None:
            probe.properties.update(name=robot.name, port=robot.port or robot.url, baudrate=robot.baudrate)
            if robot.usb is not None:
                probe.properties["usb"] = robot.usb.as_dict()
            if serial is None:
                probe.reason = PYSERIAL_MISSING
    if serial is not None:
        _probe_all(serial, robots, probes)
    return [_device(i, p) for i, p in enumerate(probes)]


def _device(index: int, probe: Probe) -> hwplace.Device:
    if probe.healthy and not probe.reason:
        reply = {"reply": probe.reply} if probe.reply is not None else {}
        return hwplace.Device(index, MODEL, properties={**probe.properties, **reply})
    return hwplace.Device(index, MODEL, healthy=False, reason=probe.reason or "the probe gave no answer",
                          properties=probe.properties)


def _probe_all(serial: Any, robots: list[RobotConfig | None], probes: list[Probe]) -> None:
    ports: list[Any] | None = None
    if any(r is not None and r.usb is not None for r in robots):
        try:
            ports = list_ports(serial)
        except Exception as exc:
            for robot, probe in zip(robots, probes, strict=True):
                if robot is not None and robot.usb is not None:
                    probe.reason = f"listing the serial ports failed: {type(exc).__name__}: {exc}"
    started: list[tuple[int, float]] = []
    claimed: dict[str, int] = {}
    for index, (robot, probe) in enumerate(zip(robots, probes, strict=True)):
        if robot is None or probe.reason:
            continue
        target = robot.port or robot.url
        if robot.usb is not None and ports is not None:
            found, probe.reason = resolve_usb(robot.usb, ports)
            if found is None:
                continue
            target = probe.properties["port"] = str(found.device)
            probe.properties["usb"].update(serial_number=found.serial_number, description=str(found.description))
        assert target is not None
        if not target.lower().startswith("loop://"):
            if target in claimed:
                probe.reason = f"duplicate: {target} is also declared by config entry {claimed[target]}"
                continue
            claimed[target] = index
        thread = threading.Thread(target=_probe, args=(serial, target, robot, probe), daemon=True,
                                  name=f"hwplace serial-robot probe {target}")
        thread.start()
        started.append((index, _bound(robot)))
    begun = time.monotonic()
    budget = _budget()
    for index, bound in started:
        wait = min(bound, budget)
        if not probes[index].done.wait(max(0.0, begun + wait - time.monotonic())):
            target = probes[index].properties["port"]  # the late thread keeps the old record; this one is final
            why = "" if wait == bound else f" (what HWPLACE_DETECT_TIMEOUT leaves for it; its own bound is {bound:g} s)"
            probes[index] = Probe(reason=f"timed out: opening {target} and running the handshake took over "
                                         f"{wait:g} s{why}", properties=dict(probes[index].properties))


def _budget() -> float:
    """How long probes may run: most of hwplace's bound on one detect call, so that the call itself never overruns."""
    try:
        bound = hwplace.executor.detect_timeout()
    except hwplace.HwplaceError:  # a bad HWPLACE_DETECT_TIMEOUT; hwplace reports it where it uses it
        bound = 10.0
    return max(0.5, bound * 0.8)
