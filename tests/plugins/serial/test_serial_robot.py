"""The serial-robot backend, on real pyserial: loop:// URLs, and real pseudo-terminal pairs made by socat.

Each pty pair is ``robot`` (what hwplace opens, as if it were /dev/ttyUSB0) and ``far`` (the robot's end),
where a responder thread plays the robot: it answers ``PING`` with ``PONG v1``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import hwplace
import hwplace_plugins.serial as serial_robot
import hwplace_plugins.serial.detect as serial_detect
from hwplace.plugin.manager import PluginManager
from hwplace.testing import fake_cluster, registered_plugin
from hwplace_plugins.serial import (
    RobotBusy,
    RobotDisconnected,
    RobotNotPlaced,
    RobotUnavailable,
    SerialRobot,
    SerialRobotError,
    open_robot,
)
from hwplace_plugins.serial import config as serial_config

NO_PYSERIAL = "pyserial is not installed: pip install 'hwplace[serial]' (tox: extras = serial)"
serial = pytest.importorskip("serial", reason=NO_PYSERIAL)
list_ports = pytest.importorskip("serial.tools.list_ports", reason=NO_PYSERIAL)
ListPortInfo = pytest.importorskip("serial.tools.list_ports_common", reason=NO_PYSERIAL).ListPortInfo

BACKEND = SerialRobot()
# \n as the two characters a YAML user writes; a robot that answers is done at once, so a loaded
# machine gets a generous bound
PING = {"send": "PING\\n", "expect": "PONG", "timeout": 5.0}
SLACK = 1.0  # seconds a bounded wait may overrun its bound on a loaded machine


# -- a robot on the far end of a real pty pair -------------------------------------------------------


@dataclass
class PtyPair:
    robot: str  # the port hwplace opens
    far: str  # the robot's end
    socat: subprocess.Popen[bytes]
    replies: dict[bytes, bytes] = field(default_factory=lambda: {b"PING\n": b"PONG v1\n", b"WHO\n": b"ERR what?\n"})
    heard: list[bytes] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    listening: threading.Event = field(default_factory=threading.Event)

    def respond(self) -> None:
        """Play the robot: answer each line found in ``replies``; stop when told or when the pty goes away.

        ``listening`` is set once the far end is open: pyserial empties a port's input when it opens it, so a
        line sent before then would be lost."""
        try:
            far = serial.Serial(self.far, 115200, timeout=0.02)
        except serial.SerialException:
            return
        finally:
            self.listening.set()
        buffer = b""
        with far:
            while not self.stop.is_set():
                try:
                    buffer += far.read(64)
                except serial.SerialException:
                    return
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self.heard.append(line + b"\n")
                    if line + b"\n" in self.replies:
                        far.write(self.replies[line + b"\n"])

    def unplug(self) -> None:
        self.socat.send_signal(signal.SIGTERM)
        self.socat.wait(5)


@pytest.fixture
def pty(tmp_path: Path) -> Iterator[PtyPair]:
    socat = shutil.which("socat")
    if socat is None:
        pytest.skip("socat is not installed (apt-get install socat): the serial tests drive real pseudo-terminals")
    robot, far, log = tmp_path / "robot", tmp_path / "far", tmp_path / "socat.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen([socat, "-d", "-d", f"pty,raw,echo=0,link={robot}", f"pty,raw,echo=0,link={far}"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 5
        while not (robot.exists() and far.exists()):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"socat did not make the pty pair within 5 s: {log.read_text(errors='replace')}")
            time.sleep(0.01)
        pair = PtyPair(str(robot), str(far), process)
        responder = threading.Thread(target=pair.respond, daemon=True)
        responder.start()
        if not pair.listening.wait(30):
            pytest.fail(f"the responder did not open {far} within 30 s")
        yield pair
        pair.stop.set()
        responder.join(5)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def robot_config(port: str, **extra: Any) -> dict[str, Any]:
    return {"node_rank": 0, "port": port, "baudrate": 115200, **extra}


def python(code: str, env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **(env or {})},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


# -- detection on real ptys --------------------------------------------------------------------------


def test_a_robot_that_answers_the_handshake_is_healthy(pty: PtyPair) -> None:
    [robot] = BACKEND.detect([robot_config(pty.robot, name="arm", handshake=PING)])
    assert robot.healthy, robot.reason
    assert dict(robot.properties) == {"name": "arm", "port": pty.robot, "baudrate": 115200, "reply": "PONG v1"}
    assert robot.model == "serial robot"
    assert pty.heard == [b"PING\n"]


def test_detection_through_the_plugin_manager_answers_each_config(pty: PtyPair) -> None:
    configs = [robot_config(pty.robot, handshake=PING), robot_config(pty.robot + "-unplugged")]
    detection = PluginManager().detect("serial-robot", configs, timeout=10)
    assert detection.error is None
    assert [(d.index, d.healthy, d.properties["name"]) for d in detection.devices] == [
        (0, True, pty.robot), (1, False, pty.robot + "-unplugged")]
    assert detection.devices[1].reason == f"no such port: {pty.robot}-unplugged does not exist"


def test_a_wrong_reply_is_shown(pty: PtyPair) -> None:
    [robot] = BACKEND.detect([robot_config(pty.robot, handshake={"send": "WHO\\n", "expect": "PONG"})])
    assert not robot.healthy
    assert robot.reason == (f"wrong reply: {pty.robot} answered b'ERR what?\\n' after sending b'WHO\\n'; "
                            "expected a reply starting with b'PONG'")


def test_a_silent_robot_is_reported_within_the_handshake_timeout(pty: PtyPair) -> None:
    [robot] = BACKEND.detect([robot_config(pty.robot, handshake={"send": "HELLO\r\n", "expect": "PONG",
                                                                 "timeout": 0.3})])
    assert not robot.healthy
    assert robot.reason == (f"no reply: {pty.robot} sent nothing within 0.3 s after sending b'HELLO\\r\\n'; "
                            "expected a reply starting with b'PONG'")


def test_robots_are_probed_side_by_side(tmp_path: Path, pty: PtyPair, monkeypatch: pytest.MonkeyPatch) -> None:
    silent = {"send": "HELLO\\n", "expect": "PONG", "timeout": 0.5}
    configs = [robot_config(pty.robot, handshake=silent), {"url": "loop://", "baudrate": 9600, "handshake": silent}]
    probe, guard, active, most = serial_detect._probe, threading.Lock(), [0], [0]

    def counted(*args: Any) -> None:
        with guard:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            probe(*args)
        finally:
            with guard:
                active[0] -= 1

    monkeypatch.setattr(serial_detect, "_probe", counted)
    robots = BACKEND.detect(configs)
    assert most[0] == 2  # both handshakes were under way at once, not one after the other
    assert [r.reason.split(":")[0] for r in robots] == ["no reply", "wrong reply"]  # loop:// echoes HELLO


def test_detection_stays_within_hwplaces_bound_on_one_detect(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handshake timeout longer than HWPLACE_DETECT_TIMEOUT allows makes that robot time out, not the backend."""
    monkeypatch.setenv("HWPLACE_DETECT_TIMEOUT", "1")
    configs = [{"url": "loop://", "baudrate": 9600, "handshake": {"expect": "READY", "timeout": 5}}]
    detection = PluginManager().detect("serial-robot", configs)
    assert detection.error is None
    [robot] = detection.devices
    assert robot.reason == ("timed out: opening loop:// and running the handshake took over 0.8 s (what "
                            "HWPLACE_DETECT_TIMEOUT leaves for it; its own bound is 8 s)")


def test_a_missing_port(tmp_path: Path) -> None:
    [robot] = BACKEND.detect([robot_config(str(tmp_path / "ttyUSB9"))])
    assert (robot.healthy, robot.reason) == (False, f"no such port: {tmp_path / 'ttyUSB9'} does not exist")
    assert robot.properties["port"] == str(tmp_path / "ttyUSB9")


def test_something_that_is_not_a_serial_port(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a tty")
    robots = BACKEND.detect([robot_config(str(tmp_path / "notes.txt")), robot_config(str(tmp_path))])
    assert robots[0].reason.startswith(f"not a serial port: {tmp_path / 'notes.txt'} (Could not configure port")
    assert robots[1].reason == f"not a serial port: {tmp_path} is a directory"


def test_a_port_another_process_holds_is_busy(pty: PtyPair) -> None:
    holder = python(f"""
        import serial, sys
        port = serial.Serial({pty.robot!r}, exclusive=True)
        print("holding", flush=True)
        sys.stdin.read()
    """)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "holding\n"
        [robot] = BACKEND.detect([robot_config(pty.robot, handshake=PING)])
        assert (robot.healthy, robot.reason) == (False, f"busy: {pty.robot} is in use by another process")
    finally:
        holder.communicate("", timeout=10)
    assert BACKEND.detect([robot_config(pty.robot, handshake=PING)])[0].healthy  # free again once it exits


def test_permission_denied(pty: PtyPair) -> None:
    """A pty nobody may open: chmod 000; as root, detection runs without the capabilities that bypass it."""
    os.chmod(os.path.realpath(pty.robot), 0)
    code = f"""
        import json
        from hwplace_plugins.serial import SerialRobot
        [robot] = SerialRobot().detect([{{"port": {pty.robot!r}, "baudrate": 115200}}])
        print(json.dumps([robot.healthy, robot.reason]))
    """
    if os.geteuid() != 0:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=30)
    else:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: nothing here can be denied a file")
        out = subprocess.run([setpriv, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all",
                              sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    healthy, reason = json.loads(out.stdout)
    assert not healthy
    assert reason.startswith(f"permission denied: cannot open {pty.robot}")


def test_two_configs_for_one_port(pty: PtyPair) -> None:
    robots = BACKEND.detect([robot_config(pty.robot, handshake=PING), robot_config(pty.robot, name="again")])
    assert robots[0].healthy
    assert robots[1].reason == f"duplicate: {pty.robot} is also declared by config entry 0"


# -- loop:// and other pyserial URLs -----------------------------------------------------------------


def test_loop_url_echoes_the_handshake() -> None:
    robots = BACKEND.detect([
        {"url": "loop://", "baudrate": 9600, "handshake": {"send": "HI\\x21\\n", "expect": "HI!"}},
        {"url": "loop://", "baudrate": 9600, "handshake": {"send": "HI\n", "expect": "HO", "timeout": 0.2}},
        {"url": "loop://", "baudrate": 9600, "handshake": {"expect": "READY", "timeout": 0.2}},
        {"url": "loop://", "baudrate": 9600, "name": "plain"},
    ])
    assert [(r.healthy, r.properties.get("reply")) for r in robots] == [
        (True, "HI!"), (False, None), (False, None), (True, None)]
    assert robots[1].reason == ("wrong reply: loop:// answered b'HI\\n' after sending b'HI\\n'; expected a reply "
                                "starting with b'HO'")
    assert robots[2].reason == ("no reply: loop:// sent nothing within 0.2 s of opening it (no handshake.send); "
                                "expected a reply starting with b'READY'")
    assert robots[3].properties["name"] == "plain"


def test_a_refused_socket_url_names_the_url() -> None:
    with __import__("socket").socket() as listener:
        listener.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused
        port = listener.getsockname()[1]
        [robot] = BACKEND.detect([{"url": f"socket://127.0.0.1:{port}", "baudrate": 9600}])
    assert not robot.healthy
    assert robot.reason.startswith(f"cannot open socket://127.0.0.1:{port}: ")
    assert "refused" in robot.reason


def test_an_invalid_entry_given_to_detect_directly_is_an_unhealthy_robot() -> None:
    robots = BACKEND.detect([{"url": "loop://", "baudrate": 9600}, {"port": "ttyUSB0", "baudrate": 9600}])
    assert robots[0].healthy
    assert robots[1].reason.startswith("invalid config: port: must be an absolute path")


def test_without_pyserial_each_robot_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "serial", None)  # import serial now raises ImportError
    robots = BACKEND.detect([{"url": "loop://", "baudrate": 9600}, {"url": "loop://", "baudrate": 9600}])
    assert [(r.healthy, r.reason) for r in robots] == [
        (False, "pyserial is not installed: pip install 'hwplace[serial]'")] * 2
    absent = BACKEND.detect([])
    assert (absent, absent.reason) == ([], "pyserial is not installed: pip install 'hwplace[serial]'")  # type: ignore[attr-defined]
    with pytest.raises(RobotUnavailable, match=r"serial robot 'loop' \(loop://\): pyserial is not installed"):
        open_robot(environ={"HWPLACE_SERIAL_ROBOTS": '[{"name": "loop", "port": "loop://", "baudrate": 9600}]'})


def test_no_configs_means_no_devices_with_a_reason() -> None:
    absent = BACKEND.detect([])
    assert isinstance(absent, hwplace.NoDevices)
    assert "no serial robots are declared" in absent.reason


# -- USB identities ----------------------------------------------------------------------------------


def usb_port(device: str, vid: int, pid: int, serial_number: str | None = None) -> Any:
    info = ListPortInfo(device, skip_link_detection=True)
    info.vid, info.pid, info.serial_number = vid, pid, serial_number
    info.product = "Robot arm"
    info.apply_usb_info()
    return info


def test_usb_matching_on_list_ports_records() -> None:
    ports = [usb_port("/dev/ttyACM1", 0x2341, 0x43, "B"), usb_port("/dev/ttyACM0", 0x2341, 0x43, "A"),
             usb_port("/dev/ttyUSB0", 0x0403, 0x6001), ListPortInfo("/dev/ttyS0", skip_link_detection=True)]
    identity = serial_robot.UsbIdentity(0x2341, 0x43)
    assert [p.device for p in serial_robot.match_usb(identity, ports)] == ["/dev/ttyACM0", "/dev/ttyACM1"]
    assert [p.device for p in serial_robot.match_usb(serial_robot.UsbIdentity(0x2341, 0x43, "B"), ports)] == [
        "/dev/ttyACM1"]
    assert serial_robot.match_usb(serial_robot.UsbIdentity(0x2341, 0x44), ports) == []


def test_usb_identities_resolve_through_list_ports(monkeypatch: pytest.MonkeyPatch, pty: PtyPair) -> None:
    ports = [usb_port(pty.robot, 0x2341, 0x43, "A"), usb_port("/dev/ttyACM7", 0x2341, 0x43, "B"),
             usb_port("/dev/ttyUSB3", 0x0403, 0x6001)]
    monkeypatch.setattr(list_ports, "comports", lambda *a, **k: ports)
    robots = BACKEND.detect([
        {"usb": {"vid": "0x2341", "pid": "0043", "serial_number": "A"}, "baudrate": 115200, "handshake": PING},
        {"usb": {"vid": 0x2341, "pid": 0x43}, "baudrate": 115200},
        {"usb": {"vid": "2341", "pid": "ffff"}, "baudrate": 115200},
    ])
    assert robots[0].healthy, robots[0].reason
    assert dict(robots[0].properties) == {
        "name": "usb-2341:0043-A", "port": pty.robot, "baudrate": 115200, "reply": "PONG v1",
        "usb": {"vid": 0x2341, "pid": 0x43, "serial_number": "A", "description": "Robot arm"}}
    assert robots[1].reason == (
        f"ambiguous: 2 USB serial ports match vid 0x2341 pid 0x0043: /dev/ttyACM7 (vid 0x2341 pid 0x0043 "
        f"serial_number 'B'), {pty.robot} (vid 0x2341 pid 0x0043 serial_number 'A'); add usb.serial_number to "
        "pick one")
    assert robots[2].reason.startswith("no such port: no USB serial port matches vid 0x2341 pid 0xffff; attached: ")
    # a worker given the unresolved identity finds the port the same way when it opens the robot
    env = BACKEND.isolation_env([hwplace.Device(0, "planned serial-robot", properties={
        "usb": {"vid": "0x2341", "pid": "0x0043", "serial_number": "A"}, "baudrate": 115200})])
    with open_robot(environ=env, timeout=5) as robot:
        assert robot.port == pty.robot
        robot.write(b"PING\n")
        assert robot.readline() == b"PONG v1\n"


def test_an_absent_usb_robot_on_this_machine() -> None:
    """Real serial.tools.list_ports on this machine, which has no adapter with this made-up identity."""
    [robot] = BACKEND.detect([{"usb": {"vid": "0xfffe", "pid": "0x0bad"}, "baudrate": 9600}])
    assert not robot.healthy
    assert robot.reason.startswith("no such port: no USB serial port matches vid 0xfffe pid 0x0bad; ")
    assert robot.properties["usb"] == {"vid": 0xFFFE, "pid": 0x0BAD}


# -- check_config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        {"node_rank": 0, "port": "/dev/ttyUSB0", "baudrate": 115200},
        {"port": "/dev/serial/by-id/usb-Arduino_Uno-if00", "baudrate": 9600, "name": "left arm"},
        {"url": "socket://robot-7.lab:7000", "baudrate": 115200},
        {"url": "rfc2217://[::1]:2217?timeout=3", "baudrate": 57600},
        {"url": "loop://?logging=debug", "baudrate": 1},
        {"usb": {"vid": 0x2341, "pid": "0x0043", "serial_number": "7543"}, "baudrate": 250000},
        {"port": "/dev/ttyACM0", "baudrate": 115200, "handshake": {"expect": "READY"}},
        {"port": "COM3", "baudrate": 115200, "handshake": {"send": "\\x02?\\r\\n", "expect": "OK", "timeout": 30}},
    ],
)
def test_good_configs_are_accepted(config: dict[str, Any]) -> None:
    BACKEND.check_config(config)
    assert serial_robot.parse_config(config).baudrate == config["baudrate"]


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"baudrate": 9600}, r"one of port, url or usb is required"),
        ({"port": "/dev/ttyUSB0", "url": "loop://", "baudrate": 9600}, r"port and url are both given"),
        ({"port": "/dev/ttyUSB0"}, r"baudrate: is required"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "baud_rate": 9600}, r"unknown key 'baud_rate'.*did you mean "
                                                                         r"'baudrate'\?"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshak": {}}, r"did you mean 'handshake'\?"),
        ({"port": "ttyUSB0", "baudrate": 9600}, r"port: must be an absolute path such as /dev/ttyUSB0"),
        ({"port": "loop://", "baudrate": 9600}, r"port: 'loop://' is a URL; write it as url: loop://"),
        ({"port": " /dev/ttyUSB0", "baudrate": 9600}, r"port: must be a non-empty string without surrounding"),
        ({"port": "/dev/tty\0USB0", "baudrate": 9600}, r"port: may not contain control characters"),
        ({"port": 12, "baudrate": 9600}, r"port: must be a string .*got 12"),
        ({"url": "spy:///dev/ttyUSB0", "baudrate": 9600}, r"url: 'spy:///dev/ttyUSB0' is not a supported pyserial "
                                                          r"URL; allowed: loop://, socket://HOST:PORT"),
        ({"url": "/dev/ttyUSB0", "baudrate": 9600}, r"a port path goes under port:"),
        ({"url": "socket://robot", "baudrate": 9600}, r"url: 'socket://robot' needs a host and a TCP port"),
        ({"url": "socket://robot:99999", "baudrate": 9600}, r"needs a host and a TCP port from 1 to 65535"),
        ({"url": "rfc2217://:7000", "baudrate": 9600}, r"needs a host"),
        ({"url": "loop://host", "baudrate": 9600}, r"url: loop:// takes no host"),
        ({"usb": "2341:0043", "baudrate": 9600}, r"usb: must be a mapping \{vid, pid, serial_number"),
        ({"usb": {"vid": "0x2341"}, "baudrate": 9600}, r"usb.pid: is required"),
        ({"usb": {"vid": "0x2341", "pid": 1, "serial": "A"}, "baudrate": 9600}, r"usb: unknown key 'serial'.*"
                                                                                r"did you mean 'serial_number'"),
        ({"usb": {"vid": "0x12345", "pid": 1}, "baudrate": 9600}, r"usb.vid: must be a USB vendor id from 0 to "
                                                                  r"0xffff.*got '0x12345'"),
        ({"usb": {"vid": 1, "pid": -1}, "baudrate": 9600}, r"usb.pid: must be a USB product id"),
        ({"usb": {"vid": True, "pid": 1}, "baudrate": 9600}, r"usb.vid: must be .*got True"),
        ({"usb": {"vid": 1, "pid": 1, "serial_number": 7}, "baudrate": 9600}, r"usb.serial_number: must be a "
                                                                               r"string"),
        ({"port": "/dev/ttyUSB0", "baudrate": 0}, r"baudrate: must be an integer from 1 to 12000000"),
        ({"port": "/dev/ttyUSB0", "baudrate": "115200"}, r"got '115200' \(write it without quotes\)"),
        ({"port": "/dev/ttyUSB0", "baudrate": 115200.0}, r"baudrate: must be an integer.*got 115200.0"),
        ({"port": "/dev/ttyUSB0", "baudrate": True}, r"baudrate: must be an integer.*got True"),
        ({"port": "/dev/ttyUSB0", "baudrate": 10**30}, r"baudrate: must be an integer from 1 to 12000000"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "name": ""}, r"name: must be a non-empty string"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "name": "x" * 10_000}, r"name: is 10000 characters long; "
                                                                            r"at most 64"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "name": ["a"]}, r"name: must be a string .*got a list"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": "PING"}, r"handshake: must be a mapping"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"send": "PING"}}, r"handshake.expect: is "
                                                                                    r"required"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": ""}}, r"handshake.expect: must not be "
                                                                                  r"empty"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": "OK", "send": 1}}, r"handshake.send: "
                                                                                               r"must be a string"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": "OK", "send": "A\\q"}},
         r"handshake.send: unknown escape '\\\\q' at character 1; allowed escapes: \\n \\r \\t \\0 \\\\ \\xHH"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": "OK\\x4"}}, r"handshake.expect: unknown "
                                                                                        r"escape '\\\\x4'"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": "OK", "send": "\ud800"}},
         r"handshake.send: character 0 .* cannot be encoded as UTF-8"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": "x" * 300}}, r"handshake.expect: is 300 "
                                                                                         r"bytes long; at most 256"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": "OK", "timeout": 0}},
         r"handshake.timeout: must be a number of seconds above 0 and at most 30, got 0"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": "OK", "timeout": 31}}, r"got 31"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": "OK", "timeout": float("nan")}},
         r"got nan"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": "OK", "timeout": "1"}}, r"got '1'"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, "handshake": {"expect": "OK", "tiemout": 1}},
         r"handshake: unknown key 'tiemout'.*did you mean 'timeout'"),
        ({"port": "/dev/ttyUSB0", "baudrate": 9600, 3: 1}, r"unknown key 3"),
    ],
)
def test_bad_configs_are_refused_naming_the_key(config: dict[Any, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        BACKEND.check_config(config)


@pytest.mark.parametrize(("pattern", "text"), [("_WINDOWS_PORT", "COM3"), ("_HEX_ID", "0x2341")])
def test_the_patterns_end_at_the_end_of_the_text(pattern: str, text: str) -> None:
    # a port with a line break and a stripped id cannot reach them: only the patterns can show it
    compiled = getattr(serial_config, pattern)
    assert compiled.match(text) is not None
    assert compiled.match(text + "\n") is None  # "$" matched before a final newline


def test_a_bad_config_in_a_cluster_names_its_key_path() -> None:
    section = {"num_nodes": 1, "node_groups": [{"label": "arms", "node_ranks": 0, "hardware": {
        "type": "serial-robot", "configs": [{"node_rank": 0, "port": "/dev/ttyUSB0", "baudrate": 9600,
                                             "handshake": {"expect": "OK", "timeout": -1}}]}}]}
    with pytest.raises(hwplace.ConfigError, match=r"cluster.node_groups\[0\].hardware.configs\[0\]: "
                                                  r"handshake.timeout: must be a number of seconds above 0"):
        hwplace.parse_cluster_config(section)


# -- isolation and the worker side -------------------------------------------------------------------


def test_isolation_env_is_json_in_index_order() -> None:
    devices = [
        hwplace.Device(2, "serial robot", properties={"name": "a,b", "port": "/dev/serial/by-path/pci-0:1,2",
                                                      "baudrate": 9600}),
        hwplace.Device(5, "planned serial-robot", properties={"url": "socket://h:7000", "baudrate": 115200}),
        hwplace.Device(6, "planned serial-robot", properties={"usb": {"vid": "0x2341", "pid": 67}, "baudrate": 1}),
        hwplace.Device(7, "planned serial-robot"),
    ]
    env = BACKEND.isolation_env(devices)
    assert list(env) == ["HWPLACE_SERIAL_ROBOTS"]
    assert json.loads(env["HWPLACE_SERIAL_ROBOTS"]) == [
        {"name": "a,b", "port": "/dev/serial/by-path/pci-0:1,2", "baudrate": 9600},
        {"name": "socket://h:7000", "port": "socket://h:7000", "baudrate": 115200},
        {"name": "usb-2341:0043", "usb": {"vid": 0x2341, "pid": 67}, "baudrate": 1},
        {"name": "serial-robot-7", "baudrate": None},
    ]
    assert BACKEND.isolation_env(devices[1:2]) != BACKEND.isolation_env(devices[2:3])
    with pytest.raises(RobotNotPlaced, match=r"HWPLACE_SERIAL_ROBOTS\[3\] has neither a port nor a USB identity|"
                                             r"HWPLACE_SERIAL_ROBOTS\[3\] is not a robot record"):
        serial_robot.placed_robots(env)
    assert serial_robot.placed_robots(BACKEND.isolation_env(devices[:3]))[2].usb == serial_robot.UsbIdentity(
        0x2341, 67)


def test_planning_offline_gives_each_worker_its_robots() -> None:
    section = {
        "num_nodes": 2,
        "node_groups": [{"label": "arms", "node_ranks": 1, "hardware": {"type": "serial-robot", "configs": [
            {"node_rank": 1, "name": "left", "port": "/dev/ttyUSB0", "baudrate": 115200, "handshake": PING},
            {"node_rank": 1, "name": "right", "usb": {"vid": "0x2341", "pid": "0x0043"}, "baudrate": 57600},
        ]}}],
        "component_placement": {"env": {"node_group": "arms", "placement": "0-1"},
                                 "pair": {"node_group": "arms", "placement": "0-1:0"}},
    }
    with registered_plugin(serial_robot):
        cluster = fake_cluster(section, accelerators_per_node=2)
        placement = hwplace.ComponentPlacement({"cluster": section}, cluster)
        env, pair = placement.get_placements("env"), placement.get_placements("pair")
    assert [(p.node_rank, p.hardware_type, p.local_hardware_ranks) for p in env] == [
        (1, "serial-robot", (0,)), (1, "serial-robot", (1,))]
    assert [json.loads(p.env["HWPLACE_SERIAL_ROBOTS"]) for p in env] == [
        [{"name": "left", "port": "/dev/ttyUSB0", "baudrate": 115200}],
        [{"name": "right", "usb": {"vid": 0x2341, "pid": 0x43}, "baudrate": 57600}]]
    assert [r.name for r in serial_robot.placed_robots(pair[0].env)] == ["left", "right"]


def test_a_process_without_robots_is_told_so() -> None:
    with pytest.raises(RobotNotPlaced, match=r"this process has no serial robots placed: HWPLACE_SERIAL_ROBOTS "
                                             r"is not set \(open_robot works in a worker"):
        open_robot(environ={})


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", r" is not JSON"),
        ("/dev/ttyUSB0", r" is not JSON .*'/dev/ttyUSB0'"),
        ("[]", r" is not a non-empty JSON list of robots"),
        ('{"port": "/dev/ttyUSB0"}', r" is not a non-empty JSON list of robots"),
        ("[1]", r"\[0\] is not a JSON object"),
        ('[{"port": "/dev/ttyUSB0", "baudrate": 9600}]', r"\[0\] has no name"),
        ('[{"name": "a", "port": "/dev/ttyUSB0", "baudrate": "fast"}]', r"\[0\] is not a robot record \(baudrate"),
        ('[{"name": "a", "port": 7, "baudrate": 9600}]', r"\[0\] has a port that is not a path or URL"),
        ("[" * 100_000, r" is not JSON"),
        ("[" * 2_000_000, r" is 2000000 characters long"),
    ],
)
def test_a_garbled_robot_list_is_a_clear_error(value: str, problem: str) -> None:
    placed = "this process has no serial robots placed: HWPLACE_SERIAL_ROBOTS"
    with pytest.raises(RobotNotPlaced, match=rf"{placed}{problem}"):
        open_robot(environ={"HWPLACE_SERIAL_ROBOTS": value})


def test_robots_are_opened_by_position_or_name() -> None:
    env = {"HWPLACE_SERIAL_ROBOTS": json.dumps([{"name": "left", "port": "loop://", "baudrate": 9600},
                                                {"name": "right", "port": "loop://", "baudrate": 9600}])}
    with open_robot("right", environ=env, timeout=0.5) as right, open_robot(0, environ=env, timeout=0.5) as left:
        assert (left.robot_name, right.robot_name) == ("left", "right")
        right.write(b"hello\n")
        assert right.readline() == b"hello\n"
        assert isinstance(right, serial.SerialBase)
    with pytest.raises(RobotNotPlaced, match=r"no serial robot named 'rihgt'; it has 0: 'left', 1: 'right'; did you "
                                             r"mean 'right'\?"):
        open_robot("rihgt", environ=env)
    with pytest.raises(RobotNotPlaced, match=r"has 2 serial robot\(s\) \(0: 'left', 1: 'right'\); there is no "
                                             r"position 2"):
        open_robot(2, environ=env)
    with pytest.raises(TypeError, match=r"takes a position \(int\) or a robot name \(str\), got True"):
        open_robot(True, environ=env)
    with pytest.raises(SerialRobotError, match=r"serial robot 'left' on loop://: read on a closed port"):
        left.read(1)


def test_open_robot_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch, pty: PtyPair) -> None:
    env = BACKEND.isolation_env(BACKEND.detect([robot_config(pty.robot, name="arm", handshake=PING)]))
    monkeypatch.setenv("HWPLACE_SERIAL_ROBOTS", env["HWPLACE_SERIAL_ROBOTS"])
    with open_robot(timeout=2) as robot:
        robot.write(b"PING\n")
        assert robot.read_until(b"\n") == b"PONG v1\n"
    assert not robot.is_open


def test_a_second_process_cannot_open_a_robot_a_worker_holds(pty: PtyPair) -> None:
    env = BACKEND.isolation_env(BACKEND.detect([robot_config(pty.robot, name="arm")]))
    worker = python("""
        import sys
        from hwplace_plugins.serial import open_robot
        robot = open_robot("arm")
        print("open", flush=True)
        sys.stdin.read()
    """, env)
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline() == "open\n"
        with pytest.raises(RobotBusy, match=rf"serial robot 'arm': {pty.robot} is in use by another process") as info:
            open_robot("arm", environ=env)
        assert info.value.port == pty.robot
    finally:
        worker.communicate("", timeout=10)
    with open_robot("arm", environ=env) as robot:  # the worker is gone, and so is its lock
        assert robot.is_open


def test_a_second_open_in_another_process_fails_clearly(pty: PtyPair) -> None:
    env = BACKEND.isolation_env(BACKEND.detect([robot_config(pty.robot, name="arm")]))
    with open_robot(environ=env):
        out = python("from hwplace_plugins.serial import open_robot; open_robot()", env).communicate(timeout=30)
    assert f"RobotBusy: serial robot 'arm': {pty.robot} is in use by another process" in out[1]


def test_opening_a_missing_robot_names_its_port(tmp_path: Path) -> None:
    env = {"HWPLACE_SERIAL_ROBOTS": json.dumps([{"name": "arm", "port": str(tmp_path / "gone"), "baudrate": 9600}])}
    with pytest.raises(RobotUnavailable, match=rf"serial robot 'arm': no such port: {tmp_path / 'gone'} does not "
                                               "exist") as info:
        open_robot(environ=env)
    assert info.value.port == str(tmp_path / "gone")


def test_a_robot_unplugged_mid_run_is_a_clear_error(pty: PtyPair) -> None:
    env = BACKEND.isolation_env(BACKEND.detect([robot_config(pty.robot, name="arm")]))
    with open_robot(environ=env, timeout=10) as robot:
        threading.Timer(0.2, pty.unplug).start()
        with pytest.raises(RobotDisconnected, match=rf"serial robot 'arm' on {pty.robot}: read failed, the robot is "
                                                    r"gone \(unplugged, or its port went away\)"):
            robot.read(100)  # blocks until the robot is unplugged, then fails at once
        with pytest.raises(RobotDisconnected, match=rf"'arm' on {pty.robot}: write failed"):
            robot.write(b"PING\n")
        with pytest.raises(RobotDisconnected, match=rf"'arm' on {pty.robot}: in_waiting failed"):
            robot.in_waiting  # noqa: B018
        with pytest.raises(RobotDisconnected, match=rf"'arm' on {pty.robot}: reset_input_buffer failed"):
            robot.reset_input_buffer()


def test_a_robot_unplugged_while_a_worker_process_reads(pty: PtyPair) -> None:
    env = BACKEND.isolation_env(BACKEND.detect([robot_config(pty.robot, name="arm")]))
    worker = python("""
        from hwplace_plugins.serial import open_robot
        robot = open_robot(timeout=30)
        print("reading", flush=True)
        robot.read(100)
    """, env)
    assert worker.stdout is not None
    assert worker.stdout.readline() == "reading\n"
    pty.unplug()
    _, stderr = worker.communicate(timeout=10)
    assert worker.returncode == 1
    assert f"RobotDisconnected: serial robot 'arm' on {pty.robot}: read failed, the robot is gone" in stderr
