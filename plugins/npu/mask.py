"""Physical and logical NPU ids, and the ``ASCEND_RT_VISIBLE_DEVICES`` mask a node may already have.

A chip's *physical id* is the node-level device id the Ascend runtime counts in, the number
``ASCEND_RT_VISIBLE_DEVICES`` takes (npu-smi's "Chip Logic ID"). A process started with
``ASCEND_RT_VISIBLE_DEVICES=4,5,6,7`` sees those four chips as its devices 0..3: its *logical* ids. hwplace
numbers a node's devices in that logical order (``Device.index``) and keeps the physical id in the
properties, because the isolation variable of a worker must name physical ids: a worker given ``0,1`` on
that node would get the node's chips 0 and 1, which the mask had taken away from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import hwplace

MASK_VARIABLE = "ASCEND_RT_VISIBLE_DEVICES"
RAY_OPT_OUT = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
MAX_ENTRIES = 4096  # a longer mask is a mistake, refused before anything is built from it
BAD_ENTRY_MODEL = "Ascend NPU (unresolved ASCEND_RT_VISIBLE_DEVICES entry)"


@dataclass(frozen=True)
class Chip:
    """A chip found on this node, before the mask: its physical id, model, health and plain-data facts."""

    physical_id: int
    model: str
    healthy: bool = True
    reason: str = ""
    properties: Mapping[str, Any] = field(default_factory=dict)

    def device(self, logical_id: int) -> hwplace.Device:
        properties = {**self.properties, "physical_id": self.physical_id, "logical_id": logical_id}
        return hwplace.Device(logical_id, self.model, self.healthy, self.reason, properties)


def id_span(ids: Sequence[int]) -> str:
    """``0-7`` for a run, ``0,2,5`` otherwise, ``none`` when empty."""
    ordered = sorted(ids)
    if not ordered:
        return "none"
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def apply_mask(chips: Sequence[Chip], raw: str | None) -> list[hwplace.Device]:
    """The node's devices under the inherited mask ``raw`` (``None``: no mask, every chip by physical id).

    Each mask entry becomes the device at its logical position. An entry the runtime would not accept
    (not a number, a chip this node lacks, a repeat, out of ascending order) becomes an unhealthy device
    saying so, so the problem is shown where the device would be, and nothing is placed on it.
    """
    if raw is None:
        return [chip.device(i) for i, chip in enumerate(sorted(chips, key=lambda c: c.physical_id))]
    shown = raw if len(raw) <= 80 else raw[:77] + "..."
    if raw.strip() in ("", "NoDevFiles"):
        return hwplace.NoDevices(
            f"{MASK_VARIABLE}={shown!r} hides every NPU from this process (Ray sets it so for a task or actor that "
            f"asked for no NPU): unset it, or start the process with {RAY_OPT_OUT}=1")
    entries = raw.split(",")
    if len(entries) > MAX_ENTRIES:
        return hwplace.NoDevices(f"{MASK_VARIABLE}={shown!r} has {len(entries)} entries; a node has at most "
                                 f"{MAX_ENTRIES} NPUs")
    by_id = {chip.physical_id: chip for chip in chips}
    here = f"physical ids here: {id_span(list(by_id))}"
    devices: list[hwplace.Device] = []
    seen: dict[int, int] = {}
    last = -1
    for logical, entry in enumerate(entries):
        problem = ""
        if not (entry.isascii() and entry.isdigit() and len(entry) <= 9):
            problem = (f"entry {logical} ({entry[:20]!r}) is not a device id: the list takes non-negative integers "
                       "separated by commas, no spaces, and the runtime ignores everything from a bad entry on")
        elif int(entry) in seen:
            problem = f"entry {logical} ({entry}) repeats physical id {int(entry)} (entry {seen[int(entry)]})"
        elif int(entry) not in by_id:
            problem = f"entry {logical} ({entry}) names no NPU of this node ({here})"
        elif int(entry) < last:
            problem = (f"entry {logical} ({entry}) comes after {last}: the Ascend runtime accepts ids in ascending "
                       "order only")
        if problem:
            devices.append(hwplace.Device(logical, BAD_ENTRY_MODEL, healthy=False,
                                          reason=f"{MASK_VARIABLE}={shown!r}: {problem}",
                                          properties={"logical_id": logical, "mask_entry": entry[:20]}))
            continue
        physical = int(entry)
        seen[physical] = logical
        last = physical
        devices.append(by_id[physical].device(logical))
    return devices


def isolation_env(devices: Sequence[hwplace.Device]) -> dict[str, str]:
    """``ASCEND_RT_VISIBLE_DEVICES`` naming the devices' physical ids, and Ray's promise to leave it alone.

    A planned device (offline inventories) has no ``physical_id``: its index stands for it.
    """
    ids = []
    for device in devices:
        if "mask_entry" in device.properties and "physical_id" not in device.properties:
            raise ValueError(f"npu device {device.index} is the bad {MASK_VARIABLE} entry "
                             f"{device.properties['mask_entry']!r} of its node ({device.reason}); fix the variable "
                             "on that node before placing work there")
        physical = device.properties.get("physical_id", device.index)
        if isinstance(physical, bool) or not isinstance(physical, int) or physical < 0:
            raise ValueError(f"npu device {device.index}: its physical_id is {physical!r}, not a non-negative integer")
        ids.append(str(physical))
    return {MASK_VARIABLE: ",".join(ids), RAY_OPT_OUT: "1"}
