"""Memory per phase (SPEC §13): the peak of each accelerator from the placements and the ``resources:`` section,
against what the device reports (``Device.properties["memory_bytes"]``).

The rule. A process of a component holds, on each accelerator it owns, its component's figure for the phase
it is in. While another component of the device works, a component holds its ``offloaded`` figure if it
declares one, else its ``idle`` figure if it declares one, else its largest working phase (it does not take
turns). Processes of one component on one device do not take turns with each other: each holds its figure.
The peak of a device is the largest, over the components on it, of that component's largest working phase
plus what every other component on it holds meanwhile. A component the section does not name holds nothing
known: it is listed as undeclared, not counted. Pure functions over records: :func:`device_memory` and
:func:`peak`; :func:`check_memory` turns a device that does not fit into a :class:`~hwplace.PlacementError`.
Imports the layers below and :mod:`hwplace.planning.sharing`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hwplace.config.resources import ComponentResources
from hwplace.contracts.records import Placement
from hwplace.foundation.errors import PlacementError
from hwplace.foundation.sizes import format_size
from hwplace.foundation.wording import plural
from hwplace.planning.sharing import accelerator_units

DeviceKey = tuple[int, str, int]  # an accelerator: its node rank, hardware type and node-local index


@dataclass(frozen=True)
class Holding:
    """What ``processes`` processes of ``component`` hold together on one device at its peak: ``amount``
    bytes in ``phase`` (a working phase for the component that works, else what it holds meanwhile)."""

    component: str
    processes: int
    phase: str
    amount: int

    def __str__(self) -> str:
        times = f"{self.processes} x " if self.processes > 1 else ""
        return f"{self.component} {self.phase} {times}{format_size(self.amount // self.processes)}"


@dataclass(frozen=True)
class DeviceMemory:
    """One accelerator's memory plan: its ``capacity`` (``None``: it reports none, so it is not checked), its
    ``peak`` and who holds what then (``holdings``, the working component first), and the components on it
    that ``resources:`` does not name (``undeclared``)."""

    node_rank: int
    hardware_type: str
    index: int
    capacity: int | None
    peak: int
    holdings: tuple[Holding, ...]
    undeclared: tuple[str, ...] = ()

    @property
    def headroom(self) -> int | None:
        """``capacity - peak``: negative when the device does not fit; ``None`` when the capacity is unknown."""
        return None if self.capacity is None else self.capacity - self.peak

    @property
    def fits(self) -> bool:
        """Whether the peak is within the capacity (a device of unknown capacity is not checked: it fits)."""
        return self.capacity is None or self.peak <= self.capacity

    @property
    def device(self) -> str:
        """``"cuda 0 of node 1"``."""
        return f"{self.hardware_type} {self.index} of node {self.node_rank}"

    @property
    def working(self) -> Holding | None:
        """What the component that works at the peak holds: its component and largest working phase."""
        return self.holdings[0] if self.holdings else None

    def breakdown(self) -> str:
        """``"trainer train 50 GiB + rollout offloaded 512 MiB"``; ``"-"`` when nothing on it is declared."""
        return " + ".join(map(str, self.holdings)) or "-"


def peak(holders: Sequence[tuple[ComponentResources, int]]) -> tuple[int, tuple[Holding, ...]]:
    """The peak of one device and who holds what then, from each declared component on it and how many of
    its processes the device holds (each at least 1). The working component comes first in the holdings;
    of equal peaks, the first component given works. ``(0, ())`` for no holder."""
    best: tuple[int, tuple[Holding, ...]] = (0, ())
    for position, (resources, processes) in enumerate(holders):
        phase, amount = resources.peak_phase
        holdings = [Holding(resources.component, processes, phase, amount * processes)]
        for other, count in (*holders[:position], *holders[position + 1:]):
            held_phase, held = other.meanwhile
            holdings.append(Holding(other.component, count, held_phase, held * count))
        total = sum(holding.amount for holding in holdings)
        if not best[1] or total > best[0]:
            best = (total, tuple(holdings))
    return best


def device_memory(
    components: Mapping[str, Sequence[Placement]],
    resources: Sequence[ComponentResources],
    capacities: Mapping[DeviceKey, int | None],
) -> list[DeviceMemory]:
    """The memory plan of every accelerator a process of ``components`` owns, in (node, type, index) order.

    ``resources`` are the ``resources:`` records; ``capacities`` gives each device's ``memory_bytes`` (a device
    missing from it has none). Processes on nodes or on declared devices own no accelerator and count nowhere.
    """
    declared = {record.component: record for record in resources}
    users: dict[DeviceKey, dict[str, int]] = {}  # per device, each component's process count, in config order
    for name, placements in components.items():
        for placement in placements:
            for hardware_type, index in accelerator_units(placement):
                on = users.setdefault((placement.node_rank, hardware_type, index), {})
                on[name] = on.get(name, 0) + 1
    plans = []
    for key in sorted(users):
        counts = users[key]
        total, holdings = peak([(declared[name], count) for name, count in counts.items() if name in declared])
        undeclared = tuple(name for name in counts if name not in declared)
        plans.append(DeviceMemory(*key, capacities.get(key), total, holdings, undeclared))
    return plans


def check_memory(plans: Sequence[DeviceMemory]) -> None:
    """A :class:`~hwplace.PlacementError` for the first device whose peak exceeds its capacity, naming the
    device, the phase, the components and both figures, and how many more devices do not fit."""
    over = [plan for plan in plans if not plan.fits]
    if not over:
        return
    first = over[0]
    working = first.working
    assert working is not None  # a device over its capacity holds something
    assert first.capacity is not None
    others = [h.component for h in first.holdings[1:]]
    beside = f" beside {', '.join(others)}" if others else ""
    more = (f"; {plural(len(over) - 1, 'more device')} {'does' if len(over) == 2 else 'do'} not fit either"
            if len(over) > 1 else "")
    raise PlacementError(
        f"{first.device} does not hold its peak: {format_size(first.peak)} ({first.peak} bytes) when "
        f"{working.component} is in phase {working.phase!r}{beside} ({first.breakdown()}), but the device has "
        f"{format_size(first.capacity)} ({first.capacity} bytes){more}; lower the figures of resources:, give "
        "a component offloaded: or idle: and take turns, or place the components on other devices")


def capacity_of(properties: Mapping[str, object]) -> int | None:
    """A device's ``memory_bytes``, or ``None`` when it reports none usable (absent, not a whole number of bytes
    or negative)."""
    value = properties.get("memory_bytes")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
