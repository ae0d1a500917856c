"""Profiles: per component and stage the median duration and count of the spans that are not waits; memory per
phase as measured (CUDA peaks in the span arguments), else as ``resources:`` declares it."""

from __future__ import annotations

from pathlib import Path

import pytest
from traces import write_worker

from hwplace.application.profiling import build_profile
from hwplace.application.timeline import merge
from hwplace.config.resources import ComponentResources

GIB = 1 << 30


def test_stages_are_the_spans_that_are_not_waits_with_their_median(tmp_path: Path) -> None:
    for rank, times in enumerate(((0, 100, 300), (0, 200, 600))):
        spans = [("step", "call", times[i], times[i + 1]) for i in range(2)]
        spans += [("get_batch", "wait", 0, 10), ("turn", "turn", 20, 30), ("weights.publish", "sync", 30, 35)]
        write_worker(tmp_path, "trainer", rank, spans)
    write_worker(tmp_path, "rollout", 0, [("generate", "call", 0, 1000)])
    profile = build_profile(merge(tmp_path))
    assert profile["version"] == 1
    trainer = profile["components"]["trainer"]
    assert trainer["processes"] == 2
    assert set(trainer["stages"]) == {"step", "turn", "weights.publish"}  # no wait
    step = trainer["stages"]["step"]
    assert step["count"] == 4
    assert step["seconds"] == pytest.approx(0.2)  # median of 0.1, 0.2, 0.2, 0.4
    assert step["total_seconds"] == pytest.approx(0.9)
    assert step["max_seconds"] == pytest.approx(0.4)
    assert profile["components"]["rollout"] == {"processes": 1, "memory": {},
                                                "stages": {"generate": {"seconds": pytest.approx(1.0), "count": 1,
                                                                        "total_seconds": pytest.approx(1.0),
                                                                        "max_seconds": pytest.approx(1.0)}}}


def test_memory_measured_wins_over_declared_which_fills_in(tmp_path: Path) -> None:
    write_worker(tmp_path, "trainer", 0, [("step", "call", 0, 10, {"peak_memory_bytes": 5 * GIB}),
                                          ("step", "call", 10, 20, {"peak_memory_bytes": 7 * GIB}),
                                          ("offload", "memory", 20, 21, {"memory_bytes": GIB})])
    write_worker(tmp_path, "rollout", 0, [("generate", "call", 0, 10)])
    declared = (ComponentResources("trainer", {"train": 50 * GIB}),
                ComponentResources("rollout", {"generate": 30 * GIB, "offloaded": GIB // 2}))
    components = build_profile(merge(tmp_path), declared)["components"]
    assert components["trainer"]["memory"] == {"offloaded": GIB, "step": 7 * GIB}
    assert components["trainer"]["memory_source"] == "measured"
    assert components["rollout"]["memory"] == {"generate": 30 * GIB, "offloaded": GIB // 2}
    assert components["rollout"]["memory_source"] == "declared"
