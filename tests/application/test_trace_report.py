"""``hwplace report``: each device's idle share per stage and the longest waits, on synthetic traces whose
answers are worked out by hand; the interval arithmetic under them."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from traces import collective_stall, stalled_job, write_worker

import hwplace
from hwplace.application.cli import main
from hwplace.application.timeline import merge
from hwplace.application.trace_report import TraceSummary, length, overlap, print_report, subtract, union
from hwplace.testing import process_cluster


def test_union_subtract_overlap() -> None:
    assert union([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 6)]
    assert union([]) == []
    assert subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert subtract([(0, 10), (20, 30)], [(8, 22)]) == [(0, 8), (22, 30)]
    assert subtract([(0, 10)], [(0, 10)]) == []
    assert subtract([(0, 10)], []) == [(0, 10)]
    assert overlap([(0, 10), (20, 30)], [(5, 25)]) == 10
    assert length([(0, 2), (5, 6)]) == 3


def test_an_injected_200_ms_stall_in_one_rank_is_the_top_wait(tmp_path: Path) -> None:
    out = io.StringIO()
    summary = print_report(stalled_job(tmp_path, stalled_rank=1), out, top=3)
    text = out.getvalue()
    waits = text.split("longest waits (top 3)\n")[1].splitlines()
    assert waits[0].split()[:5] == ["200.0", "ms", "trainer", "rank", "1"], text
    assert "get_batch" in waits[0]
    assert "channel 'experience'" in waits[0]
    assert len(waits) == 3
    assert all("200.0 ms" not in line for line in waits[1:])
    assert summary.waits[0][0] == pytest.approx(200_000)
    totals = summary.wait_totals()
    assert totals[0][:2] == ("trainer rank 1", "get_batch 'experience'")  # the stall, and its rank's others
    assert [row[3] for row in totals] == [6, 6, 6, 6]
    assert totals[0][4] == pytest.approx(200_000)


def test_a_stall_before_a_collective_is_the_top_wait_charged_to_the_rank_that_stalled(tmp_path: Path) -> None:
    out = io.StringIO()
    summary = print_report(collective_stall(tmp_path), out, top=3)
    # the longest single waits are the batches' 320 ms, every step: a bubble that recurs, not what held the run up
    assert summary.waits[0][3] == "get_batch"
    assert summary.waits[0][0] == pytest.approx(320_000)
    top = summary.holds()[0]
    assert (top.name, summary.worker(top.culprit or ""), [summary.worker(k) for k in top.waiters]) == \
        ("all_reduce", "trainer rank 1", ["trainer rank 0"])
    assert top.longest == pytest.approx(205_000)  # rank 0 waited the stall and the collective's own 5 ms
    assert top.usual == pytest.approx(5_000)
    assert top.excess == pytest.approx(200_000)
    assert all(hold.excess <= 20_000 for hold in summary.holds()[1:])
    text = out.getvalue()
    first = text.split("they waited for (top 3)\n")[1].splitlines()[0]
    assert first.split()[:2] == ["200.0", "ms"], text
    assert "trainer rank 1 held up trainer rank 0 in all_reduce at 3.400 s (waited 205.0 ms, usually 5.0 ms)" \
        in first, first


def test_a_rank_late_to_a_collective_for_want_of_its_input_is_charged_nothing_more(tmp_path: Path) -> None:
    """Rank 0 waits 400 ms longer for its batch in step 4, so rank 1 waits 400 ms longer in the all_reduce: one
    bubble, listed once, as rank 0's wait for its batch (the rollout was late), not also as rank 0 holding up rank
    1. The stall of step 3 is still charged to rank 1."""
    summary = TraceSummary(collective_stall(tmp_path, stall=200.0, starve=400.0))
    first, second, *rest = summary.holds()
    assert (first.name, first.culprit, [summary.worker(k) for k in first.waiters]) == \
        ("get_batch", None, ["trainer rank 0"])
    assert first.excess == pytest.approx(400_000 + 300_000 + 10_000 * (4 % 3) - first.usual)
    assert (second.name, summary.worker(second.culprit or "")) == ("all_reduce", "trainer rank 1")
    assert second.excess == pytest.approx(200_000)
    assert all(hold.excess <= 20_000 for hold in rest)


def test_a_wait_on_a_channel_is_charged_to_its_waiter(tmp_path: Path) -> None:
    summary = TraceSummary(stalled_job(tmp_path, stalled_rank=1))
    top = summary.holds()[0]
    assert (top.name, top.culprit, [summary.worker(k) for k in top.waiters]) == \
        ("get_batch", None, ["trainer rank 1"])
    assert top.excess == pytest.approx(200_000 - top.usual)


def test_idle_share_per_stage_by_hand(tmp_path: Path) -> None:
    # accelerator 0: the trainer computes 20-100 of its step 0-100; the rollout 100-200 of its generate 100-200
    write_worker(tmp_path, "trainer", 0, [("step", "call", 0, 100), ("get_batch", "wait", 0, 20)],
                 devices=["fake-accelerator 0"])
    write_worker(tmp_path, "rollout", 0, [("generate", "call", 100, 200), ("turn", "turn", 100, 200)],
                 devices=["fake-accelerator 0"])
    # accelerator 1: the other rollout rank waits for a turn half its generate
    write_worker(tmp_path, "rollout", 1, [("generate", "call", 100, 200), ("turn.wait", "wait", 100, 150)],
                 devices=["fake-accelerator 1"])
    write_worker(tmp_path, "env", 0, [("serve", "call", 0, 200)], devices=["node 0"])
    summary = TraceSummary(merge(tmp_path), node_type="node")
    assert list(summary.devices) == [(0, "fake-accelerator 0"), (0, "fake-accelerator 1")]  # no node-kind one
    shares = {stage: round(idle, 6) for stage, (_, idle) in summary.idle_shares((0, "fake-accelerator 0")).items()}
    assert shares == {"whole run": 0.1, "trainer.step": 0.2, "rollout.generate": 0.0, "env.serve": 0.1}
    shares = {stage: round(idle, 6) for stage, (_, idle) in summary.idle_shares((0, "fake-accelerator 1")).items()}
    assert shares == {"whole run": 0.75, "trainer.step": 1.0, "rollout.generate": 0.5, "env.serve": 0.75}
    assert summary.coverage() == {"env rank 0": 1.0, "rollout rank 0": 1.0, "rollout rank 1": 1.0,
                                  "trainer rank 0": 1.0}


def test_constructors_are_no_stage_and_gaps_between_calls_are_uncovered(tmp_path: Path) -> None:
    write_worker(tmp_path, "trainer", 0, [("__init__", "call", 0, 1000), ("step", "call", 2000, 2090),
                                          ("step", "call", 2100, 2190), ("step", "call", 2200, 2300)],
                 devices=["fake-accelerator 0"])
    summary = TraceSummary(merge(tmp_path))
    assert list(summary.stages) == ["whole run", "trainer.step"]
    assert summary.window == [(2_000_000, 2_300_000)]  # µs, from the first call after the constructor
    assert summary.coverage() == {"trainer rank 0": pytest.approx(280 / 300)}


def test_what_a_constructor_waits_in_is_launching_not_the_run(tmp_path: Path) -> None:
    # a constructor's collective (hwplace.span("broadcast") in __init__) is part of the launch, as its constructor is
    write_worker(tmp_path, "trainer", 0, [("__init__", "call", 0, 1000), ("broadcast", "wait", 100, 900),
                                          ("step", "call", 2000, 2100), ("all_reduce", "wait", 2050, 2060)],
                 devices=["fake-accelerator 0"])
    summary = TraceSummary(merge(tmp_path))
    assert summary.window == [(2_000_000, 2_100_000)]
    assert [wait[3] for wait in summary.waits] == ["all_reduce"]


def test_the_command_reads_the_file_and_names_what_is_wrong_with_it(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    trace_file.write_text(json.dumps(stalled_job(tmp_path)))
    out, err = io.StringIO(), io.StringIO()
    assert main(["report", str(trace_file), "--top", "2"], out, err) == 0
    text = out.getvalue()
    assert text.startswith("trace: 4 workers on 1 node; the whole run")
    assert "node 0 fake-accelerator 2  (trainer rank 0)" in text
    assert "trainer.step" in text
    assert "longest waits (top 2)" in text
    (tmp_path / "other.json").write_text('{"traceEvents": []}')
    for name, problem in (("missing.json", "cannot be read"), ("other.json", "is not a trace hwplace wrote")):
        err = io.StringIO()
        assert main(["report", str(tmp_path / name)], io.StringIO(), err) == 2
        assert problem in err.getvalue()
    err = io.StringIO()
    assert main(["report", str(trace_file), "--top", "0"], io.StringIO(), err) == 2
    assert "--top: must be at least 1" in err.getvalue()


def test_the_report_leaves_out_stages_shorter_than_a_hundredth_of_the_run(tmp_path: Path) -> None:
    write_worker(tmp_path, "trainer", 0, [("attach", "call", 0, 1), ("step", "call", 1, 200)],
                 devices=["fake-accelerator 0"])
    out = io.StringIO()
    summary = print_report(merge(tmp_path), out)
    assert "trainer.attach" in summary.stages
    assert "trainer.step" in out.getvalue()
    assert "trainer.attach" not in out.getvalue()


# -- a run: two ranks meet in a collective every step (a barrier on a channel, marked with hwplace.span); one stalls --

STALL_STEP, STALL_SECONDS, STEPS = 3, 1.5, 6


class Meeting(hwplace.Worker):
    def step(self, meet: hwplace.Channel, number: int) -> int:
        if self.rank == 1 and number == STALL_STEP:
            time.sleep(STALL_SECONDS)  # its work, late: rank 0 waits for it in the collective
        with hwplace.span("all_reduce", op="sum"):  # a wait on its peers: every rank's arrival, then go on
            for peer in range(self.world_size):
                if peer != self.rank:
                    meet.put(number, queue_name=f"to-{peer}")
            for _ in range(self.world_size - 1):
                meet.get(queue_name=f"to-{self.rank}", timeout=60)
        return number


def meeting_job(job: hwplace.Job) -> dict[str, Any]:
    meet = hwplace.Channel.create(f"meet-{time.monotonic_ns()}")
    ranks = job.launch(Meeting, "trainer")
    for number in range(STEPS):
        ranks.step(meet, number).wait(timeout=60)
    return {}


@pytest.mark.time_limit(180)
def test_a_rank_that_stalls_in_a_run_is_charged_the_top_wait(tmp_path: Path) -> None:
    config, trace_file = tmp_path / "job.yaml", tmp_path / "trace.json"
    config.write_text(yaml.safe_dump({"job": {"entrypoint": "test_trace_report:meeting_job"}, "cluster": {
        "num_nodes": 1, "executor": "processes", "component_placement": {"trainer": "0-1"}}}))
    with process_cluster(1, 2):
        code = main(["run", str(config), "--trace", str(trace_file)], io.StringIO(), err := io.StringIO())
    assert code == 0, err.getvalue()
    out = io.StringIO()
    assert main(["report", str(trace_file), "--top", "3"], out, io.StringIO()) == 0
    summary = TraceSummary(json.loads(trace_file.read_text()))
    top = summary.holds()[0]
    assert (top.name, summary.worker(top.culprit or ""), [summary.worker(k) for k in top.waiters]) == \
        ("all_reduce", "trainer rank 1", ["trainer rank 0"]), out.getvalue()
    assert "trainer rank 1 held up trainer rank 0 in all_reduce" in out.getvalue().split("top waits")[1]
