"""Profiles: one point per component, its stages' seconds per step on the slowest rank (group calls made every step,
or running through the run, less their waits on other components, offloads, onloads and weight syncs; a
collective's wait counts), the driver's time between two steps, offload and onload, memory measured (CUDA peaks in
the span arguments, as a traced call records them) or else declared, and each weight sync's bytes."""

from __future__ import annotations

import statistics
import sys
import types
from pathlib import Path

import pytest
from traces import write_worker

from hwplace.application.profiling import build_profile
from hwplace.application.timeline import merge
from hwplace.config.resources import ComponentResources
from hwplace.foundation import trace

GIB = 1 << 30


def trainer(rank: int, waited: float) -> list[tuple]:  # type: ignore[type-arg]
    spans: list[tuple] = [("__init__", "call", -500, -100), ("attach", "call", -50, -45)]  # type: ignore[type-arg]
    for step in range(3):
        start = 100.0 * step
        spans += [("step", "call", start, start + 100),
                  ("get_batch", "wait", start, start + waited, {"channel": "grpo", "queue": "experience"}),
                  ("turn", "turn", start + waited, start + 100),
                  ("offload", "memory", start + 90, start + 90 + rank + 2)]
        if rank == 0:
            spans.append(("weights.publish", "sync", start + 95, start + 100, {"sync": "policy", "bytes": 4096}))
    return spans


def test_a_point_per_component_with_the_work_per_step_of_its_stages(tmp_path: Path) -> None:
    # rank 0: each 100 ms step waits 20, publishes 5 and offloads 2: 73 ms of work; rank 1 waits 40, offloads 3: 57
    write_worker(tmp_path, "trainer", 0, trainer(0, 20), devices=["fake-accelerator 2"])
    write_worker(tmp_path, "trainer", 1, trainer(1, 40), devices=["fake-accelerator 3"])
    # the rollout's one call runs through the run: 300 ms, 120 of them waiting: 60 ms of work per step
    write_worker(tmp_path, "rollout", 0, [("generate", "call", 0, 300), ("weights.latest", "wait", 0, 120)],
                 devices=["fake-accelerator 0", "fake-accelerator 1"])
    write_worker(tmp_path, "env", 0, [("serve", "call", 0, 300)], devices=["node 0"])
    profile = build_profile(merge(tmp_path), placements={"trainer": "2-3", "rollout": "0-1"}, node_type="node")
    assert profile["version"] == 1
    assert profile["weight_sync"] == {"policy": {"bytes": 4096}}
    # the run's step as measured: the call made every step, from the first one's start to the last one's end
    assert profile["run"] == {"call": "trainer.step", "steps": 3, "step_seconds": pytest.approx(0.1)}
    (point,) = profile["components"]["trainer"]["points"]
    assert point["processes"] == 2
    assert point["devices_per_process"] == 1
    assert point["placement"] == "2-3"
    assert list(point["stages"]) == ["step"]  # attach is called once, the constructor is no stage
    assert point["stages"]["step"]["seconds"] == pytest.approx(73 / 1000)  # the slowest rank
    assert "between" not in point  # its steps follow one another: the driver took no time between them
    assert point["offload"]["seconds"] == pytest.approx(0.0025)
    assert "onload" not in point
    assert "memory" not in point
    (point,) = profile["components"]["rollout"]["points"]
    assert point["devices_per_process"] == 2
    assert point["stages"] == {"generate": {"seconds": pytest.approx(0.06)}}
    (point,) = profile["components"]["env"]["points"]
    assert point["devices_per_process"] == 1  # a node-kind resource is no accelerator
    assert "placement" not in point


def test_a_loop_started_after_a_long_launch_is_a_stage_whatever_the_constructors_waited_in(tmp_path: Path) -> None:
    # the trainer's constructor waits 10 s in a collective while the others launch; the rollout's loop runs through
    # the 300 ms of the run all the same
    write_worker(tmp_path, "trainer", 0, [("__init__", "call", -10_100, -50), ("broadcast", "wait", -10_000, -100),
                                          *trainer(0, 20)[2:]], devices=["fake-accelerator 1"])
    write_worker(tmp_path, "rollout", 0, [("generate", "call", 0, 300), ("weights.latest", "wait", 0, 120)],
                 devices=["fake-accelerator 0"])
    profile = build_profile(merge(tmp_path))
    assert profile["components"]["rollout"]["points"][0]["stages"] == {"generate": {"seconds": pytest.approx(0.06)}}
    assert profile["components"]["trainer"]["points"][0]["stages"] == {"step": {"seconds": pytest.approx(0.073)}}


def test_memory_measured_wins_over_declared_which_fills_in(tmp_path: Path) -> None:
    write_worker(tmp_path, "trainer", 0, [("step", "call", 0, 10, {"peak_memory_bytes": 5 * GIB}),
                                          ("step", "call", 10, 20, {"peak_memory_bytes": 7 * GIB}),
                                          ("offload", "memory", 20, 21, {"memory_bytes": GIB})])
    write_worker(tmp_path, "rollout", 0, [("generate", "call", 0, 10), ("generate", "call", 10, 20)])
    write_worker(tmp_path, "reward", 0, [("score", "call", 0, 10), ("offload", "memory", 10, 11, {"memory_bytes": 1}),
                                         ("score", "call", 11, 20)])
    declared = (ComponentResources("rollout", {"generate": 30 * GIB, "offloaded": GIB // 2}),
                ComponentResources("reward", {"score": 12 * GIB}))
    components = build_profile(merge(tmp_path), declared)["components"]
    assert components["trainer"]["points"][0]["memory"] == {"offloaded": GIB, "step": 7 * GIB}
    assert components["rollout"]["points"][0]["memory"] == {"generate": 30 * GIB, "offloaded": GIB // 2}
    # measured: only what it holds offloaded, no working phase: the declared figures stand
    assert components["reward"]["points"][0]["memory"] == {"score": 12 * GIB}


def test_a_collective_wait_counts_and_the_driver_time_between_steps_is_kept(tmp_path: Path) -> None:
    # each rank: a 100 ms step every 150 ms (50 ms between calls, the driver's); in it a 10 ms get_batch (a wait on
    # the rollout: not the trainer's time), then work (5 ms of it acknowledging the batch: an answer from the
    # channel's host, no other component's, so it counts), then an all_reduce (hwplace.span: a wait on its peers,
    # which counts: the rank holds its accelerator). Rank 1 works 70 ms and waits 20 in the all_reduce; rank 0
    # works 50 and waits 40 for rank 1 there: both take 90 ms a step, the slowest rank's 70 and the collective's 20.
    for rank, work in ((0, 50.0), (1, 70.0)):
        spans: list[tuple] = []  # type: ignore[type-arg]
        for step in range(4):
            start = 150.0 * step
            spans += [("step", "call", start, start + 100),
                      ("get_batch", "wait", start, start + 10, {"on": "experience"}),
                      ("ack", "wait", start + 10, start + 15, {"channel": "grpo", "queue": "default"}),
                      ("all_reduce", "wait", start + 10 + work, start + 100, {"op": "sum"})]
            if step:
                spans.append(("between calls", "idle", start - 50, start))
        write_worker(tmp_path, "trainer", rank, spans, devices=[f"fake-accelerator {rank}"])
    (point,) = build_profile(merge(tmp_path))["components"]["trainer"]["points"]
    assert point["stages"] == {"step": {"seconds": pytest.approx(0.09)}}
    assert point["between"] == {"seconds": pytest.approx(0.05)}


def test_the_spread_of_a_step_is_measured_on_the_slowest_rank(tmp_path: Path) -> None:
    # one rank: steps of 50 and 70 ms of work in turn, 50 ms between calls: cycles of 100, 120, 100 ms (the last
    # step has no time after it)
    spans: list[tuple] = []  # type: ignore[type-arg]
    start = 0.0
    for step, work in enumerate((50.0, 70.0, 50.0, 70.0)):
        spans.append(("step", "call", start, start + work))
        if step:
            spans.append(("between calls", "idle", start - 50, start))
        start += work + 50
    write_worker(tmp_path, "trainer", 0, spans, devices=["fake-accelerator 0"])
    (point,) = build_profile(merge(tmp_path))["components"]["trainer"]["points"]
    assert point["stages"] == {"step": {"seconds": pytest.approx(0.06)}}
    assert point["spread"] == {"seconds": pytest.approx(statistics.stdev([0.1, 0.12, 0.1]))}


def test_a_run_whose_calls_are_each_made_once_has_no_measured_step(tmp_path: Path) -> None:
    write_worker(tmp_path, "rollout", 0, [("generate", "call", 0, 300)], devices=["fake-accelerator 0"])
    write_worker(tmp_path, "trainer", 0, [("train", "call", 0, 250)], devices=["fake-accelerator 1"])
    assert "run" not in build_profile(merge(tmp_path))


def test_the_step_is_measured_on_every_rank_of_the_most_called_group_call(tmp_path: Path) -> None:
    # rank 1's last step ends last (at 420 ms); rank 0's first starts first (at 10): four steps of 102.5 ms
    write_worker(tmp_path, "trainer", 0, [("step", "call", 10 + 100 * i, 100 + 100 * i) for i in range(4)]
                 + [("ack", "call", 5, 6)])
    write_worker(tmp_path, "trainer", 1, [("step", "call", 20 + 100 * i, 120 + 100 * i) for i in range(4)])
    write_worker(tmp_path, "env", 0, [("score", "call", 100 * i, 100 * i + 50) for i in range(3)])
    assert build_profile(merge(tmp_path))["run"] == {"call": "trainer.step", "steps": 4,
                                                      "step_seconds": pytest.approx(0.1025)}


class PeakingCuda:
    """``torch.cuda`` as the recorder sees it: initialized, a peak that a reset clears and a call sets, and what is
    held now."""

    def __init__(self) -> None:
        self.peak = self.held = self.resets = 0

    def is_initialized(self) -> bool:
        return True

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1
        self.peak = 0

    def max_memory_allocated(self) -> int:
        return self.peak

    def memory_allocated(self) -> int:
        return self.held


def test_a_traced_call_records_its_cuda_peak_which_the_profile_keeps_as_its_phase(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    cuda = PeakingCuda()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))  # torch, imported, with CUDA up
    trace.start(str(tmp_path), {"group": "trainer", "rank": 0, "node": 0, "devices": ["fake-accelerator 0"]})
    try:
        for peak in (3 * GIB, 5 * GIB, 4 * GIB):
            with trace.call_span("step"):
                cuda.peak, cuda.held = peak, GIB
                with trace.span("offload", trace.MEMORY) as offloading:  # as the turn client records it
                    offloading.args.update(trace.memory_held())
    finally:
        trace.stop()
    assert cuda.resets == 3  # each call's peak is its own
    merged = merge(tmp_path)
    steps = [e for e in merged["traceEvents"] if e["ph"] == "X" and e["name"] == "step"]
    assert [e.get("args") for e in steps] == [{"peak_memory_bytes": n * GIB} for n in (3, 5, 4)]
    declared = (ComponentResources("trainer", {"step": 50 * GIB}),)  # measured wins
    (point,) = build_profile(merged, declared)["components"]["trainer"]["points"]
    assert point["memory"] == {"offloaded": GIB, "step": 5 * GIB}
