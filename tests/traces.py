"""Synthetic traces for the tests of the timeline, the report and profiles: worker files written as the recorder
(:mod:`hwplace.foundation.trace`) writes them, with times given in milliseconds from an origin."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hwplace.application.timeline import merge

ORIGIN_NS = 1_700_000_000 * 10**9
MS = 10**6

Span = tuple[str, str, float, float] | tuple[str, str, float, float, dict[str, Any]]  # name, category, start, end


def write_worker(folder: Path, group: str, rank: int, spans: Sequence[Span], *, node: int = 0,
                 devices: Sequence[str] = (), pid: int | None = None) -> Path:
    """A worker's file: its track, its main thread's name, then ``spans`` (start and end in ms)."""
    pid = pid if pid is not None else 1000 + 10 * len(list(folder.glob("*.jsonl")))
    lines: list[dict[str, Any]] = [{"track": {"group": group, "rank": rank, "node": node, "devices": list(devices),
                                              "pid": pid, "host": "here", "tid": pid}},
                                   {"thread": pid, "name": "MainThread"}]
    for span in spans:
        name, category, start, end = span[:4]
        line: dict[str, Any] = {"n": name, "c": category, "ts": ORIGIN_NS + int(start * MS),
                                "d": int((end - start) * MS), "t": pid}
        if len(span) > 4:
            line["a"] = span[4]  # type: ignore[misc]
        lines.append(line)
    path = folder / f"here-{pid}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def stalled_job(folder: Path, stalled_rank: int = 1, steps: int = 6) -> dict[str, Any]:
    """Two trainer ranks (accelerators 2 and 3) and two rollout ranks (0 and 1): each trainer step is 100 ms with
    short waits for its batch (5 to 30 ms); in step 4 the rank ``stalled_rank`` stalls 200 ms in its get_batch."""
    for rank in range(2):
        spans: list[Span] = []
        for step in range(steps):
            start = step * 400.0
            wait = 5.0 + 5 * ((step + rank) % 6)
            if rank == stalled_rank and step == 3:
                wait = 200.0
            spans += [("step", "call", start, start + 100 + wait),
                      ("get_batch", "wait", start + 1, start + 1 + wait, {"channel": "experience"}),
                      ("turn", "turn", start + 1 + wait, start + 99 + wait)]
        write_worker(folder, "trainer", rank, spans, devices=[f"fake-accelerator {2 + rank}"])
        generate: list[Span] = [("generate", "call", 0.0, steps * 400.0)]
        generate += [("get", "wait", step * 400.0 + 300, step * 400.0 + 320, {"channel": "prompts"})
                     for step in range(steps)]
        write_worker(folder, "rollout", rank, generate, devices=[f"fake-accelerator {rank}"])
    return merge(folder)


def collective_stall(folder: Path, steps: int = 6, stall: float = 200.0, starve: float = 0.0) -> dict[str, Any]:
    """Two trainer ranks whose steps wait 300 ms for their batch every step (a recurring bubble, longer than the
    stall) and then meet in an all_reduce (``hwplace.span``: a wait on the peers, 5 ms when both are on time); in
    step 3 rank 1 stalls ``stall`` ms in its work before the all_reduce, so rank 0 waits 5 + ``stall`` ms in it; in
    step 4 rank 0 waits ``starve`` ms more for its batch than rank 1 (starving), so rank 1 waits that long more in
    the all_reduce."""
    for rank in range(2):
        spans: list[Span] = []
        for step in range(steps):
            start = step * 1000.0
            batch = 300.0 + 10 * (step % 3)  # 300 to 320 ms
            late = stall if step == 3 else starve if step == 4 else 0.0
            meet = start + batch + 100 + late  # when the later rank comes to the all_reduce
            batch += starve if rank == 0 and step == 4 else 0.0
            work_end = start + batch + 100 + (stall if rank == 1 and step == 3 else 0.0)
            spans += [("step", "call", start, meet + 5),
                      ("get_batch", "wait", start, start + batch, {"channel": "grpo", "queue": "experience"}),
                      ("all_reduce", "wait", work_end, meet + 5, {"op": "sum"})]
        write_worker(folder, "trainer", rank, spans, devices=[f"fake-accelerator {rank}"])
    return merge(folder)
