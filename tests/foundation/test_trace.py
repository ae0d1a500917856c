"""The span recorder: nothing recorded and no file touched while off; while on, every span on disk after a call
ends, with its thread named, its arguments and the process's track first."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hwplace
from hwplace.foundation import trace
from hwplace.foundation.errors import ConfigError

TRACK = {"group": "trainer", "rank": 1, "node": 0, "devices": ["fake-accelerator 2"]}


@pytest.fixture(autouse=True)
def _stopped() -> Iterator[None]:
    trace.stop()
    yield
    trace.stop()


def lines(folder: Path) -> list[dict[str, Any]]:
    (file,) = folder.glob("*.jsonl")
    return [json.loads(line) for line in file.read_text().splitlines()]


def spans(folder: Path) -> list[dict[str, Any]]:
    return [line for line in lines(folder) if "n" in line]


def test_off_a_span_is_one_shared_no_op_and_its_notes_go_nowhere() -> None:
    assert not trace.active()
    first, second = trace.span("get", trace.WAIT), trace.span("put", trace.WAIT, channel="x")
    assert first is second
    with trace.span("offload", trace.MEMORY) as offloading:
        offloading.args.update(memory_bytes=1)
    assert trace.begin("turn", trace.TURN) is None
    trace.end(None)
    assert trace.traced("f", trace.SYNC)(lambda x: x + 1)(1) == 2
    assert trace.memory_held() == {}
    with trace.call_span("step"):
        pass


def test_on_spans_reach_the_file_when_a_call_ends_with_names_categories_arguments(tmp_path: Path) -> None:
    trace.start(str(tmp_path), TRACK)
    assert trace.active()
    with trace.call_span("step"):
        with trace.span("get_batch", trace.WAIT, channel="experience", queue="default"):
            pass
        started = trace.begin("turn", trace.TURN)
        with trace.span("offload", trace.MEMORY) as offloading:
            offloading.args["memory_bytes"] = 5
        trace.end(started)
        assert spans(tmp_path) == []  # buffered until the call ends
    found = spans(tmp_path)
    assert [(s["n"], s["c"]) for s in found] == [("get_batch", "wait"), ("offload", "memory"), ("turn", "turn"),
                                                ("step", "call")]
    assert found[0]["a"] == {"channel": "experience", "queue": "default"}
    assert found[1]["a"] == {"memory_bytes": 5}
    step, turn = found[3], found[2]
    assert step["ts"] <= found[0]["ts"]
    assert found[0]["ts"] + found[0]["d"] <= step["ts"] + step["d"]
    assert step["ts"] <= turn["ts"]
    assert turn["ts"] + turn["d"] <= step["ts"] + step["d"]
    assert all(s["d"] >= 0 and s["t"] == threading.get_native_id() for s in found)
    first = lines(tmp_path)[0]["track"]
    assert {k: first[k] for k in TRACK} == TRACK
    assert first["tid"] == threading.get_native_id()


def test_every_thread_is_named_once_before_its_spans(tmp_path: Path) -> None:
    trace.start(str(tmp_path), TRACK)

    def work() -> None:
        for _ in range(3):
            with trace.span("put", trace.WAIT):
                pass

    thread = threading.Thread(target=work, name="producer")
    thread.start()
    thread.join()
    trace.flush()
    named = [line for line in lines(tmp_path) if "thread" in line]
    assert named == [{"thread": thread.native_id, "name": "producer"}]
    assert len(spans(tmp_path)) == 3


def test_traced_functions_are_spans_and_their_exceptions_pass_through(tmp_path: Path) -> None:
    @trace.traced("weights.publish", trace.SYNC)
    def publish(fail: bool) -> int:
        if fail:
            raise ValueError("no")
        return 3

    trace.start(str(tmp_path), TRACK)
    assert publish(False) == 3
    with pytest.raises(ValueError, match="no"):
        publish(True)
    trace.stop()  # writes what is buffered
    assert [(s["n"], s["c"]) for s in spans(tmp_path)] == [("weights.publish", "sync")] * 2
    assert publish.__name__ == "publish"


def test_a_traced_function_notes_its_arguments_once_it_returned_and_a_failing_note_is_left_out(
        tmp_path: Path) -> None:
    @trace.traced("weights.publish", trace.SYNC, lambda state, strict=True: {"bytes": len(state) // int(strict)})
    def publish(state: bytes, strict: bool = True) -> int:
        return 7

    trace.start(str(tmp_path), TRACK)
    assert publish(b"abcd") == 7
    assert publish(b"abcd", strict=False) == 7  # the note divides by zero: the span has no arguments
    trace.stop()
    assert [s.get("a") for s in spans(tmp_path)] == [{"bytes": 4}, None]


def test_a_full_buffer_is_written_without_waiting_for_the_call(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "FLUSH_AT", 4)
    trace.start(str(tmp_path), TRACK)
    for _ in range(5):
        with trace.span("get", trace.WAIT):
            pass
    assert len(spans(tmp_path)) >= 4


def test_a_span_that_raises_is_recorded_and_the_call_span_still_writes(tmp_path: Path) -> None:
    trace.start(str(tmp_path), TRACK)
    with pytest.raises(KeyError, match="x"), trace.call_span("step"), trace.span("get", trace.WAIT):
        raise KeyError("x")
    assert [s["n"] for s in spans(tmp_path)] == ["get", "step"]


def test_times_are_on_the_wall_clock(tmp_path: Path) -> None:
    import time

    before = time.time_ns()
    trace.start(str(tmp_path), TRACK)
    with trace.call_span("step"):
        pass
    after = time.time_ns()
    (step,) = spans(tmp_path)
    assert before - 10**9 <= step["ts"] <= after + 10**9  # one clock across processes: within a second


def test_starting_again_ends_the_previous_recorder(tmp_path: Path) -> None:
    trace.start(str(tmp_path / "a"), TRACK)
    with trace.span("get", trace.WAIT):
        pass
    trace.start(str(tmp_path / "b"), TRACK)
    assert len(spans(tmp_path / "a")) == 1


def test_the_time_between_calls_is_an_idle_span_that_joins_them(tmp_path: Path) -> None:
    trace.start(str(tmp_path), TRACK)
    with trace.call_span("__init__"):
        pass
    with trace.call_span("step"):
        done = threading.Event()

        def concurrent() -> None:  # an async method's call, say: while it runs no time is between calls
            with trace.call_span("poll"):
                done.set()

        thread = threading.Thread(target=concurrent)
        thread.start()
        thread.join()
    with trace.call_span("step"):
        pass
    found = spans(tmp_path)
    assert [(s["n"], s["c"]) for s in found] == [
        ("__init__", "call"), ("between calls", "idle"), ("poll", "call"), ("step", "call"),
        ("between calls", "idle"), ("step", "call")]
    for before, idle, after in ((found[0], found[1], found[3]), (found[3], found[4], found[5])):
        assert idle["ts"] == before["ts"] + before["d"]
        assert idle["ts"] + idle["d"] == after["ts"]


def test_hwplace_span_is_a_job_s_own_span_a_wait_unless_told(tmp_path: Path) -> None:
    assert hwplace.span is trace.user_span
    assert trace.user_span("all_reduce") is trace.span("get", trace.WAIT)  # off: the shared no-op
    trace.start(str(tmp_path), TRACK)
    with trace.call_span("step"):
        with trace.user_span("all_reduce", op="sum"), trace.user_span("publish", trace.SYNC) as publishing:
            publishing.args["bytes"] = 8
        with trace.user_span("stash", trace.MEMORY):
            pass
    assert [(s["n"], s["c"], s.get("a")) for s in spans(tmp_path)] == [
        ("publish", "sync", {"bytes": 8}), ("all_reduce", "wait", {"op": "sum"}), ("stash", "memory", None),
        ("step", "call", None)]


@pytest.mark.parametrize(("name", "category", "words"), [
    ("forward", trace.CALL, "hwplace.span: category: is not a category a job's span may have (got 'call'); one of "
                            "'wait', 'sync', 'memory'"),
    ("turn", trace.TURN, "(got 'turn')"),
    ("x", "Wait", "(got 'Wait')"),
    ("", trace.WAIT, "hwplace.span: name: is not a name for a span (got ''); a non-empty string"),
    (None, trace.WAIT, "hwplace.span: name: is not a name for a span; a non-empty string"),
])
def test_hwplace_span_refuses_the_runtime_s_categories_and_a_nameless_span(name: Any, category: str, words: str,
                                                                            tmp_path: Path) -> None:
    for recording in (False, True):  # refused whether tracing is on or off: a mistake shows before a traced run
        with pytest.raises(ConfigError, match=re.escape(words)):
            trace.user_span(name, category)
        if not recording:
            trace.start(str(tmp_path), TRACK)
