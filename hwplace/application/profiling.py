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
producer's loop), each with its seconds of work per step: the time in the calls less what they waited (channels,
turns, weight versions), offloaded and onloaded, and spent on weight sync, summed over the run on each rank and
divided by the steps (the median rank). ``offload`` and ``onload`` are the median of one. Memory is measured
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

from hwplace.application.trace_report import Intervals, constructors, launching, length, subtract, union
from hwplace.config.resources import OFFLOADED, RESERVED_PHASES, ComponentResources
from hwplace.foundation.trace import CALL, IDLE, MEMORY, SYNC, WAIT

VERSION = 1
LONG_RUNNING = 0.5  # a method called fewer times than the steps is a stage when its calls cover this much of the run
NOT_WORK = (WAIT, MEMORY, SYNC)  # what a group call's time less is its work


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
    counts = [n for found in events.values()
              for n in Counter(e["name"] for e in found if e.get("cat") == CALL).values()]
    steps = max(counts, default=1)  # the calls of the most often called method on one rank
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
        stages = _stages([events[group, rank] for rank in ranks], steps, run)
        if not stages:
            continue  # no group call it makes every step: nothing the search could use
        point["stages"] = {name: {"seconds": seconds} for name, seconds in stages.items()}
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
    syncs: dict[str, int] = {}
    for found in events.values():
        for e in found:
            args = e.get("args") or {}
            if e["name"] == "weights.publish" and isinstance(args.get("bytes"), int):
                syncs[str(args.get("sync"))] = max(args["bytes"], syncs.get(str(args.get("sync")), 0))
    if syncs:
        profile["weight_sync"] = {name: {"bytes": amount} for name, amount in sorted(syncs.items())}
    return profile


def _stages(workers: Sequence[Sequence[Mapping[str, Any]]], steps: int, run: float) -> dict[str, float]:
    """Per stage, the seconds of work per step: the median over ``workers`` (each one rank's spans)."""
    per_rank: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    covered: dict[str, Intervals] = defaultdict(list)
    for spans in workers:
        away = union((e["ts"], e["ts"] + e["dur"]) for e in spans if e.get("cat") in NOT_WORK)
        work: dict[str, float] = defaultdict(float)
        called: dict[str, int] = defaultdict(int)
        for e in spans:
            if e.get("cat") == CALL:
                interval = (e["ts"], e["ts"] + e["dur"])
                work[e["name"]] += length(subtract([interval], away))
                called[e["name"]] += 1
                covered[e["name"]].append(interval)
        for name, total in work.items():
            per_rank[name].append(total)
            counts[name] = max(counts[name], called[name])
    stages = {}
    for name, totals in sorted(per_rank.items()):
        if counts[name] >= steps or (run > 0 and length(union(covered[name])) >= LONG_RUNNING * run):
            stages[name] = statistics.median(totals) / steps / 1e6
    return stages


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
