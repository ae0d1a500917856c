"""The Worker base class and hosting a worker in a process (SPEC section 6), in this process, without Ray."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hwplace
from hwplace import HwplaceError, WorkerError
from hwplace.contracts.records import WorkerContext
from hwplace.foundation import trace
from hwplace.foundation.settings import TRACE_DIR
from hwplace.runtime.hosting import RemoteFailure, find_method, run_method, run_method_async, start_worker
from hwplace.runtime.worker import Worker
from hwplace.testing import fake_cluster

SECTION = {"num_nodes": 2, "component_placement": {"train": "0-3"}}


def placements() -> list[hwplace.Placement]:
    cluster = fake_cluster(SECTION, accelerators_per_node=2)
    return hwplace.ComponentPlacement({"cluster": SECTION}, cluster).get_strategy("train").get_placement(cluster)


def context(rank: int = 3, env: dict[str, str] | None = None) -> WorkerContext:
    return WorkerContext("train", rank, 4, placements()[rank], env or {})


@pytest.fixture(autouse=True)
def _restore_worker_logger() -> Iterator[None]:
    """start_worker configures the 'hwplace.worker' logger for the process; put it back after each test."""
    logger = logging.getLogger("hwplace.worker")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    yield
    logger.handlers[:] = saved[0]
    logger.propagate, logger.level = saved[1], saved[2]


class Adder(Worker):
    limit = 10  # a public attribute that is not a method

    def __init__(self, offset: int, *, scale: int = 1) -> None:  # no super().__init__(): the context still works
        self.offset = offset
        self.scale = scale
        self.seen_in_init = (self.rank, self.world_size, self.group_name, self.node_rank, self.placement.rank)
        self.hidden_called = False

    def add(self, x: int, y: int = 0) -> int:
        return (x + y + self.offset) * self.scale + self.rank

    def fail(self, x: int) -> None:
        raise ValueError(f"cannot take {x}")

    def leave(self) -> None:
        raise SystemExit(4)

    def _hidden(self) -> None:
        self.hidden_called = True

    async def add_later(self, x: int, *, extra: int = 0) -> int:
        await asyncio.sleep(0)
        return x + self.rank + extra

    async def fail_later(self) -> None:
        await asyncio.sleep(0)
        raise KeyError("async missing")


class Broken(Worker):
    def __init__(self) -> None:
        raise ValueError("bad config 7")


class Exits(Worker):
    def __init__(self) -> None:
        raise SystemExit(3)


class TwoArgError(Exception):
    """Pickles, but cannot be rebuilt: unpickling calls __init__ with one argument."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a} {b}")


def started(cls: type[Worker] = Adder, *args: Any, rank: int = 3, **kwargs: Any) -> Any:
    result = start_worker(lambda: cls, context(rank), args or (1,), kwargs)
    assert isinstance(result, cls), result
    return result


def failure_of(result: object) -> RemoteFailure:
    assert isinstance(result, RemoteFailure), result
    return result


# -- Worker outside a group --------------------------------------------------------------------------


@pytest.mark.parametrize("use", [
    lambda w: w.rank, lambda w: w.world_size, lambda w: w.placement, lambda w: w.group_name, lambda w: w.node_rank,
    lambda w: w.logger, lambda w: w.log_info("x"),
])
def test_context_outside_a_group_says_how_to_start_one(use: Any) -> None:
    worker = Broken.__new__(Broken)
    with pytest.raises(HwplaceError, match=r"this Broken is not running in a worker group; start it with "
                                           r"Broken\.create_group\(\.\.\.\)\.launch\(\.\.\.\)"):
        use(worker)


def test_create_group_keeps_the_arguments() -> None:
    launcher = Adder.create_group(5, scale=2)
    assert (launcher.worker_class, launcher.args, launcher.kwargs) == (Adder, (5,), {"scale": 2})


# -- start_worker ------------------------------------------------------------------------------------


def test_start_worker_constructs_with_context_in_init() -> None:
    worker = started(Adder, 5, scale=2)
    assert worker.seen_in_init == (3, 4, "train", 1, 3)
    assert (worker.offset, worker.scale) == (5, 2)
    assert worker.placement == placements()[3]


def test_start_worker_sets_env_before_loading_the_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLACE_TEST_VAR", "driver value")  # so that monkeypatch restores it afterwards
    monkeypatch.setenv("RANK", "driver")
    seen: dict[str, str] = {}

    def load() -> type[Worker]:
        seen.update(var=os.environ["HWPLACE_TEST_VAR"], rank=os.environ["RANK"])
        return Adder

    result = start_worker(load, context(env={"HWPLACE_TEST_VAR": "worker value", "RANK": "3"}), (1,), {})
    assert isinstance(result, Adder)
    assert seen == {"var": "worker value", "rank": "3"}


def test_start_worker_sets_the_log_level_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLACE_LOG_LEVEL", "info")
    start_worker(lambda: Adder, context(env={"HWPLACE_LOG_LEVEL": "debug"}), (1,), {})
    assert logging.getLogger("hwplace.worker").level == logging.DEBUG


def test_a_bad_log_level_comes_back_as_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLACE_LOG_LEVEL", "info")
    failure = failure_of(start_worker(lambda: Adder, context(env={"HWPLACE_LOG_LEVEL": "chatty"}), (1,), {}))
    assert failure.summary == "ValueError: Unknown level: 'CHATTY'"
    assert "start_worker" not in failure.traceback.splitlines()[1]  # hwplace's own frame is left out


def test_constructor_error_comes_back_with_the_users_traceback() -> None:
    failure = failure_of(start_worker(lambda: Broken, context(), (), {}))
    assert failure.summary == "ValueError: bad config 7"
    assert __file__ in failure.traceback
    assert 'raise ValueError("bad config 7")' in failure.traceback
    assert failure.traceback.rstrip().endswith("ValueError: bad config 7")
    assert isinstance(failure.exception(), ValueError)


def test_constructor_calling_exit_comes_back_as_a_failure() -> None:
    failure = failure_of(start_worker(lambda: Exits, context(), (), {}))
    assert failure.summary == "SystemExit: 3"
    assert "raise SystemExit(3)" in failure.traceback


def test_a_restarted_rank_s_start_is_a_restart_span_with_its_attempt_and_cause_even_when_it_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACE_DIR, str(tmp_path))  # start_worker sets it from the context: restored afterwards
    env = {TRACE_DIR: str(tmp_path)}
    restarted = WorkerContext("train", 3, 4, placements()[3], env, attempt=2, cause="it was killed")
    try:
        assert isinstance(start_worker(lambda: Adder, context(env=env), (1,), {}), Adder)  # a first process: none
        assert isinstance(start_worker(lambda: Adder, restarted, (1,), {}), Adder)  # no on_restart: one all the same
        failed = failure_of(start_worker(lambda: Broken, restarted, (), {}))
    finally:
        trace.stop()
    (file,) = tmp_path.glob("*.jsonl")
    spans = [line for line in map(json.loads, file.read_text().splitlines()) if "n" in line]
    restarts = [span for span in spans if span["n"] == "restart"]
    assert [(span["c"], span["a"]) for span in restarts] == [
        ("restart", {"attempt": 2, "cause": "it was killed"}),
        ("restart", {"attempt": 2, "cause": "it was killed", "failed": failed.summary})]
    constructors = [span for span in spans if span["n"] == "__init__"]
    assert len(constructors) == 3
    for restart, constructor in zip(restarts, constructors[1:], strict=True):  # each restart covers its constructor
        assert restart["ts"] <= constructor["ts"]
        assert constructor["ts"] + constructor["d"] <= restart["ts"] + restart["d"]


def test_wrong_constructor_arguments_come_back_as_a_failure() -> None:
    failure = failure_of(start_worker(lambda: Adder, context(), (), {}))
    assert failure.summary.startswith("TypeError: ")
    assert "offset" in failure.summary


@pytest.mark.parametrize(("loaded", "shown"), [(dict, "<class 'dict'>"), (42, "42")])
def test_loader_returning_no_worker_class_is_a_failure(loaded: Any, shown: str) -> None:
    failure = failure_of(start_worker(lambda: loaded, context(), (), {}))
    assert failure.summary == f"TypeError: {shown} is not a subclass of hwplace.Worker"


def test_loader_error_comes_back_as_a_failure() -> None:
    def load() -> type[Worker]:
        import hwplace_no_such_module  # type: ignore[import-not-found]  # noqa: F401

        return Adder

    failure = failure_of(start_worker(load, context(), (), {}))
    assert failure.summary.startswith("ModuleNotFoundError: No module named 'hwplace_no_such_module'")
    assert "in load" in failure.traceback


# -- logging -----------------------------------------------------------------------------------------


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_log_helpers_put_group_rank_and_node_in_front() -> None:
    worker = started()
    logger = logging.getLogger("hwplace.worker.train")
    handler = ListHandler()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        worker.log_debug("step %d", 1)
        worker.log_info("loss %.1f", 0.5)
        worker.log_warning("slow: %d s", 3)
        worker.log_error("failed: %s", "x")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [(r.levelname, r.getMessage()) for r in handler.records] == [
        ("DEBUG", "[train rank 3 node 1] step 1"),
        ("INFO", "[train rank 3 node 1] loss 0.5"),
        ("WARNING", "[train rank 3 node 1] slow: 3 s"),
        ("ERROR", "[train rank 3 node 1] failed: x"),
    ]
    assert worker.logger.logger is logger


def test_log_helpers_write_to_stderr_in_a_worker(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("hwplace.worker")
    logger.handlers.clear()  # as in a fresh worker process
    worker = started(rank=0)
    worker.log_info("hello")
    worker.log_debug("not shown at the default level")
    assert capsys.readouterr().err == "INFO [train rank 0 node 0] hello\n"  # once: not passed on to the root logger


# -- find_method, run_method and run_method_async ----------------------------------------------------


def test_find_method_gives_the_bound_method() -> None:
    worker = started()
    method = find_method(worker, "add")
    assert getattr(method, "__self__", None) is worker
    assert method(1) == (1 + 1) * 1 + 3


def test_find_method_refuses_private_names() -> None:
    worker = started()
    with pytest.raises(AttributeError, match="'_hidden' is private; groups call public methods only"):
        find_method(worker, "_hidden")
    with pytest.raises(AttributeError, match="'__init__' is private"):
        find_method(worker, "__init__")


def test_find_method_refuses_attributes_that_are_not_methods() -> None:
    with pytest.raises(TypeError, match=r"Adder\.limit is not a method"):
        find_method(started(), "limit")


def test_run_method_returns_the_result() -> None:
    assert run_method(started(Adder, 5, scale=2), "add", (1,), {"y": 2}) == (1 + 2 + 5) * 2 + 3


def test_run_method_error_traceback_starts_at_the_users_method() -> None:
    failure = failure_of(run_method(started(), "fail", (9,), {}))
    assert failure.summary == "ValueError: cannot take 9"
    frames = [line for line in failure.traceback.splitlines() if line.startswith("  File ")]
    assert len(frames) == 1
    assert __file__ in frames[0]
    assert frames[0].endswith("in fail")
    assert "run_method" not in failure.traceback


def test_run_method_reports_exit_instead_of_exiting() -> None:
    assert failure_of(run_method(started(), "leave", (), {})).summary == "SystemExit: 4"


def test_run_method_refuses_private_methods() -> None:
    worker = started()
    failure = failure_of(run_method(worker, "_hidden", (), {}))
    assert failure.summary == "AttributeError: '_hidden' is private; groups call public methods only"
    assert worker.hidden_called is False


def test_run_method_on_an_unknown_method_is_a_failure() -> None:
    failure = failure_of(run_method(started(), "nope", (), {}))
    assert failure.summary.startswith("AttributeError: ")
    assert "nope" in failure.summary


def test_run_method_async_returns_the_result() -> None:
    assert asyncio.run(run_method_async(started(), "add_later", (4,), {})) == 7
    assert asyncio.run(run_method_async(started(), "add_later", (4,), {"extra": 10})) == 17


def test_run_method_async_error_comes_back_as_a_failure() -> None:
    failure = failure_of(asyncio.run(run_method_async(started(), "fail_later", (), {})))
    assert failure.summary == "KeyError: 'async missing'"
    assert "in fail_later" in failure.traceback
    assert "run_method_async" not in failure.traceback


def test_run_method_async_refuses_private_methods() -> None:
    failure = failure_of(asyncio.run(run_method_async(started(), "_hidden", (), {})))
    assert failure.summary.startswith("AttributeError: '_hidden' is private")


# -- RemoteFailure -----------------------------------------------------------------------------------


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_picklable_exception_comes_back_as_itself() -> None:
    failure = RemoteFailure.capture(raised(ValueError("bad", 3)))
    original = failure.exception()
    assert type(original) is ValueError
    assert original.args == ("bad", 3)
    assert failure.summary == "ValueError: ('bad', 3)"


def test_unpicklable_exception_gives_none() -> None:
    class Local(Exception):
        pass

    failure = RemoteFailure.capture(raised(Local("only here")))
    assert failure.pickled is None
    assert failure.exception() is None
    assert failure.summary == "Local: only here"
    assert "Local: only here" in failure.traceback


def test_exception_that_cannot_be_rebuilt_gives_none() -> None:
    failure = RemoteFailure.capture(raised(TwoArgError("a", "b")))
    assert failure.pickled is not None
    assert failure.exception() is None


def test_pickled_value_that_is_not_an_exception_gives_none() -> None:
    assert RemoteFailure("X: y", "tb", pickle.dumps(42)).exception() is None


def test_capture_never_skips_the_frame_that_raised() -> None:
    failure = RemoteFailure.capture(raised(ValueError("here")), skip=10)
    assert "in raised" in failure.traceback


def test_error_carries_the_failure_and_its_cause() -> None:
    failure = RemoteFailure.capture(raised(ValueError("bad")))
    error = failure.error("method 'run'", group="train", rank=2, node_rank=1)
    assert isinstance(error, WorkerError)
    assert (error.group, error.rank, error.node_rank) == ("train", 2, 1)
    assert error.remote_traceback == failure.traceback
    assert str(error).startswith("group 'train' rank 2 on node 1: method 'run' raised ValueError: bad\n\n"
                                 "Remote traceback:\n")
    assert type(error.__cause__) is ValueError
    assert error.__cause__.args == ("bad",)


def test_error_without_the_original_has_no_cause() -> None:
    error = RemoteFailure("Local: x", "tb").error("constructor", group="g", rank=0, node_rank=0)
    assert error.__cause__ is None
    assert error.problem == "constructor raised Local: x"


# -- WorkerError -------------------------------------------------------------------------------------


def test_worker_error_message_and_attributes() -> None:
    error = WorkerError("boom", group="g", rank=1, node_rank=0, remote_traceback="Traceback...\nValueError: x\n\n")
    assert (error.problem, error.group, error.rank, error.node_rank) == ("boom", "g", 1, 0)
    assert str(error) == "group 'g' rank 1 on node 0: boom\n\nRemote traceback:\nTraceback...\nValueError: x"
    assert isinstance(error, HwplaceError)
    assert isinstance(error, RuntimeError)


def test_worker_error_without_a_location_is_its_problem() -> None:
    error = WorkerError("process died")
    assert str(error) == "process died"
    assert (error.group, error.rank, error.node_rank, error.remote_traceback) == (None, None, None, None)


@pytest.mark.parametrize("kwargs", [
    {"group": "g", "rank": 3, "node_rank": 2, "remote_traceback": "Traceback:\n  x\n"},
    {"group": None, "rank": 0, "node_rank": None, "remote_traceback": None},
])
def test_worker_error_pickles_with_all_attributes(kwargs: dict[str, Any]) -> None:
    error = WorkerError("boom", **kwargs)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is WorkerError
    assert copy.problem == "boom"
    assert {name: getattr(copy, name) for name in kwargs} == kwargs
    assert str(copy) == str(error)
