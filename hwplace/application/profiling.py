"""Profiles (SPEC §13): what ``hwplace run --profile FILE`` writes, from the spans of the run's timeline.

``{"version": 1, "components": {name: {"processes": N, "stages": {stage: {"seconds": median, "count": n,
"total_seconds": s, "max_seconds": m}}, "memory": {phase: bytes}, "memory_source": "measured" | "declared"}}}``.
A stage is a span name of the component's workers that is neither a wait nor the time between calls: each group
call (named after its method), ``turn`` (a turn held), ``offload``, ``onload``, ``weights.publish``,
``weights.load_into``. Memory is measured where the device reports it (CUDA: torch's peak allocation during each
group call, named after the method, and what a worker holds after ``offload()``, as ``offloaded``); elsewhere it
is what ``resources:`` declares for the component. Imports the layers below.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from hwplace.config.resources import OFFLOADED, ComponentResources
from hwplace.foundation.trace import IDLE, WAIT

VERSION = 1


def build_profile(trace: Mapping[str, Any], resources: Sequence[ComponentResources] = ()) -> dict[str, Any]:
    """The profile of a merged trace (:func:`hwplace.application.timeline.merge`); ``resources`` are the job's
    declared figures, used for components whose devices report no memory."""
    tracks: Mapping[str, Mapping[str, Any]] = trace["otherData"]["hwplace"]["tracks"]
    ranks: dict[str, set[int]] = defaultdict(set)
    for track in tracks.values():
        ranks[track["group"]].add(track["rank"])
    durations: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    memory: dict[str, dict[str, int]] = defaultdict(dict)
    for event in trace["traceEvents"]:
        if event.get("ph") != "X" or event.get("cat") in (WAIT, IDLE):
            continue
        owner = tracks.get(f"{event['pid']}:{event['tid']}")
        if owner is None:
            continue
        group = owner["group"]
        durations[group][event["name"]].append(event["dur"] / 1e6)
        args = event.get("args") or {}
        phase, amount = (OFFLOADED, args.get("memory_bytes")) if event["name"] == "offload" else \
            (event["name"], args.get("peak_memory_bytes"))
        if isinstance(amount, int):
            memory[group][phase] = max(amount, memory[group].get(phase, 0))
    declared = {r.component: r.memory for r in resources}
    components: dict[str, Any] = {}
    for group in sorted(ranks):
        entry: dict[str, Any] = {"processes": len(ranks[group]), "stages": {
            stage: {"seconds": statistics.median(times), "count": len(times), "total_seconds": sum(times),
                    "max_seconds": max(times)}
            for stage, times in sorted(durations[group].items())}}
        if memory[group]:
            entry["memory"], entry["memory_source"] = dict(sorted(memory[group].items())), "measured"
        elif group in declared:
            entry["memory"], entry["memory_source"] = dict(declared[group]), "declared"
        else:
            entry["memory"] = {}
        components[group] = entry
    return {"version": VERSION, "components": components}
