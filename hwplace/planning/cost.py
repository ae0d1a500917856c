"""The cost model of a placement (``docs/resources.md``, "The cost model"): a step's predicted time from a
profile, and :func:`predict`, which applies it to a planned :class:`~hwplace.ComponentPlacement`.

The rule. Components that share an accelerator form a *cell* (with those they share with, transitively);
components of one cell take turns, so their work serializes: a cell's time is the sum of its components'
stage seconds, plus, where the cell has more than one component, each one's measured offload and onload; but
no less than any one component's own cycle, its stage seconds plus the driver's time between two of its calls
(``between``: while the driver works, the component's cell-mates may compute, itself not); plus every weight
sync whose source or a target is in the cell. Cells run side by side and pipeline (one step off-policy): each
step takes as long as the slowest cell *in that step*, so the step is the expected longest of the cells, each
cell's time varying from step to step by the measured ``spread`` (:func:`expected_longest`: the slowest cell's
time where nothing varies). A weight sync takes its bytes over the bandwidth
of its slowest transport: ``same-device``, ``same-node`` or ``other-node`` (:mod:`hwplace.planning.sync_plan`).
The search (:mod:`hwplace.planning.search`) applies the same functions without building placements.
Imports the layers below and the other modules of :mod:`hwplace.planning` but ``search``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hwplace.config.resources import OFFLOADED, ComponentResources
from hwplace.contracts.records import Placement
from hwplace.foundation.errors import ConfigError
from hwplace.planning.component import ComponentPlacement
from hwplace.planning.memory import DeviceKey, DeviceMemory, capacity_of, device_memory
from hwplace.planning.profile import NotMeasured, Point, Profile
from hwplace.planning.sharing import shared_accelerators
from hwplace.planning.sync_plan import OTHER_NODE, SAME_DEVICE, SAME_NODE, plan_sync

SLOWNESS = {SAME_DEVICE: 0, SAME_NODE: 1, OTHER_NODE: 2}


def swap_seconds(component: str, point: Point, memory: ComponentResources | None, shared: bool) -> float:
    """What taking turns costs ``component`` per step: nothing alone on its accelerators, else its measured
    offload and onload. A component that shares and declares an ``offloaded`` figure but was not measured
    offloading is :class:`~hwplace.planning.profile.NotMeasured`: its offload cost is unknown."""
    if not shared:
        return 0.0
    if point.swap is not None:
        return point.swap
    if memory is not None and OFFLOADED in memory.memory:
        raise NotMeasured(f"{component} offloads (its memory has an offloaded phase) but its profile at "
                          f"{point.describe()} has no offload and onload seconds", component=component,
                          processes=point.processes, devices_per_process=point.devices_per_process)
    return 0.0


def sync_seconds(amount: int, transport: str, bandwidth: Mapping[str, int]) -> float:
    """Seconds to move ``amount`` bytes by ``transport``."""
    return amount / bandwidth[transport]


def slowest(transports: Iterable[str]) -> str:
    """The slowest of some transports (``same-device`` for none)."""
    return max(transports, key=SLOWNESS.__getitem__, default=SAME_DEVICE)


def memory_of(component: str, point: Point, declared: Mapping[str, ComponentResources]) -> ComponentResources | None:
    """A component's memory per phase: measured at the point, else its ``resources:`` entry, else unknown."""
    return point.resources(component) or declared.get(component)


@dataclass(frozen=True)
class CellCost:
    """One cell: its components, its seconds per step and what they are made of (``(what, seconds)``)."""

    components: tuple[str, ...]
    seconds: float
    parts: tuple[tuple[str, float], ...]
    spread: float = 0.0


@dataclass(frozen=True)
class SyncCost:
    """One weight sync: its slowest transport and its seconds per step."""

    name: str
    transport: str
    seconds: float


@dataclass(frozen=True)
class Prediction:
    """A placement's predicted step: the slowest cell's seconds, every cell and sync, each accelerator's peak
    memory (as ``hwplace plan`` shows it), the points used, and the components the profile does not cover."""

    step_seconds: float
    cells: tuple[CellCost, ...]
    syncs: tuple[SyncCost, ...]
    memory: tuple[DeviceMemory, ...]
    points: Mapping[str, Point]
    unprofiled: tuple[str, ...] = ()

    @property
    def peak(self) -> int | None:
        """The largest peak of any accelerator, ``None`` when no memory figure is known."""
        return max((m.peak for m in self.memory if m.holdings), default=None)

    @property
    def fits(self) -> bool:
        return all(m.fits for m in self.memory)


Parts = tuple[tuple[str, float], ...]


def cell_work(members: Sequence[tuple[str, Point, ComponentResources | None]]) -> tuple[float, Parts, float]:
    """A cell's seconds before weight sync, what they are made of, and how much they vary from step to step: its
    components' stages one after another with their turns (their spreads added as independent variations), or,
    where it is longer, one component's cycle (its stages and the driver's time between two of its calls, during
    which the others may work) and its spread."""
    shared = len(members) > 1
    serial: list[tuple[str, float]] = []
    for name, point, memory in members:
        serial.append((name, point.seconds))
        swap = swap_seconds(name, point, memory, shared)
        if swap:
            serial.append((f"{name} offload+onload", swap))
    total = sum(seconds for _, seconds in serial)
    name, point, _ = max(members, key=lambda member: member[1].cycle)
    if point.between and point.cycle > total:
        return point.cycle, ((name, point.seconds), (f"{name} between steps (driver)", point.between)), point.spread
    return total, tuple(serial), math.hypot(*(member[1].spread for member in members))


def expected_longest(cells: Iterable[tuple[float, float]]) -> float:
    """The expected longest of cells whose times vary independently from step to step, each ``(mean, standard
    deviation)`` in seconds, as normal variables: Clark's (1961) moments of the maximum of two, folded over the
    cells. Where no cell varies, the longest mean."""
    mean, variance = -math.inf, 0.0
    for other, spread in cells:
        if mean == -math.inf:
            mean, variance = other, spread * spread
            continue
        theta = math.sqrt(variance + spread * spread)
        if theta <= 1e-12 * max(abs(mean), abs(other), 1e-9):
            mean, variance = max(mean, other), 0.0
            continue
        alpha = (mean - other) / theta
        high, low = _normal_cdf(alpha), _normal_cdf(-alpha)
        density = math.exp(-alpha * alpha / 2) / math.sqrt(2 * math.pi)
        first = mean * high + other * low + theta * density
        second = ((mean * mean + variance) * high + (other * other + spread * spread) * low
                  + (mean + other) * theta * density)
        mean, variance = first, max(0.0, second - first * first)
    return 0.0 if mean == -math.inf else mean


def _normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def cell_cost(members: Sequence[tuple[str, Point, ComponentResources | None]],
              syncs: Sequence[SyncCost]) -> CellCost:
    """A cell's seconds: :func:`cell_work`, and ``syncs`` (those touching it)."""
    work, parts, spread = cell_work(members)
    synced = tuple((f"weight sync {s.name} ({s.transport})", s.seconds) for s in syncs)
    return CellCost(tuple(m[0] for m in members), work + sum(s.seconds for s in syncs), parts + synced, spread)


def predict(plan: ComponentPlacement, profile: Profile) -> Prediction:
    """The predicted step of a planned placement. Every profiled component is predicted at its process count
    and accelerators per process (:class:`~hwplace.planning.profile.NotMeasured` where the profile cannot say,
    as for a weight sync without bytes); components the profile lacks are listed as ``unprofiled``."""
    job = plan.job
    placements = {name: plan.get_placements(name) for name in plan.components}
    declared = {r.component: r for r in job.resources}
    points: dict[str, Point] = {}
    unprofiled = []
    for name, ranks in placements.items():
        if name not in profile.components:
            unprofiled.append(name)
            continue
        per = {len(p.local_hardware_ranks) if p.local_accelerator_id >= 0 else 1 for p in ranks}
        if len(per) > 1:
            raise NotMeasured(f"{name}'s processes hold different numbers of accelerators ({sorted(per)}): the "
                              "cost model predicts components whose processes are alike", component=name)
        points[name] = profile.component(name).at(len(ranks), per.pop())
    cells = _cells(placements, points)
    syncs, touched = [], []
    for spec in job.weight_sync:
        sources = placements[spec.source]
        if spec.source_rank >= len(sources):
            raise ConfigError(f"weight_sync.{spec.name}.source_rank", f"component {spec.source!r} has ranks "
                              f"0-{len(sources) - 1}", value=spec.source_rank)
        targets = plan_sync(sources[spec.source_rank], {t: placements[t] for t in spec.targets})
        transport = slowest(t.transport for t in targets)
        syncs.append(SyncCost(spec.name, transport,
                              sync_seconds(profile.sync_bytes(spec.name), transport, profile.bandwidth)))
        touched.append({spec.source, *spec.targets})
    memories = {name: memory_of(name, point, declared) for name, point in points.items()}
    costs = tuple(cell_cost([(n, points[n], memories[n]) for n in cell],
                            [s for s, names in zip(syncs, touched, strict=True) if names & set(cell)])
                  for cell in cells)
    records = [r for r in memories.values() if r is not None]
    records += [r for name, r in declared.items() if name not in memories]
    plans = device_memory(placements, records, _capacities(plan, placements))
    return Prediction(expected_longest((c.seconds, c.spread) for c in costs), costs, tuple(syncs), tuple(plans),
                      points, tuple(unprofiled))


def _cells(placements: Mapping[str, Sequence[Placement]], points: Mapping[str, Point]) -> list[tuple[str, ...]]:
    """The profiled components grouped by shared accelerators (transitively), in config order."""
    parent = {name: name for name in placements}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    for (name, _), shares in shared_accelerators(placements).items():
        for share in shares:
            parent[root(share.component)] = root(name)
    groups: dict[str, list[str]] = {}
    for name in placements:
        if name in points:
            groups.setdefault(root(name), []).append(name)
    return [tuple(group) for group in groups.values()]


def _capacities(plan: ComponentPlacement, placements: Mapping[str, Sequence[Placement]]) -> dict[DeviceKey, int | None]:
    capacities: dict[DeviceKey, int | None] = {}
    for ranks in placements.values():
        for p in ranks:
            if p.local_accelerator_id >= 0:
                for device in plan.cluster.nodes[p.node_rank].devices(p.hardware_type):
                    capacities[(p.node_rank, p.hardware_type, device.index)] = capacity_of(device.properties)
    return capacities
