"""A profile: what a job's components were measured to take, per process count (SPEC §13), as the placement
search (:mod:`hwplace.planning.search`) and the cost model (:mod:`hwplace.planning.cost`) read it.

The JSON form, version 1 (``docs/resources.md`` states it for whoever writes one, ``hwplace run --profile``
included)::

    {"version": 1,
     "components": {
       "trainer": {"scaling": "data-parallel",                  # optional: how to predict between points
                   "points": [{"processes": 4, "devices_per_process": 1, "placement": "0-3",
                               "stages": {"train": {"seconds": 1.2}},
                               "offload": {"seconds": 0.2}, "onload": {"seconds": 0.3},
                               "between": {"seconds": 0.05},
                               "memory": {"train": "50GiB", "offloaded": "1GiB"}}]}},
     "weight_sync": {"policy": {"bytes": "1GiB"}},
     "bandwidth": {"same-device": "200GB", "same-node": "20GB", "other-node": "10GB"}}

A point is one measurement: the component ran as ``processes`` processes of ``devices_per_process``
accelerators each; each stage took ``seconds`` per step; ``between`` is the driver's time per step between two
of its calls; ``memory`` is what one process held on each of its
accelerators, per phase (the ``resources:`` rule). :meth:`ComponentProfile.at` predicts nothing that was not
measured: another process count is :class:`NotMeasured`, naming the component and the count, unless the
component declares ``scaling: data-parallel`` and has measured at least two counts around it. A mistake in
the file is a :class:`~hwplace.ConfigError` naming its key path. Imports the layers below and
:mod:`hwplace.planning.sync_plan`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hwplace.config.checks import LABEL, check_keys, mapping
from hwplace.config.resources import ComponentResources, parse_memory
from hwplace.foundation.errors import ConfigError, PlacementError
from hwplace.foundation.frozen import FrozenDict
from hwplace.foundation.sizes import ALLOWED as SIZES_ALLOWED
from hwplace.foundation.sizes import parse_size
from hwplace.foundation.wording import plural
from hwplace.planning.sync_plan import OTHER_NODE, SAME_DEVICE, SAME_NODE, TRANSPORTS

VERSION = 1
DATA_PARALLEL = "data-parallel"
SCALINGS = (DATA_PARALLEL,)
DEFAULT_BANDWIDTH: Mapping[str, int] = FrozenDict({SAME_DEVICE: 200 * 1000**3, SAME_NODE: 20 * 1000**3,
                                                   OTHER_NODE: 10 * 1000**3})
"""Bytes per second a weight sync moves by each transport, unless a profile's ``bandwidth`` says otherwise."""
RATE = "a positive amount per second, such as 20GB"  # what a profile's bandwidth.<transport> is
_KEYS = ("version", "components", "weight_sync", "bandwidth", "run")  # run: what the run measured (not predicted from)
_COMPONENT_KEYS = ("points", "scaling")
_POINT_KEYS = ("processes", "devices_per_process", "placement", "stages", "offload", "onload", "between", "spread",
               "memory")


class NotMeasured(PlacementError):
    """A prediction the profile cannot make: ``component`` was not measured at ``processes`` processes of
    ``devices_per_process`` accelerators (or lacks the figure the message names)."""

    def __init__(self, reason: str, *, component: str, processes: int = 0, devices_per_process: int = 1) -> None:
        super().__init__(reason)  # the reason names the component itself
        self.component = component
        self.processes = processes
        self.devices_per_process = devices_per_process

    def __reduce__(self) -> tuple[Any, ...]:
        return _not_measured, (self.reason, self.component, self.processes, self.devices_per_process)


def _not_measured(reason: str, component: str, processes: int, devices_per_process: int) -> NotMeasured:
    return NotMeasured(reason, component=component, processes=processes, devices_per_process=devices_per_process)


@dataclass(frozen=True)
class Point:
    """One measurement of a component: ``processes`` processes of ``devices_per_process`` accelerators;
    seconds per step of each stage; seconds of one offload and one onload (``None``: not measured); memory per
    phase of one process on each accelerator (empty: not measured). ``measured`` is false for a point the
    scaling rule predicted between two measured ones. ``between`` is the driver's seconds per step between two
    of the component's calls (0 for a component the driver does not call every step); ``spread`` the standard
    deviation of its cycle from one step to the next (0: not measured)."""

    processes: int
    devices_per_process: int = 1
    stages: Mapping[str, float] = field(default_factory=FrozenDict)
    offload: float | None = None
    onload: float | None = None
    memory: Mapping[str, int] = field(default_factory=FrozenDict)
    placement: str | None = None
    measured: bool = True
    between: float = 0.0
    spread: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", FrozenDict(self.stages))
        object.__setattr__(self, "memory", FrozenDict(self.memory))

    @property
    def seconds(self) -> float:
        """The component's work per step: its stages one after another."""
        return sum(self.stages.values())

    @property
    def cycle(self) -> float:
        """The component's own cycle per step: its work and the driver's time between two of its calls."""
        return self.seconds + self.between

    @property
    def swap(self) -> float | None:
        """Seconds of one offload and one onload, ``None`` when either was not measured."""
        return None if self.offload is None or self.onload is None else self.offload + self.onload

    def resources(self, component: str) -> ComponentResources | None:
        """The measured memory as a ``resources:`` record, ``None`` when none was measured (or no working phase)."""
        if not self.memory or not any(p not in ("offloaded", "idle") for p in self.memory):
            return None
        return ComponentResources(component, self.memory)

    def describe(self) -> str:
        """``"4 processes"`` or ``"2 processes of 2 accelerators"``."""
        each = f" of {self.devices_per_process} accelerators" if self.devices_per_process > 1 else ""
        return plural(self.processes, "process", "processes") + each


@dataclass(frozen=True)
class ComponentProfile:
    """What one component was measured to take: its points, in (devices per process, processes) order."""

    component: str
    points: tuple[Point, ...]
    scaling: str | None = None

    def measured(self, devices_per_process: int) -> list[int]:
        """The process counts measured with ``devices_per_process`` accelerators each, ascending."""
        return [p.processes for p in self.points if p.devices_per_process == devices_per_process]

    def measured_text(self, devices_per_process: int | None = None) -> str:
        """``"2 and 4 processes"``, ``"4 processes; 2 processes of 2 accelerators"``: the points measured (of
        ``devices_per_process`` accelerators each, or all)."""
        parts = []
        for per in sorted({p.devices_per_process for p in self.points}):
            if devices_per_process is not None and per != devices_per_process:
                continue
            numbers = [str(n) for n in self.measured(per)]
            counts = f"{', '.join(numbers[:-1])} and {numbers[-1]}" if len(numbers) > 1 else numbers[0]
            each = f" of {per} accelerators" if per > 1 else ""
            parts.append(f"{counts} {'process' if counts == '1' else 'processes'}{each}")
        return "; ".join(parts)

    def at(self, processes: int, devices_per_process: int = 1) -> Point:
        """The point for ``processes`` processes of ``devices_per_process`` accelerators: a measured one, or
        with ``scaling: data-parallel`` one between two measured counts (each stage's seconds linear in
        1/processes, the memory of each phase the larger of the two); else :class:`NotMeasured`."""
        same = [p for p in self.points if p.devices_per_process == devices_per_process]
        for point in same:
            if point.processes == processes:
                return point
        below = [p for p in same if p.processes < processes]
        above = [p for p in same if p.processes > processes]
        if self.scaling == DATA_PARALLEL and below and above:
            return _between(self.component, below[-1], above[0], processes)
        return self._missing(processes, devices_per_process, same)

    def _missing(self, processes: int, devices_per_process: int, same: list[Point]) -> Point:
        wanted = plural(processes, "process", "processes") + (
            f" of {devices_per_process} accelerators" if devices_per_process > 1 else "")
        if not same:
            why = f"was measured only on {self.measured_text()}"
        else:
            why = f"was measured on {self.measured_text(devices_per_process)}"
            between = same[0].processes < processes < same[-1].processes
            if self.scaling == DATA_PARALLEL:
                why += " (scaling: data-parallel predicts between measured counts, never beyond them)"
            elif between:
                why += " (add scaling: data-parallel to predict between them)"
        raise NotMeasured(f"{self.component} {why}, not on {wanted}; profile a run with {wanted}",
                          component=self.component, processes=processes, devices_per_process=devices_per_process)


def _between(component: str, low: Point, high: Point, processes: int) -> Point:
    if set(low.stages) != set(high.stages):
        raise NotMeasured(f"{component} has stages {sorted(low.stages)} at {low.processes} processes but "
                          f"{sorted(high.stages)} at {high.processes}: no prediction between them",
                          component=component, processes=processes)
    share = (1 / processes - 1 / low.processes) / (1 / high.processes - 1 / low.processes)

    def mix(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a + (b - a) * share

    stages = {name: mix(seconds, high.stages[name]) or 0.0 for name, seconds in low.stages.items()}
    memory = {phase: max(low.memory[phase], high.memory[phase]) for phase in low.memory if phase in high.memory}
    return Point(processes, low.devices_per_process, stages, mix(low.offload, high.offload),
                 mix(low.onload, high.onload), memory, measured=False, between=mix(low.between, high.between) or 0.0,
                 spread=mix(low.spread, high.spread) or 0.0)


@dataclass(frozen=True)
class Profile:
    """A parsed profile: each profiled component, each weight sync's bytes, and the bandwidth of each
    transport in bytes per second (the defaults where the profile gives none)."""

    components: Mapping[str, ComponentProfile]
    weight_sync: Mapping[str, int] = field(default_factory=FrozenDict)
    bandwidth: Mapping[str, int] = DEFAULT_BANDWIDTH

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", FrozenDict(self.components))
        object.__setattr__(self, "weight_sync", FrozenDict(self.weight_sync))
        object.__setattr__(self, "bandwidth", FrozenDict({**DEFAULT_BANDWIDTH, **self.bandwidth}))

    def component(self, name: str) -> ComponentProfile:
        """A component's profile; :class:`NotMeasured` when the profile has none."""
        if name not in self.components:
            raise NotMeasured(f"the profile has no entry for component {name!r} (it has "
                              f"{', '.join(self.components) or 'none'}); profile a run that places it",
                              component=name)
        return self.components[name]

    def sync_bytes(self, name: str) -> int:
        """The bytes weight sync ``name`` moves per step; :class:`NotMeasured` when the profile has none."""
        if name not in self.weight_sync:
            raise NotMeasured(f"the profile gives no bytes for weight sync {name!r} (weight_sync.{name}.bytes)",
                              component=name)
        return self.weight_sync[name]

    def to_json(self) -> dict[str, Any]:
        """The version-1 JSON form: what :func:`parse_profile` reads back to an equal profile."""
        return {
            "version": VERSION,
            "components": {name: {**({"scaling": c.scaling} if c.scaling else {}),
                                  "points": [_point_json(p) for p in c.points if p.measured]}
                           for name, c in self.components.items()},
            "weight_sync": {name: {"bytes": amount} for name, amount in self.weight_sync.items()},
            "bandwidth": dict(self.bandwidth),
        }


def _point_json(point: Point) -> dict[str, Any]:
    data: dict[str, Any] = {"processes": point.processes, "devices_per_process": point.devices_per_process}
    if point.placement is not None:
        data["placement"] = point.placement
    data["stages"] = {name: {"seconds": seconds} for name, seconds in point.stages.items()}
    for key in ("offload", "onload"):
        if getattr(point, key) is not None:
            data[key] = {"seconds": getattr(point, key)}
    for key in ("between", "spread"):
        if getattr(point, key):
            data[key] = {"seconds": getattr(point, key)}
    if point.memory:
        data["memory"] = dict(point.memory)
    return data


def load_profile(*paths: str | os.PathLike[str]) -> Profile:
    """Read one or more profile files into one :class:`Profile`: their points are merged per component (two
    files measuring one component at the same process count is a ``ConfigError``)."""
    merged: Profile | None = None
    for path in paths:
        try:
            with open(path, encoding="utf-8") as file:
                data = json.load(file)
        except OSError as exc:
            raise ConfigError("--profile", f"cannot read {os.fspath(path)!r}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ConfigError("--profile", f"{os.fspath(path)!r} is not JSON: {exc}") from None
        profile = parse_profile(data, source=os.fspath(path))
        merged = profile if merged is None else merge_profiles(merged, profile, os.fspath(path))
    if merged is None:
        raise ConfigError("--profile", "names no file")
    return merged


def merge_profiles(first: Profile, second: Profile, source: str = "profile") -> Profile:
    """One profile with the points of both; ``second``'s weight-sync bytes and bandwidths win."""
    components = dict(first.components)
    for name, entry in second.components.items():
        if name not in components:
            components[name] = entry
            continue
        old = components[name]
        known = {(p.processes, p.devices_per_process) for p in old.points}
        for point in entry.points:
            if (point.processes, point.devices_per_process) in known:
                raise ConfigError(f"{source}: components.{name}.points", f"measures {point.describe()} again; "
                                  "another profile given measures it too", allowed="one measurement per point")
        if old.scaling and entry.scaling and old.scaling != entry.scaling:
            raise ConfigError(f"{source}: components.{name}.scaling", "differs from another profile's",
                              value=entry.scaling, allowed=repr(old.scaling))
        components[name] = ComponentProfile(name, _sorted((*old.points, *entry.points)),
                                            old.scaling or entry.scaling)
    return Profile(components, {**first.weight_sync, **second.weight_sync}, {**first.bandwidth, **second.bandwidth})


def _sorted(points: tuple[Point, ...]) -> tuple[Point, ...]:
    return tuple(sorted(points, key=lambda p: (p.devices_per_process, p.processes)))


def parse_profile(data: Any, source: str = "profile") -> Profile:
    """A profile's JSON (as loaded) into a :class:`Profile`; a mistake is a ``ConfigError`` whose path starts
    with ``source`` (the file name)."""
    root = mapping(data, source)
    check_keys(root, _KEYS, source)
    if root.get("version") != VERSION:
        raise ConfigError(f"{source}: version", "is not a profile version this hwplace reads",
                          value=root.get("version"), allowed=f"version: {VERSION}")
    components = {}
    for name, entry in mapping(root.get("components", {}), f"{source}: components").items():
        path = f"{source}: components.{name}"
        if not isinstance(name, str) or not LABEL.match(name):
            raise ConfigError(path, "is not a component name", value=name, allowed="a name of component_placement")
        entry = mapping(entry, path)
        check_keys(entry, _COMPONENT_KEYS, path)
        scaling = entry.get("scaling")
        if scaling is not None and scaling not in SCALINGS:
            raise ConfigError(f"{path}.scaling", "is not a scaling hwplace knows", value=scaling,
                              allowed=f"{', '.join(SCALINGS)}, or leave it out (measured counts only)")
        raw_points = entry.get("points")
        if not isinstance(raw_points, list) or not raw_points:
            raise ConfigError(f"{path}.points", "is a list of at least one measured point", value=raw_points)
        points = _sorted(tuple(_point(p, f"{path}.points[{i}]") for i, p in enumerate(raw_points)))
        seen = [(p.processes, p.devices_per_process) for p in points]
        if len(set(seen)) != len(seen):
            raise ConfigError(f"{path}.points", "measures one process count twice",
                              allowed="one point per processes and devices_per_process")
        components[name] = ComponentProfile(name, points, scaling)
    syncs = {}
    for name, entry in mapping(root.get("weight_sync", {}), f"{source}: weight_sync").items():
        path = f"{source}: weight_sync.{name}"
        entry = mapping(entry, path)
        check_keys(entry, ("bytes",), path)
        syncs[str(name)] = parse_size(entry.get("bytes"), f"{path}.bytes")
    bandwidth = {}
    for transport, amount in mapping(root.get("bandwidth", {}), f"{source}: bandwidth").items():
        path = f"{source}: bandwidth.{transport}"
        if transport not in TRANSPORTS:
            raise ConfigError(path, "is not a transport", allowed=", ".join(TRANSPORTS))
        try:
            bandwidth[transport] = parse_size(amount, path)
        except ConfigError:  # parse_size speaks of memory: this is a rate
            raise ConfigError(path, "is not an amount of bytes per second", value=amount,
                              allowed=f"{RATE}: {SIZES_ALLOWED}") from None
        if bandwidth[transport] == 0:
            raise ConfigError(path, "is zero bytes per second", value=amount, allowed=RATE)
    return Profile(components, syncs, bandwidth)


def _point(value: Any, path: str) -> Point:
    entry = mapping(value, path)
    check_keys(entry, _POINT_KEYS, path)
    processes = _count(entry.get("processes"), f"{path}.processes")
    per = _count(entry.get("devices_per_process", 1), f"{path}.devices_per_process")
    placement = entry.get("placement")
    if placement is not None and not isinstance(placement, str | int):
        raise ConfigError(f"{path}.placement", "is the placement string the point ran with", value=placement)
    stages = {}
    for name, stage in mapping(entry.get("stages"), f"{path}.stages").items():
        if not isinstance(name, str) or not LABEL.match(name):
            raise ConfigError(f"{path}.stages.{name}", "is not a stage name", value=name)
        stages[name] = _seconds(stage, f"{path}.stages.{name}")
    if not stages:
        raise ConfigError(f"{path}.stages", "is empty", allowed="STAGE: {seconds: S} entries")
    offload, onload = (_seconds(entry[k], f"{path}.{k}") if k in entry else None for k in ("offload", "onload"))
    between, spread = (_seconds(entry[k], f"{path}.{k}") if k in entry else 0.0 for k in ("between", "spread"))
    memory = parse_memory(entry["memory"], f"{path}.memory") if "memory" in entry else {}
    point = Point(processes, per, stages, offload, onload, memory, None if placement is None else str(placement),
                  between=between, spread=spread)
    if memory and point.resources("x") is None:
        raise ConfigError(f"{path}.memory", "declares no working phase", allowed="a phase other than offloaded "
                          "and idle, such as train: 50GiB")
    return point


def _count(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(path, "is a positive integer", value=value)
    return value


def _seconds(value: Any, path: str) -> float:
    entry = mapping(value, path)
    check_keys(entry, ("seconds",), path)
    seconds = entry.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) \
            or seconds < 0:
        raise ConfigError(f"{path}.seconds", "is a non-negative number of seconds", value=seconds)
    return float(seconds)

