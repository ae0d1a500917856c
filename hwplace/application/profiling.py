"""Profiles (SPEC §13): what ``hwplace run --profile FILE`` writes, from the spans of the run's timeline, in the
form the placement search reads (version 1; ``docs/resources.md`` states it)::

    {"version": 1,
     "components": {"trainer": {"points": [{"processes": 2, "devices_per_process": 1, "placement": "2-3",
                                            "stages": {"step": {"seconds": 0.12}},
                                            "offload": {"seconds": 0.01}, "onload": {"seconds": 0.01},
                                            "memory": {"step": 53687091200, "offloaded": 1073741824}}]}},
     "weight_sync": {"policy": {"bytes": 409600}}}

One run is one point per component: its process count and accelerators per process, the placement it ran
with. A run has as many *steps* as the most often called group method was called on one rank (the trainer's
``step``); a component's *stages* are its group calls made every step, or running through most of the run (a
producer's loop), each with its seconds per step: the time in the calls less what they waited on other
components (the waits hwplace records: channels, turns, weight versions), offloaded and onloaded, and spent on
weight sync, summed over the run on each rank and divided by the steps, on the slowest rank. What a rank waits
in a collective (the waits a job marks with ``hwplace.span``) counts: it still holds its accelerators, and a
collective step ends when its slowest rank is done. ``between`` is the driver's time per step between two
calls of a stage made every step (the mean of the ``between calls`` spans before them, the first call's left
out; the median rank). ``offload`` and ``onload`` are the median of one. Memory is measured
where the device reports it (CUDA: torch's peak allocation in each group call, its phase named after the method,
and what a worker holds after ``offload()``, as ``offloaded``); elsewhere it is what ``resources:`` declares. A
weight sync's bytes are the largest state dict it published. Imports the layers below and
:mod:`hwplace.application.trace_report`.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from hwplace.application.trace_report import Intervals, constructors, launching, length, on_another, subtract, union
from hwplace.config.resources import OFFLOADED, RESERVED_PHASES, ComponentResources
from hwplace.foundation.trace import CALL, IDLE, MEMORY, SYNC, WAIT

VERSION = 1
LONG_RUNNING = 0.5  # a method called fewer times than the steps is a stage when its calls cover this much of the run
NOT_WORK = (MEMORY, SYNC)  # with the waits on other components, what a group call's time less is its work


def build_profile(trace: Mapping[str, Any], resources: Sequence[ComponentResources] = (),
                  placements: Mapping[str, str] | None = None, node_type: str | None = None) -> dict[str, Any]:
    """The profile of a merged trace (:func:`hwplace.application.timeline.merge`). ``resources`` are the job's
    declared figures, for components whose devices report no memory; ``placements`` each component's placement
    string; devices of ``node_type`` (the node-kind backend's) are not accelerators."""
    tracks: Mapping[str, Mapping[str, Any]] = trace["otherData"]["hwplace"]["tracks"]
    events: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    devices: dict[str, int] = {}
    launches = constructors(trace["traceEvents"])
    for event in trace["traceEvents"]:
        owner = tracks.get(f"{event.get('pid')}:{event.get('tid')}")
        if event.get("ph") == "X" and owner is not None and not launching(event, launches):
            events[owner["group"], owner["rank"]].append(event)
    for owner in tracks.values():
        held = [d for d in owner.get("devices", []) if node_type is None or not d.startswith(f"{node_type} ")]
        devices[owner["group"]] = max(devices.get(owner["group"], 1), len(held))
    made = Counter((group, rank, e["name"]) for (group, rank), found in events.items() for e in found
                   if e.get("cat") == CALL)  # each rank's calls of each method
    steps = max(made.values(), default=1)  # the calls of the most often called method on one rank
    every = [(e["ts"], e["ts"] + e["dur"]) for found in events.values() for e in found if e.get("cat") != IDLE]
    run = max(end for _, end in every) - min(start for start, _ in every) if every else 0.0
    groups = sorted({group for group, _ in events})
    declared = {r.component: r.memory for r in resources}
    components = {}
    for group in groups:
        ranks = sorted(rank for g, rank in events if g == group)
        point: dict[str, Any] = {"processes": len(ranks), "devices_per_process": devices.get(group, 1)}
        if placements and group in placements:
            point["placement"] = str(placements[group])
        stages, between, spread = _stages([events[group, rank] for rank in ranks], steps, run)
        if not stages:
            continue  # no group call it makes every step: nothing the search could use
        point["stages"] = {name: {"seconds": seconds} for name, seconds in stages.items()}
        if between:
            point["between"] = {"seconds": between}
        if spread:
            point["spread"] = {"seconds": spread}
        for hook in ("offload", "onload"):
            spans = [e["dur"] / 1e6 for rank in ranks for e in events[group, rank] if e["name"] == hook]
            if spans:
                point[hook] = {"seconds": statistics.median(spans)}
        memory = _measured([e for rank in ranks for e in events[group, rank]], stages)
        if memory:
            point["memory"] = memory
        elif group in declared:
            point["memory"] = dict(declared[group])
        components[group] = {"points": [point]}
    profile: dict[str, Any] = {"version": VERSION, "components": components}
    measured = _measured_step(events, made, steps)
    if measured:
        profile["run"] = measured
    syncs: dict[str, int] = {}
    for found in events.values():
        for e in found:
            args = e.get("args") or {}
            if e["name"] == "weights.publish" and isinstance(args.get("bytes"), int):
                syncs[str(args.get("sync"))] = max(args["bytes"], syncs.get(str(args.get("sync")), 0))
    if syncs:
        profile["weight_sync"] = {name: {"bytes": amount} for name, amount in sorted(syncs.items())}
    return profile


def _measured_step(events: Mapping[tuple[str, int], Sequence[Mapping[str, Any]]],
                   made: Mapping[tuple[str, int, str], int], steps: int) -> dict[str, Any]:
    """The run's step as measured: the group call made ``steps`` times on a rank (``made``: each rank's calls of
    each method; the first such, by group and name), and its seconds per step from the first of those calls' start
    to the last one's end on any rank; empty when no call was made twice."""
    stepping = sorted({(group, name) for (group, _, name), count in made.items() if count == steps})
    if steps < 2 or not stepping:
        return {}
    group, name = stepping[0]
    found = [e for (g, _), spans in events.items() if g == group for e in spans
             if e.get("cat") == CALL and e["name"] == name]
    window = max(e["ts"] + e["dur"] for e in found) - min(e["ts"] for e in found)
    return {"call": ".".join(stepping[0]), "steps": steps, "step_seconds": window / steps / 1e6}


def _stages(workers: Sequence[Sequence[Mapping[str, Any]]], steps: int,
            run: float) -> tuple[dict[str, float], float, float]:
    """Per stage, the seconds per step on the slowest of ``workers`` (each one rank's spans); the driver's
    seconds per step between two calls of the stages made every step (the median rank); and the standard
    deviation of a step's cycle (a call and the time before the next) on the slowest rank."""
    per_rank: dict[str, list[float]] = defaultdict(list)
    deviations: dict[str, list[float]] = defaultdict(list)
    gaps: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    covered: dict[str, Intervals] = defaultdict(list)
    for spans in workers:
        away = union((e["ts"], e["ts"] + e["dur"]) for e in spans
                     if e.get("cat") in NOT_WORK or (e.get("cat") == WAIT and on_another(e)))
        idle = {e["ts"] + e["dur"]: e["dur"] for e in spans if e.get("cat") == IDLE}  # by where each ends
        work: dict[str, float] = defaultdict(float)
        called: dict[str, int] = defaultdict(int)
        waited: dict[str, float] = defaultdict(float)
        cycles: dict[str, list[float]] = defaultdict(list)  # per call but the last: its work and the time to the next
        for e in sorted((e for e in spans if e.get("cat") == CALL), key=lambda e: e["ts"]):
            interval = (e["ts"], e["ts"] + e["dur"])
            done = length(subtract([interval], away))
            work[e["name"]] += done
            if called[e["name"]]:  # the driver's time since this rank's last call, when it made one before
                gap = _before(idle, e["ts"])
                waited[e["name"]] += gap
                cycles[e["name"]][-1] += gap
            cycles[e["name"]].append(done)
            called[e["name"]] += 1
            covered[e["name"]].append(interval)
        for name, total in work.items():
            per_rank[name].append(total)
            gaps[name].append(waited[name] / max(1, called[name] - 1))
            deviations[name].append(statistics.stdev(cycles[name][:-1]) if len(cycles[name]) > 2 else 0.0)
            counts[name] = max(counts[name], called[name])
    stages, between, variance = {}, 0.0, 0.0
    for name, totals in sorted(per_rank.items()):
        if counts[name] >= steps:
            stages[name] = max(totals) / steps / 1e6
            between += statistics.median(gaps[name]) / 1e6
            variance += (deviations[name][totals.index(max(totals))] / 1e6) ** 2
        elif run > 0 and length(union(covered[name])) >= LONG_RUNNING * run:
            stages[name] = max(totals) / steps / 1e6
    return stages, between, variance ** 0.5


def _before(idle: Mapping[float, float], start: float) -> float:
    """The length of the ``between calls`` span that ends where a call starts (within a microsecond)."""
    found = idle.get(start)
    if found is None:
        found = next((d for end, d in idle.items() if abs(end - start) <= 1.0), 0.0)
    return found


def _measured(spans: Sequence[Mapping[str, Any]], stages: Mapping[str, float]) -> dict[str, int]:
    """The memory measured per phase (CUDA), when it has a working phase; else nothing."""
    memory: dict[str, int] = {}
    for e in spans:
        args = e.get("args") or {}
        phase, amount = (OFFLOADED, args.get("memory_bytes")) if e["name"] == "offload" else \
            (e["name"], args.get("peak_memory_bytes"))
        if isinstance(amount, int) and (phase == OFFLOADED or phase in stages):
            memory[phase] = max(amount, memory.get(phase, 0))
    return dict(sorted(memory.items())) if any(p not in RESERVED_PHASES for p in memory) else {}
