"""What ``hwplace plan --profile`` prints: the predicted step of the written plan, and with ``--search`` the
best layouts of the job's components and the chosen ``component_placement:`` to paste; and after ``hwplace run
--profile``, the run's measured step against its prediction (SPEC §13).

Imports the layers below and :mod:`hwplace.application.report` (its table).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TextIO

from hwplace.application.report import table
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.sizes import format_size
from hwplace.foundation.wording import plural
from hwplace.planning.component import ComponentPlacement
from hwplace.planning.cost import Prediction, predict
from hwplace.planning.layouts import Candidate, Cell, SearchResult
from hwplace.planning.profile import NotMeasured, parse_profile

COST_MODEL = "docs/resources.md, 'The cost model'"


def seconds_text(seconds: float) -> str:
    """``"2.919 s"``; ``"12 ms"`` below a second."""
    return f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1000:.3g} ms"


def _cell_text(cell: Cell) -> str:
    span = f"{cell.first}-{cell.first + cell.size - 1}" if cell.size > 1 else str(cell.first)
    processes = "/".join(str(s.processes) for s in cell.slots)
    return f"{','.join(cell.components)} {span} ({processes}p, {seconds_text(cell.seconds)})"


def _source(candidate: Candidate) -> str:
    slots = [s for c in candidate.cells or () for s in c.slots]
    return "measured" if all(s.point.measured for s in slots) else "scaled"


def print_search(result: SearchResult, out: TextIO, *, top: int = 5, profile: str = "the profile") -> None:
    """The ``top`` fastest layouts (step, peak memory per accelerator, cells and whether every point was
    measured or some scaled between measured ones), the layouts not predicted and why, and the best plan."""
    found = [c for c in result.candidates if c.step_seconds is not None]
    out.write(f"placement search: {plural(len(result.candidates), 'layout')} of the components on "
              f"{plural(result.devices, 'accelerator')} ({result.description}), from {profile}; cost model: "
              f"{COST_MODEL}\n")
    rows = [["#", "layout", "step", "peak", "cells: accelerators (processes, seconds)", "points"]]
    for rank, candidate in enumerate(found[:top], 1):
        assert candidate.step_seconds is not None
        rows.append([str(rank), candidate.label, seconds_text(candidate.step_seconds),
                     format_size(candidate.peak) if candidate.peak is not None else "-",
                     "; ".join(map(_cell_text, candidate.cells or ())), _source(candidate)])
    table(rows, out)
    if len(found) > top:
        out.write(f"  ... {plural(len(found) - top, 'more layout')} (--top {len(found)} shows all)\n")
    missing = [c for c in result.candidates if c.step_seconds is None]
    if missing:
        out.write("not predicted:\n")
        for candidate in missing:
            out.write(f"  {candidate.label}: {candidate.reason}\n")
    best = result.best
    assert best.step_seconds is not None
    out.write(f"\nbest: {best.label}, predicted step {seconds_text(best.step_seconds)}")
    for sync in best.syncs:
        out.write(f"; weight sync {sync.name} {sync.transport} {seconds_text(sync.seconds)}")
    out.write("\npaste under cluster: (replacing its component_placement:)\n")
    out.write(result.component_placement())


def search_json(result: SearchResult) -> dict[str, Any]:
    """The search as JSON: every layout (figures in seconds and bytes), and the best one's placement."""
    def candidate(c: Candidate) -> dict[str, Any]:
        cells = [{"components": list(cell.components), "first": cell.first, "size": cell.size,
                  "seconds": cell.seconds, "peak": cell.peak,
                  "processes": {s.component: {"processes": s.processes, "devices_per_process": s.devices_per_process,
                                              "measured": s.point.measured} for s in cell.slots}}
                 for cell in c.cells or ()]
        return {"layout": [list(cell) for cell in c.layout], "step_seconds": c.step_seconds, "peak": c.peak,
                "cells": cells, "weight_sync": {s.name: {"transport": s.transport, "seconds": s.seconds}
                                                for s in c.syncs},
                "reason": c.reason}

    return {"devices": result.devices, "candidates": [candidate(c) for c in result.candidates],
            "component_placement": result.component_placement()}


def print_prediction(prediction: Prediction, out: TextIO, *, profile: str = "the profile") -> None:
    """The predicted step of the written plan: each cell's seconds and what they are made of."""
    out.write(f"predicted step (from {profile}; cost model: {COST_MODEL}): "
              f"{seconds_text(prediction.step_seconds)}\n")
    rows = [["cell", "seconds", "made of"]]
    for cell in prediction.cells:
        varies = f" (varies by {seconds_text(cell.spread)} a step)" if cell.spread else ""
        rows.append([",".join(cell.components), seconds_text(cell.seconds),
                     " + ".join(f"{what} {seconds_text(s)}" for what, s in cell.parts) + varies])
    table(rows, out)
    longest = max((cell.seconds for cell in prediction.cells), default=0.0)
    if prediction.step_seconds > longest * (1 + 1e-9):
        out.write(f"  the step is the expected longest cell of a step, as their times vary: "
                  f"{seconds_text(prediction.step_seconds)}, {seconds_text(prediction.step_seconds - longest)} more "
                  "than the longest cell's mean\n")
    if prediction.unprofiled:
        out.write(f"  not in the profile, not predicted: {', '.join(prediction.unprofiled)}\n")
    out.write("\n")


def print_measured(data: Mapping[str, Any], profile_file: str, plan: ComponentPlacement, out: TextIO) -> None:
    """After ``hwplace run --profile FILE``: the run's step as measured (the ``run`` of ``data``, the profile
    written to FILE) against the cost model's prediction of the run's plan from that profile itself."""
    run = data.get("run")
    if not run:
        out.write("  measured against predicted: no group call was made at every step (twice or more on a rank), "
                  "so the run has no step to measure\n")
        return
    measured = f"measured step {seconds_text(run['step_seconds'])} ({run['steps']} calls of {run['call']}, the " \
               "first's start to the last's end)"
    try:
        predicted = predict(plan, parse_profile(data, profile_file)).step_seconds
    except (NotMeasured, ConfigError) as exc:
        out.write(f"  {measured}; not predicted: {exc}\n")
        return
    out.write(f"  {measured}; predicted {seconds_text(predicted)} from this profile (cost model: {COST_MODEL}): "
              f"measured/predicted {run['step_seconds'] / predicted:.2f}x\n")


def prediction_json(prediction: Prediction) -> dict[str, Any]:
    return {"step_seconds": prediction.step_seconds,
            "cells": [{"components": list(c.components), "seconds": c.seconds, "spread": c.spread,
                       "parts": [list(p) for p in c.parts]} for c in prediction.cells],
            "weight_sync": {s.name: {"transport": s.transport, "seconds": s.seconds} for s in prediction.syncs},
            "peak": prediction.peak, "unprofiled": list(prediction.unprofiled)}
