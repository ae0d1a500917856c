"""The placement search (SPEC §13): every layout of a job's components on the accelerators of its cluster,
each predicted with the cost model of :mod:`hwplace.planning.cost`, the best kept per layout.

A *layout* says which components colocate: a partition of the components into cells (all colocated, all
apart, or a mix). A *plan* of a layout puts its cells, in some order, on consecutive accelerators from rank 0
of group ``cluster`` (the rest stay unused), each cell on a run of accelerators of its own, all of its
components on all of them, one process per ``devices_per_process`` accelerators. The search tries every
order and every size of every cell that the profile can predict
(:meth:`~hwplace.planning.profile.ComponentProfile.at`), drops what does not fit memory (the rule of
:mod:`hwplace.planning.memory`) or splits a process across nodes, and keeps
each layout's fastest plan by branch and bound: the same answer as trying every plan, found without trying
most. Components placed on another node group keep the placement written (``fixed``). Imports the layers below
and the other modules of :mod:`hwplace.planning`.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hwplace.config.job_config import JobConfig
from hwplace.config.resources import ComponentResources
from hwplace.contracts.records import Placement
from hwplace.foundation.errors import ConfigError, PlacementError
from hwplace.foundation.wording import plural
from hwplace.inventory.cluster import Cluster
from hwplace.planning.component import ComponentPlacement
from hwplace.planning.cost import SyncCost, cell_work, expected_longest, memory_of, slowest, sync_seconds
from hwplace.planning.layouts import Candidate, Cell, SearchResult, Slot, written_entry
from hwplace.planning.memory import capacity_of, peak
from hwplace.planning.profile import NotMeasured, Point, Profile
from hwplace.planning.resources import Resource, resource_space
from hwplace.planning.sync_plan import OTHER_NODE, SAME_DEVICE, SAME_NODE

NO_SPLIT = ("no split of the accelerators fits: a cell's peak memory exceeds its accelerators' capacity, a "
            "process would span two nodes, or the cells need more accelerators than there are")
MAX_COMPONENTS = 6  # 203 layouts of 6 components; beyond that, search fewer at a time


@dataclass
class _Block:
    """One cell of a layout, its possible sizes precomputed: ``by_size[s] = (seconds, peak, slots)``."""

    names: tuple[str, ...]
    by_size: dict[int, tuple[float, int | None, tuple[Slot, ...]]]
    best_below: list[float]  # best_below[s]: the least seconds of any size up to s (inf if none), syncs at best
    reason: str | None
    syncs: tuple[int, ...] = ()  # the weight syncs that count in this cell
    floor: float = 0.0  # the least those syncs can cost
    spreads: dict[int, float] = field(default_factory=dict)  # per size: how much its seconds vary from step to step

    def __post_init__(self) -> None:
        self.rising = [-seconds for seconds in self.best_below]


def search_placements(job: JobConfig, cluster: Cluster, profile: Profile) -> SearchResult:
    """Search the placements of ``job``'s components on ``cluster`` (see the module docstring). A
    :class:`~hwplace.planning.profile.NotMeasured` when no layout at all can be predicted, naming why."""
    space = resource_space(cluster, [job.cluster.group("cluster")])
    if space.is_node_kind or not len(space):
        raise PlacementError(f"--search places components on accelerators, and there are none: {space.description}")
    searched = [n for n, spec in job.cluster.components.items() if spec.node_groups == ("cluster",)]
    if not searched:
        raise PlacementError("--search places the components of group 'cluster', and none is placed there")
    if len(searched) > MAX_COMPONENTS:
        raise PlacementError(f"--search takes at most {MAX_COMPONENTS} components on group 'cluster', and there "
                             f"are {len(searched)}")
    for name in searched:
        profile.component(name)
    fixed_specs = {n: s for n, s in job.cluster.components.items() if n not in searched}
    fixed = _fixed_placements(job, cluster, fixed_specs)
    state = _State(job, profile, space.resources, searched, fixed)
    layouts = {tuple(sorted(layout, key=lambda cell: searched.index(cell[0]))) for layout in _partitions(searched)}
    candidates = [state.best(layout) for layout in sorted(layouts, key=lambda lay: (len(lay), lay))]
    found = sorted((c for c in candidates if c.step_seconds is not None), key=lambda c: c.step_seconds or 0.0)
    if not found:
        reasons = "; ".join(f"{c.label}: {c.reason}" for c in candidates)
        if any(c.reason == NO_SPLIT for c in candidates):
            raise PlacementError(f"no placement of {', '.join(searched)} on {plural(len(space), 'accelerator')} "
                                 f"fits: {reasons}")
        raise NotMeasured(f"no placement of {', '.join(searched)} on {plural(len(space), 'accelerator')} can be "
                          f"predicted from the profile: {reasons}", component=searched[0])
    written = {n: written_entry(s.placement, s.node_groups) for n, s in fixed_specs.items()}
    return SearchResult((*found, *(c for c in candidates if c.step_seconds is None)), len(space),
                        space.description, written)


def _fixed_placements(job: JobConfig, cluster: Cluster, specs: Mapping[str, object]) -> dict[str, list[Placement]]:
    if not specs:
        return {}
    alone = replace(job.cluster, components={n: s for n, s in job.cluster.components.items() if n in specs})
    plan = ComponentPlacement(JobConfig(alone), cluster)
    return {name: plan.get_placements(name) for name in specs}


def _partitions(items: Sequence[str]) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every set partition of ``items``, each block in the order given, blocks by their first item."""
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for smaller in _partitions(rest):
        yield ((first,), *smaller)
        for i in range(len(smaller)):
            yield (*smaller[:i], (first, *smaller[i]), *smaller[i + 1:])


class _State:
    """What the search of every layout shares: each component's options per size, the devices, the syncs."""

    def __init__(self, job: JobConfig, profile: Profile, resources: Sequence[Resource], searched: list[str],
                 fixed: Mapping[str, list[Placement]]) -> None:
        self.job, self.profile, self.searched = job, profile, searched
        self.found: tuple[float, tuple[Cell, ...], tuple[SyncCost, ...]] | None = None
        self.bound = math.inf
        self.node_of = [r.node_rank for r in resources]
        caps = [capacity_of(r.device.properties) for r in resources]
        self.n = len(self.node_of)
        self.starts = [i for i in range(1, self.n) if self.node_of[i] != self.node_of[i - 1]]
        self.caps = _RangeMin([math.inf if c is None else c for c in caps])
        self.declared = {r.component: r for r in job.resources}
        self.options = {name: self._options(name) for name in searched}
        self.syncs = [(spec, profile.sync_bytes(spec.name)) for spec in job.weight_sync]
        for spec, _ in self.syncs:
            if spec.source in fixed and spec.source_rank >= len(fixed[spec.source]):
                raise ConfigError(f"weight_sync.{spec.name}.source_rank", f"component {spec.source!r} has ranks "
                                  f"0-{len(fixed[spec.source]) - 1}", value=spec.source_rank)
        self.fixed = fixed
        self.fixed_points: dict[str, Point] = {}
        for name, ranks in fixed.items():
            if name in profile.components:
                per = len(ranks[0].local_hardware_ranks) if ranks[0].local_accelerator_id >= 0 else 1
                self.fixed_points[name] = profile.component(name).at(len(ranks), per)
        self.fixed_cells = [(point.cycle, self._touching((name,)), point.spread)
                            for name, point in self.fixed_points.items()]

    def _least_sync(self, index: int, names: Sequence[str]) -> float:
        """The least weight sync ``index`` can cost in a cell of ``names``: by ``same-device`` only when the cell
        holds its source and every target, else by the faster of the other two transports."""
        spec, amount = self.syncs[index]
        bandwidth = self.profile.bandwidth
        if {spec.source, *spec.targets} <= set(names):
            return amount / max(bandwidth.values())
        return amount / max(bandwidth[SAME_NODE], bandwidth[OTHER_NODE])

    def _touching(self, names: Sequence[str]) -> tuple[int, ...]:
        """The weight syncs (their indices) whose source or a target is one of ``names``."""
        return tuple(k for k, (spec, _) in enumerate(self.syncs) if {spec.source, *spec.targets} & set(names))

    def _options(self, name: str) -> dict[int, tuple[Point, ComponentResources | None]]:
        """The fastest predictable point of ``name`` for each number of accelerators it may hold."""
        entry = self.profile.component(name)
        per_options = sorted({p.devices_per_process for p in entry.points})
        found: dict[int, tuple[Point, ComponentResources | None]] = {}
        for size in range(1, self.n + 1):
            for per in per_options:
                if size % per:
                    continue
                try:
                    point = entry.at(size // per, per)
                except NotMeasured:
                    continue
                if size not in found or point.cycle < found[size][0].cycle:
                    found[size] = (point, memory_of(name, point, self.declared))
        return found

    def _block(self, names: tuple[str, ...]) -> _Block:
        sizes = set.intersection(*(set(self.options[n]) for n in names))
        by_size: dict[int, tuple[float, int | None, tuple[Slot, ...]]] = {}
        spreads: dict[int, float] = {}
        reason = None
        for size in sorted(sizes):
            members = [(n, *self.options[n][size]) for n in names]
            try:
                seconds, _, spreads[size] = cell_work(members)
            except NotMeasured as exc:
                reason = reason or exc.reason
                continue
            slots = tuple(Slot(n, p.processes, p.devices_per_process, p) for n, p, _ in members)
            beyond = self._source_rank_beyond(slots)
            if beyond:
                reason = reason or beyond
                continue
            held = [(m, 1) for _, _, m in members if m is not None]
            by_size[size] = (seconds, peak(held)[0] if held else None, slots)
        if not sizes:
            none = [n for n in names if not self.options[n]]
            if none:
                what = ", ".join(f"{n} (measured on {self.profile.component(n).measured_text()})" for n in none)
                reason = f"no count of accelerators up to {self.n} predicts {what}"
            else:
                what = "; ".join(f"{n} on {_sizes(sorted(self.options[n]))}" for n in names)
                reason = f"no count of accelerators predicts all of them together: {what}"
        syncs = self._touching(names)
        floor = sum(self._least_sync(k, names) for k in syncs)
        best_below, least = [math.inf] * (self.n + 1), math.inf
        for size in range(1, self.n + 1):
            if size in by_size:
                least = min(least, by_size[size][0] + floor)
            best_below[size] = least
        return _Block(names, by_size, best_below, None if by_size else reason, syncs, floor, spreads)

    def _source_rank_beyond(self, slots: tuple[Slot, ...]) -> str:
        """Why a weight sync's source rank has no process among ``slots`` (its key, value and the source's
        processes there), or ``""``."""
        processes = {s.component: s.processes for s in slots}
        for spec, _ in self.syncs:
            if spec.source in processes and spec.source_rank >= processes[spec.source]:
                count = processes[spec.source]
                return (f"weight_sync.{spec.name}.source_rank is {spec.source_rank}, beyond {spec.source}'s "
                        f"{count} process{'' if count == 1 else 'es'} there")
        return ""

    def best(self, layout: tuple[tuple[str, ...], ...]) -> Candidate:
        blocks = [self._block(names) for names in layout]
        missing = [b.reason for b in blocks if b.reason]
        if missing:
            return Candidate(layout, None, None, reason="; ".join(missing))
        least = [min(b.by_size) for b in blocks]
        if sum(least) > self.n:
            sizes = ", ".join(f"{','.join(b.names)} {size}" for b, size in zip(blocks, least, strict=True))
            return Candidate(layout, None, None, reason=f"its cells need at least {sum(least)} accelerators "
                             f"({sizes}) and there are {self.n}: profile smaller process counts")
        floor = max((seconds for seconds, _, _ in self.fixed_cells), default=0.0)
        self.found, self.bound = None, math.inf
        orders = [list(order) for order in itertools.permutations(blocks)]
        balanced = self._balanced(blocks)
        for order in orders:  # a good plan first: the bound it sets prunes the rest
            self._probe(order, [balanced[id(b)] for b in order])
        for order in orders:
            self._descend(order, 0, 0, floor, [])
        if self.found is None:
            return Candidate(layout, None, None, reason=NO_SPLIT)
        step, cells, syncs = self.found
        return Candidate(layout, cells, step, syncs)

    def _descend(self, order: list[_Block], index: int, first: int, worst: float,
                 chosen: list[tuple[_Block, int, int]]) -> None:
        if index == len(order):
            self._evaluate(chosen)
            return
        block = order[index]
        rest = order[index + 1:]
        need = sum(_need(b, self.bound) for b in rest)
        room = self.n - first - need
        for size in range(min(room, self.n), 0, -1):
            if max(block.best_below[size], worst) >= self.bound:
                break
            entry = block.by_size.get(size)
            if entry is None or max(entry[0] + block.floor, worst) >= self.bound:
                continue
            if not self._fits(block, first, size):
                continue
            seconds = entry[0]
            chosen.append((block, first, size))
            self._descend(order, index + 1, first + size, max(worst, seconds + block.floor), chosen)
            chosen.pop()

    def _balanced(self, blocks: list[_Block]) -> dict[int, int]:
        """Each block's size in the fastest split that ignores where cells land: the least sizes that reach the
        least time every block can reach within the accelerators (a probe; the search proper decides)."""
        values = sorted({v for b in blocks for v in b.best_below if v < math.inf})
        low, high = 0, len(values) - 1
        while low < high:
            middle = (low + high) // 2
            if sum(bisect.bisect_left(b.rising, -values[middle]) for b in blocks) <= self.n:
                high = middle
            else:
                low = middle + 1
        return {id(b): bisect.bisect_left(b.rising, -values[low]) for b in blocks}

    def _probe(self, order: list[_Block], sizes: list[int]) -> None:
        chosen, first = [], 0
        for block, size in zip(order, sizes, strict=True):
            if first + size > self.n or size not in block.by_size or not self._fits(block, first, size):
                return
            chosen.append((block, first, size))
            first += size
        self._evaluate(chosen)

    def _fits(self, block: _Block, first: int, size: int) -> bool:
        """Whether the block's memory fits accelerators ``first`` on, and no process of it spans two nodes."""
        _, held, slots = block.by_size[size]
        if held is not None and held > self.caps.least(first, first + size):
            return False
        return not any(s.devices_per_process > 1 and self._splits(first, size, s.devices_per_process) for s in slots)

    def _splits(self, first: int, size: int, per: int) -> bool:
        """Whether a process of ``per`` accelerators from ``first`` on would span two nodes."""
        i = bisect.bisect_right(self.starts, first)
        while i < len(self.starts) and self.starts[i] < first + size:
            if (self.starts[i] - first) % per:
                return True
            i += 1
        return False

    def _evaluate(self, chosen: list[tuple[_Block, int, int]]) -> None:
        where = {}
        for block, first, size in chosen:
            for slot in block.by_size[size][2]:
                where[slot.component] = (first, slot)
        transports = [slowest(self._transport(spec.source, spec.source_rank, t, where) for t in spec.targets)
                      for spec, _ in self.syncs]
        times = [sync_seconds(amount, transport, self.profile.bandwidth)
                 for (_, amount), transport in zip(self.syncs, transports, strict=True)]
        step = expected_longest([(block.by_size[size][0] + sum(times[k] for k in block.syncs), block.spreads[size])
                                 for block, _, size in chosen]
                                + [(seconds + sum(times[k] for k in touching), spread)
                                   for seconds, touching, spread in self.fixed_cells])
        if step >= self.bound:
            return
        cells = tuple(Cell(block.by_size[size][2], first, size,
                           block.by_size[size][0] + sum(times[k] for k in block.syncs), block.by_size[size][1])
                      for block, first, size in chosen)
        self.bound = step
        self.found = (step, cells, tuple(SyncCost(spec.name, transport, seconds) for (spec, _), transport, seconds
                                         in zip(self.syncs, transports, times, strict=True)))

    def _transport(self, source: str, rank: int, target: str, where: Mapping[str, tuple[int, Slot]]) -> str:
        if source in where:
            first, slot = where[source]
            low = first + rank * slot.devices_per_process
            high, node = low + slot.devices_per_process - 1, self.node_of[low]
        else:
            low, high, node = -1, -1, self.fixed[source][rank].node_rank
        if target not in where:
            return SAME_NODE if all(p.node_rank == node for p in self.fixed[target]) else OTHER_NODE
        start, other = where[target]
        end = start + other.processes * other.devices_per_process - 1
        if self.node_of[start] != node or self.node_of[end] != node:
            return OTHER_NODE
        per = other.devices_per_process
        if start + per - 1 >= low >= 0 and start + (other.processes - 1) * per <= high:
            return SAME_DEVICE
        return SAME_NODE


def _need(block: _Block, bound: float) -> int:
    """The fewest accelerators ``block`` can take in a plan faster than ``bound`` (more than there are when
    it can take none): ``best_below`` does not grow, so its negation is sorted."""
    return bisect.bisect_right(block.rising, -bound)


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes[:8])) + (", ..." if len(sizes) > 8 else "")


class _RangeMin:
    """The least of a run of values, in constant time (a sparse table)."""

    def __init__(self, values: list[float]) -> None:
        self.uniform = len(set(values)) <= 1
        self.table = [values]
        width = 1
        while 2 * width <= len(values):
            row = self.table[-1]
            self.table.append([min(row[i], row[i + width]) for i in range(len(values) - 2 * width + 1)])
            width *= 2

    def least(self, start: int, stop: int) -> float:
        if self.uniform:
            return self.table[0][0]
        level = (stop - start).bit_length() - 1
        row = self.table[level]
        return min(row[start], row[stop - (1 << level)])
