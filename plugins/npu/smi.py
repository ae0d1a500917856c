"""Reading the tables ``npu-smi info`` and ``npu-smi info -m`` print (Ascend driver tool, any version seen so far).

``npu-smi info`` prints two lines per chip between ``+===+`` borders, then a process table::

    | NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
    | Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
    +===========================+===============+====================================================+
    | 0     910B3               | OK            | 95.3        35                0    / 0             |
    | 0                         | 0000:C1:00.0  | 0           0    / 0          3396 / 65536         |

The second header cell names what follows the chip number: nothing (one chip per card: 910A/910B), ``Device``
(the runtime's device id: 310/310P cards) or ``Phy-ID`` (dual-die cards: Atlas A3). ``npu-smi info -m`` maps
each (NPU ID, Chip ID) to the ``Chip Logic ID`` the runtime (and ``ASCEND_RT_VISIBLE_DEVICES``) counts in;
its ``Mcu`` rows (logic id ``-``) are not compute chips.

Anything that does not read as such a table raises :class:`SmiFormatError` saying where and why: a garbled
answer is never half-believed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 2**20
MAX_LINES = 20_000  # far beyond any real table (16 chips take ~60 lines); bounds the work on garbage
HEALTHY = ("OK", "Warning")  # npu-smi's levels: OK, Warning (minor alarm), Alarm (major), Critical
BUS_ID = re.compile(r"^(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\Z")
USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")
NOT_AVAILABLE = ("NA", "N/A", "-")


class SmiFormatError(ValueError):
    """The text is not the table npu-smi prints; the message says which line and why."""


@dataclass(frozen=True)
class SmiChip:
    """One chip line pair of ``npu-smi info``, as printed."""

    npu_id: int
    chip_id: int
    name: str
    health: str
    bus_id: str
    memory_mib: int | None  # device memory total (Memory-Usage), when the table shows it non-zero
    hbm_mib: int | None  # HBM total, when the table has the column and it is non-zero
    device_id: int | None  # the ``Device`` column (310/310P layouts)
    phy_id: int | None  # the ``Phy-ID`` column (Atlas A3 layout)


def _cells(line: str) -> list[str]:
    """The cells of a ``| a | b | c |`` line, stripped."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _number(text: str, what: str, where: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 9):
        raise SmiFormatError(f"{where}: {what} is {text[:40]!r}, not a number")
    return int(text)


def _optional_number(text: str, what: str, where: str) -> int | None:
    return None if text in NOT_AVAILABLE else _number(text, what, where)


def parse_info(text: str) -> list[SmiChip]:
    """The chips of an ``npu-smi info`` answer, in the order printed; ``[]`` for a table with no chip."""
    lines = text.splitlines()[:MAX_LINES]
    start = next((i for i, line in enumerate(lines) if _is_header(line)), None)
    if start is None:
        first = next((line.strip() for line in lines if line.strip()), "")
        raise SmiFormatError(f"no 'NPU Name | Health' table header; it begins {first[:80]!r}" if first else
                             "the answer is empty")
    if start + 1 >= len(lines) or not lines[start + 1].lstrip().startswith("|"):
        raise SmiFormatError(f"line {start + 2}: the second header line ('| Chip ... | Bus-Id | ...') is missing")
    second = _cells(lines[start + 1])
    if len(second) != 3 or not second[0].startswith("Chip") or "Bus-Id" not in second[1]:
        raise SmiFormatError(f"line {start + 2}: expected '| Chip ... | Bus-Id | ...', got {lines[start + 1][:80]!r}")
    extra = second[0].split()[1:]  # [], ["Device"] or ["Phy-ID"]
    if extra not in ([], ["Device"], ["Phy-ID"]):
        raise SmiFormatError(f"line {start + 2}: unknown chip columns {' '.join(extra)!r}")
    has_hbm = "HBM-Usage" in second[2]
    chips: list[SmiChip] = []
    pending: tuple[int, int, str, str] | None = None  # line number, NPU id, name, health of a first line
    for number, line in enumerate(lines[start + 2:], start=start + 3):
        stripped = line.strip()
        if not stripped or stripped.startswith("+"):
            if pending is not None and stripped.startswith("+"):
                raise SmiFormatError(f"line {pending[0]}: NPU {pending[1]} has no chip line after it")
            continue
        if not stripped.startswith("|"):
            raise SmiFormatError(f"line {number}: {stripped[:80]!r} is not part of the table")
        cells = _cells(stripped)
        if any("Process id" in cell or "Process name" in cell for cell in cells) or "No running processes" in stripped:
            break  # the process table: its rows look like chip rows, and are not
        where = f"line {number}"
        if len(cells) != 3:
            raise SmiFormatError(f"{where}: {len(cells)} cells where a chip line has 3: {stripped[:80]!r}")
        if pending is None:
            words = cells[0].split()
            if len(words) < 2:
                raise SmiFormatError(f"{where}: expected '<NPU id> <name>', got {cells[0][:40]!r}")
            health = cells[1]
            if not health or " " in health:
                raise SmiFormatError(f"{where}: health is {health[:40]!r}")
            pending = (number, _number(words[0], "the NPU id", where), " ".join(words[1:]), health)
            continue
        _, npu_id, name, health = pending
        pending = None
        words = cells[0].split()
        if len(words) != 1 + len(extra):
            raise SmiFormatError(f"{where}: expected '<chip>{' <' + extra[0] + '>' if extra else ''}' for NPU "
                                 f"{npu_id}, got {cells[0][:40]!r}")
        chip_id = _number(words[0], "the chip id", where)
        column = _optional_number(words[1], extra[0], where) if extra else None
        bus_id = cells[1]
        if bus_id not in NOT_AVAILABLE and not BUS_ID.match(bus_id):
            raise SmiFormatError(f"{where}: bus id {bus_id[:40]!r} of NPU {npu_id} is not a PCI address")
        usage = USAGE.findall(cells[2])
        if len(usage) != (2 if has_hbm else 1):
            raise SmiFormatError(f"{where}: expected {'memory and HBM usage' if has_hbm else 'memory usage'} "
                                 f"('used / total' in MB) for NPU {npu_id}, got {cells[2][:60]!r}")
        memory = int(usage[0][1]) or None
        hbm = (int(usage[1][1]) or None) if has_hbm else None
        chips.append(SmiChip(npu_id, chip_id, name, health, bus_id, memory, hbm,
                             column if extra == ["Device"] else None, column if extra == ["Phy-ID"] else None))
    if pending is not None:
        raise SmiFormatError(f"line {pending[0]}: NPU {pending[1]} has no chip line after it (output cut short?)")
    keys = [(c.npu_id, c.chip_id) for c in chips]
    repeated = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if repeated is not None:
        raise SmiFormatError(f"NPU {repeated[0]} chip {repeated[1]} is listed twice")
    return chips


def _is_header(line: str) -> bool:
    cells = _cells(line) if line.lstrip().startswith("|") else []
    return len(cells) == 3 and cells[0].split()[:2] == ["NPU", "Name"] and cells[1] == "Health"


def parse_map(text: str) -> dict[tuple[int, int], int]:
    """``npu-smi info -m``: (NPU ID, Chip ID) -> Chip Logic ID of each compute chip (``Mcu`` rows left out)."""
    lines = [line.strip() for line in text.splitlines()[:MAX_LINES]]
    start = next((i for i, line in enumerate(lines) if line.startswith("NPU ID") and "Chip Logic ID" in line), None)
    if start is None:
        raise SmiFormatError("no 'NPU ID  Chip ID  Chip Logic ID' header")
    mapping: dict[tuple[int, int], int] = {}
    for number, line in enumerate(lines[start + 1:], start=start + 2):
        if not line:
            continue
        words = line.split()
        where = f"line {number} of 'npu-smi info -m'"
        if len(words) < 4:
            raise SmiFormatError(f"{where}: expected 'NPU ID, Chip ID, Chip Logic ID, Chip Name', got {line[:80]!r}")
        key = (_number(words[0], "the NPU ID", where), _number(words[1], "the Chip ID", where))
        if words[2] in NOT_AVAILABLE:
            continue  # the card's MCU: not a compute chip
        logic = _number(words[2], "the Chip Logic ID", where)
        if key in mapping:
            raise SmiFormatError(f"{where}: NPU {key[0]} chip {key[1]} is listed twice")
        if logic in mapping.values():
            raise SmiFormatError(f"{where}: Chip Logic ID {logic} is given to two chips")
        mapping[key] = logic
    return mapping
