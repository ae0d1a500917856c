"""What a ``serial-robot`` entry of ``hardware.configs`` may say, checked without pyserial.

Each problem is a ``ValueError`` whose message starts with the key concerned (``handshake.timeout: ...``);
hwplace prefixes it with the entry's key path.
"""

from __future__ import annotations

import difflib
import math
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

KEYS = ("node_rank", "name", "port", "url", "usb", "baudrate", "handshake")
WHERE_KEYS = ("port", "url", "usb")
USB_KEYS = ("vid", "pid", "serial_number")
HANDSHAKE_KEYS = ("send", "expect", "timeout")
URL_SCHEMES = ("loop", "socket", "rfc2217")
MAX_BAUDRATE = 12_000_000  # the fastest USB-serial adapters; anything above is a typo
MAX_NAME = 64
MAX_PORT = 4096  # PATH_MAX
MAX_MESSAGE = 256  # bytes of a handshake's send or expect, after escapes
MAX_SERIAL_NUMBER = 128
DEFAULT_HANDSHAKE_TIMEOUT = 1.0
MAX_HANDSHAKE_TIMEOUT = 30.0
ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "0": b"\0", "\\": b"\\"}
ESCAPES_ALLOWED = r"allowed escapes: \n \r \t \0 \\ \xHH"
_WINDOWS_PORT = re.compile(r"^COM[1-9][0-9]{0,2}\Z")
_HEX_ID = re.compile(r"^(0[xX])?[0-9a-fA-F]{1,4}\Z")


@dataclass(frozen=True)
class UsbIdentity:
    """A USB serial adapter, as ``serial.tools.list_ports`` reports it."""

    vid: int
    pid: int
    serial_number: str | None = None

    def __str__(self) -> str:
        text = f"vid 0x{self.vid:04x} pid 0x{self.pid:04x}"
        return f"{text} serial_number {self.serial_number!r}" if self.serial_number is not None else text

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"vid": self.vid, "pid": self.pid}
        if self.serial_number is not None:
            found["serial_number"] = self.serial_number
        return found


@dataclass(frozen=True)
class Handshake:
    """Bytes to send once the port is open (may be empty), and the prefix the reply must start with."""

    send: bytes
    expect: bytes
    timeout: float


@dataclass(frozen=True)
class RobotConfig:
    """One checked config entry: exactly one of ``port``, ``url`` and ``usb`` is set."""

    name: str
    baudrate: int
    port: str | None = None
    url: str | None = None
    usb: UsbIdentity | None = None
    handshake: Handshake | None = None

    @property
    def where(self) -> str:
        """How the config names the robot's port, for messages: the path, the URL or the USB identity."""
        return self.port or self.url or f"USB {self.usb}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def show(value: Any, limit: int = 60) -> str:
    """A short repr for a message: bytes and strings cut at ``limit`` characters."""
    if isinstance(value, bytes | bytearray):
        text = repr(bytes(value[:limit]))
        return text + ("..." if len(value) > limit else "")
    if isinstance(value, str):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    text = repr(value) if isinstance(value, int | float | bool | type(None)) else f"a {type(value).__name__}"
    return text[:limit]


def _check_keys(config: Mapping[Any, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in config:
        if not isinstance(key, str) or key not in allowed:
            hint = did_you_mean(key, allowed) if isinstance(key, str) else ""
            raise ValueError(f"{where}unknown key {show(key)}; allowed: {', '.join(allowed)}{hint}")


def _text(value: Any, key: str, limit: int, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key}: must be a string ({what}), got {show(value)}")
    if not value or value != value.strip():
        raise ValueError(f"{key}: must be a non-empty string without surrounding whitespace ({what}), "
                         f"got {show(value)}")
    if len(value) > limit:
        raise ValueError(f"{key}: is {len(value)} characters long; at most {limit}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{key}: may not contain control characters (NUL, line breaks, ...), got {show(value)}")
    return value


def check_port(value: Any, key: str = "port") -> str:
    port = _text(value, key, MAX_PORT, "a serial port path such as /dev/ttyUSB0")
    if "://" in port:
        raise ValueError(f"{key}: {show(port)} is a URL; write it as url: {port}")
    if not (port.startswith("/") or _WINDOWS_PORT.match(port)):
        raise ValueError(f"{key}: must be an absolute path such as /dev/ttyUSB0 or /dev/serial/by-id/..., "
                         f"got {show(port)}")
    return port


def check_url(value: Any, key: str = "url") -> str:
    url = _text(value, key, MAX_PORT, "a pyserial URL such as socket://host:7000")
    allowed = "loop://, socket://HOST:PORT or rfc2217://HOST:PORT"
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in URL_SCHEMES:
        raise ValueError(f"{key}: {show(url)} is not a supported pyserial URL; allowed: {allowed}"
                         f"{' (a port path goes under port:)' if url.startswith('/') else ''}")
    parts = urllib.parse.urlsplit(url)
    if parts.fragment or (parts.path and parts.path != "/"):
        raise ValueError(f"{key}: {show(url)} has a path or fragment; allowed: {allowed}, with ?options")
    if scheme.lower() == "loop":
        if parts.netloc:
            raise ValueError(f"{key}: loop:// takes no host, got {show(url)}")
        return url
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or not 1 <= port <= 65535:
        raise ValueError(f"{key}: {show(url)} needs a host and a TCP port from 1 to 65535, "
                         f"as in {scheme.lower()}://robot-host:7000")
    return url


def _usb_id(value: Any, key: str, what: str) -> int:
    allowed = f"a USB {what} id from 0 to 0xffff: an integer, or a hex string such as '0x2341' or '2341'"
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value <= 0xFFFF:
            return value
    elif isinstance(value, str) and _HEX_ID.match(value.strip()):
        return int(value.strip(), 16)
    raise ValueError(f"{key}: must be {allowed}, got {show(value)}")


def check_usb(value: Any, key: str = "usb") -> UsbIdentity:
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}: must be a mapping {{vid, pid, serial_number (optional)}}, got {show(value)}")
    _check_keys(value, USB_KEYS, f"{key}: ")
    for required in ("vid", "pid"):
        if required not in value:
            raise ValueError(f"{key}.{required}: is required (the adapter's {required}, as lsusb or "
                             "python -m serial.tools.list_ports -v shows it)")
    serial_number = value.get("serial_number")
    if serial_number is not None:
        serial_number = _text(serial_number, f"{key}.serial_number", MAX_SERIAL_NUMBER,
                              "the adapter's serial number")
    return UsbIdentity(_usb_id(value["vid"], f"{key}.vid", "vendor"), _usb_id(value["pid"], f"{key}.pid", "product"),
                       serial_number)


def check_baudrate(value: Any, key: str = "baudrate") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BAUDRATE:
        hint = " (write it without quotes)" if isinstance(value, str) and value.strip().isdigit() else ""
        raise ValueError(f"{key}: must be an integer from 1 to {MAX_BAUDRATE} (a standard rate such as 9600 or "
                         f"115200, or any rate the adapter supports), got {show(value)}{hint}")
    return value


def decode_escapes(text: str, key: str) -> bytes:
    r"""``text`` as UTF-8 bytes, with ``\n``, ``\r``, ``\t``, ``\0``, ``\\`` and ``\xHH`` turned into their bytes."""
    out = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            try:
                out += char.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"{key}: character {i} ({char!r}) cannot be encoded as UTF-8") from None
            i += 1
            continue
        code = text[i + 1:i + 2]
        if code in ESCAPES:
            out += ESCAPES[code]
            i += 2
        elif code == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[i + 2:i + 4]):
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        else:
            raise ValueError(f"{key}: unknown escape {text[i:i + 4]!r} at character {i}; {ESCAPES_ALLOWED}")
    return bytes(out)


def check_handshake(value: Any, key: str = "handshake") -> Handshake:
    if not isinstance(value, Mapping):
        raise ValueError(f"{key}: must be a mapping {{send (optional), expect, timeout (optional)}}, "
                         f"got {show(value)}")
    _check_keys(value, HANDSHAKE_KEYS, f"{key}: ")
    messages: dict[str, bytes] = {}
    for part in ("send", "expect"):
        raw = value.get(part, "" if part == "send" else None)
        if raw is None:
            raise ValueError(f"{key}.expect: is required: the prefix the robot's reply must start with, "
                             r"e.g. expect: PONG (leave send out to wait for a banner)")
        if not isinstance(raw, str):
            raise ValueError(f"{key}.{part}: must be a string ({ESCAPES_ALLOWED}), got {show(raw)}")
        data = decode_escapes(raw, f"{key}.{part}")
        if len(data) > MAX_MESSAGE:
            raise ValueError(f"{key}.{part}: is {len(data)} bytes long; at most {MAX_MESSAGE}")
        messages[part] = data
    if not messages["expect"]:
        raise ValueError(f"{key}.expect: must not be empty: every reply starts with an empty prefix")
    timeout = value.get("timeout", DEFAULT_HANDSHAKE_TIMEOUT)
    if (isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout)
            or not 0 < timeout <= MAX_HANDSHAKE_TIMEOUT):
        raise ValueError(f"{key}.timeout: must be a number of seconds above 0 and at most "
                         f"{MAX_HANDSHAKE_TIMEOUT:g}, got {show(timeout)}")
    return Handshake(messages["send"], messages["expect"], float(timeout))


def default_name(port: str | None, url: str | None, usb: UsbIdentity | None) -> str:
    """A robot without ``name`` is known by how its config names it: the port path, the URL or the USB id."""
    if port or url:
        return str(port or url)
    if usb is not None:
        return f"usb-{usb.vid:04x}:{usb.pid:04x}" + (f"-{usb.serial_number}" if usb.serial_number else "")
    return "serial-robot"


def parse_config(config: Any) -> RobotConfig:
    """The checked form of one ``hardware.configs`` entry, or a ``ValueError`` naming the key."""
    if not isinstance(config, Mapping):
        raise ValueError(f"a serial-robot config entry must be a mapping, got {show(config)}")
    _check_keys(config, KEYS, "")
    given = [key for key in WHERE_KEYS if config.get(key) is not None]
    if not given:
        raise ValueError("one of port, url or usb is required: where the robot is (port: /dev/ttyUSB0, "
                         "url: socket://host:7000, or usb: {vid: '0x2341', pid: '0x0043'})")
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} are {'both' if len(given) == 2 else 'all'} given; "
                         "give exactly one of port, url, usb")
    if "baudrate" not in config:
        raise ValueError("baudrate: is required: the robot's line speed, e.g. baudrate: 115200")
    port = check_port(config["port"]) if given[0] == "port" else None
    url = check_url(config["url"]) if given[0] == "url" else None
    usb = check_usb(config["usb"]) if given[0] == "usb" else None
    baudrate = check_baudrate(config["baudrate"])
    handshake = check_handshake(config["handshake"]) if config.get("handshake") is not None else None
    name = config.get("name")
    name = default_name(port, url, usb) if name is None else _text(name, "name", MAX_NAME, "the robot's name")
    return RobotConfig(name, baudrate, port, url, usb, handshake)
