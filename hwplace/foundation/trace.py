"""The span recorder of the timeline (SPEC §13): ``with span(name, category):`` in a worker, cheap when off.

A process records only after :func:`start` (a worker's host calls it when ``HWPLACE_TRACE_DIR`` names a folder);
until then :func:`span` costs one check of a module flag and returns a shared no-op context. Spans are kept in
memory and appended, one JSON object a line, to ``<folder>/<host>-<pid>.jsonl``: after every group call
(:func:`call_span`), when many are buffered, and when the process exits, so a process that crashes loses at
most the spans of the call it crashed in. The driver merges the folder's files into one Chrome trace
(:mod:`hwplace.application.timeline`).

A line is either the process's track (``{"track": {...}}``: who it is, written first), a thread's name
(``{"thread": tid, "name": ...}``) or a span (``{"n": name, "c": category, "ts": ns, "d": ns, "t": tid,
"a": {...}}``); times are nanoseconds on the wall clock, measured with the monotonic clock.

Categories: ``call`` (a group call, named after the method), ``wait`` (blocked on a channel, a turn or a
weight version), ``turn`` (holding a turn), ``memory`` (offload and onload), ``sync`` (weight publish and
apply), ``idle`` (``between calls``: no group call running, from the end of the last to the start of the next,
so the driver's own time between calls shows on the worker's track too), ``restart`` (a restarted rank's new
process coming back, until it serves). :func:`user_span` is ``hwplace.span``:
the same span for a job's own code, in the categories a job may record (a collective as a ``wait``). Imports
:mod:`hwplace.foundation.errors`; torch only when it is already imported (peak memory of CUDA calls).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from hwplace.foundation.errors import ConfigError

CALL, WAIT, TURN, MEMORY, SYNC, IDLE, RESTART = "call", "wait", "turn", "memory", "sync", "idle", "restart"
CATEGORIES = (CALL, WAIT, TURN, MEMORY, SYNC, IDLE, RESTART)
BETWEEN_CALLS = "between calls"  # the idle span from the end of a worker's calls to the start of its next one
USER_CATEGORIES = (WAIT, SYNC, MEMORY)  # what a job's own spans may be: the rest is the runtime's to record
FLUSH_AT = 4096  # spans buffered before they are written, whatever the calls do

F = TypeVar("F", bound=Callable[..., Any])


class Recorder:
    """The spans of this process, buffered, and the file they go to."""

    def __init__(self, path: str, track: Mapping[str, Any]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._track: dict[str, Any] | None = {**track, "pid": os.getpid(), "host": socket.gethostname(),
                                              "tid": threading.get_native_id()}
        self._buffer: list[tuple[str, str, int, int, int, Mapping[str, Any]]] = []
        self._threads: dict[int, str | None] = {}  # by native thread id: its name, until the file has it (None)
        # wall-clock nanoseconds = monotonic nanoseconds + offset: ordered within the process, comparable across
        self.offset = time.time_ns() - time.perf_counter_ns()
        self._calls = 0  # group calls running now
        self._calls_ended: int | None = None  # when the last one ended, if none runs

    def call_started(self, now: int) -> None:
        """A group call starts: the time since the last one ended, with none running, is a ``between calls`` span."""
        with self._lock:
            ended = self._calls_ended if not self._calls else None
            self._calls += 1
            self._calls_ended = None
        if ended is not None:
            self.record(BETWEEN_CALLS, IDLE, ended, now, {})

    def call_ended(self, now: int) -> None:
        with self._lock:
            self._calls -= 1
            if not self._calls:
                self._calls_ended = now

    def record(self, name: str, category: str, start: int, end: int, args: Mapping[str, Any]) -> None:
        tid = threading.get_native_id()
        with self._lock:
            if tid not in self._threads:
                self._threads[tid] = threading.current_thread().name
            self._buffer.append((name, category, start, end, tid, args))
            full = len(self._buffer) >= FLUSH_AT
        if full:
            self.flush()

    def flush(self) -> None:
        """Append what is buffered to the file."""
        with self._lock:
            spans, self._buffer = self._buffer, []
            lines = [json.dumps({"track": self._track})] if self._track is not None else []
            self._track = None
            for tid, name in self._threads.items():
                if name is not None:
                    lines.append(json.dumps({"thread": tid, "name": name}))
                    self._threads[tid] = None
            for name, category, start, end, tid, args in spans:
                entry: dict[str, Any] = {"n": name, "c": category, "ts": start + self.offset, "d": end - start,
                                         "t": tid}
                if args:
                    entry["a"] = args
                lines.append(json.dumps(entry, default=str))
            if lines:
                with open(self.path, "a", encoding="utf-8") as file:
                    file.write("\n".join(lines) + "\n")


_active: Recorder | None = None


class _Span:
    __slots__ = ("_category", "_name", "_recorder", "_start", "args")

    def __init__(self, recorder: Recorder, name: str, category: str, args: dict[str, Any]) -> None:
        self._recorder = recorder
        self._name = name
        self._category = category
        self.args = args
        self._start = 0

    def __enter__(self) -> _Span:
        self._start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self._recorder.record(self._name, self._category, self._start, time.perf_counter_ns(), self.args)


class _Unrecorded:
    """What ``with span(...) as s`` gives when tracing is off: ``s.args`` takes notes that go nowhere."""

    @property
    def args(self) -> dict[str, Any]:
        return {}


_OFF = contextlib.nullcontext(_Unrecorded())


def span(name: str, category: str = CALL, **args: Any) -> contextlib.AbstractContextManager[Any]:
    """``with span("get", "wait", channel="prompts") as s:`` records the block on this thread's track, when tracing;
    ``s.args`` (a dict) takes more notes for the span until the block ends."""
    recorder = _active
    if recorder is None:
        return _OFF
    return _Span(recorder, name, category, args)


def user_span(name: str, category: str = WAIT, **args: Any) -> contextlib.AbstractContextManager[Any]:
    """``hwplace.span``: ``with hwplace.span("all_reduce"):`` marks a block of a worker's code on its track (a
    ``wait`` by default: a collective, blocked on its peers; or ``sync``, ``memory``). Like :func:`span`, one flag
    check while tracing is off; a name that is not a non-empty string, or another category, is a ``ConfigError``."""
    if category not in USER_CATEGORIES:
        raise ConfigError("hwplace.span: category", "is not a category a job's span may have", value=category,
                          allowed=f"one of {', '.join(map(repr, USER_CATEGORIES))} (a group call's own span, its "
                                  "turns and the time between calls are recorded by hwplace)")
    if not isinstance(name, str) or not name:
        raise ConfigError("hwplace.span: name", "is not a name for a span", value=name,
                          allowed="a non-empty string, such as 'all_reduce'")
    recorder = _active
    if recorder is None:
        return _OFF
    return _Span(recorder, name, category, args)


def traced(name: str, category: str, notes: Callable[..., Mapping[str, Any]] | None = None) -> Callable[[F], F]:
    """A decorator: every call of the function is a span ``name`` of ``category``. ``notes``, called with the
    function's arguments once it returned (only while tracing), gives the span's arguments; what it raises is
    left out."""
    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _active is None:
                return function(*args, **kwargs)
            with _Span(_active, name, category, {}) as recorded:
                result = function(*args, **kwargs)
                if notes is not None:
                    with contextlib.suppress(Exception):  # a note is never worth failing the call over
                        recorded.args.update(notes(*args, **kwargs))
                return result
        return wrapper  # type: ignore[return-value]
    return decorate


def begin(name: str, category: str) -> tuple[str, str, int] | None:
    """The start of a span whose end is elsewhere (a turn, held from ``enter`` to ``leave``); ``end`` it."""
    return None if _active is None else (name, category, time.perf_counter_ns())


def end(started: tuple[str, str, int] | None, **args: Any) -> None:
    """Record the span :func:`begin` started (nothing when it was started while tracing was off)."""
    recorder = _active
    if started is not None and recorder is not None:
        recorder.record(started[0], started[1], started[2], time.perf_counter_ns(), args)


@contextlib.contextmanager
def call_span(method: str) -> Iterator[None]:
    """A group call: a ``call`` span named after the method, with the CUDA peak memory of the call where torch
    reports it; the spans are written to the file when it ends."""
    recorder = _active
    if recorder is None:
        yield
        return
    cuda = _cuda()
    if cuda is not None:
        cuda.reset_peak_memory_stats()
    start = time.perf_counter_ns()
    recorder.call_started(start)
    args: dict[str, Any] = {}
    try:
        yield
        if cuda is not None:
            args["peak_memory_bytes"] = int(cuda.max_memory_allocated())
    finally:
        end = time.perf_counter_ns()  # one instant ends the call and starts the time between calls
        recorder.record(method, CALL, start, end, args)
        recorder.call_ended(end)
        recorder.flush()


def memory_held() -> dict[str, int]:
    """``{"memory_bytes": N}``: the CUDA memory this process holds now, where torch reports it; else ``{}``."""
    cuda = _cuda() if _active is not None else None
    return {} if cuda is None else {"memory_bytes": int(cuda.memory_allocated())}


def _cuda() -> Any:
    """``torch.cuda`` when torch is imported and CUDA is initialized in this process; never imports torch."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:  # a torch without CUDA, or half imported
        return None


def start(directory: str, track: Mapping[str, Any]) -> Recorder:
    """Record this process's spans into ``directory`` (created if missing); ``track`` says who the process is."""
    global _active
    stop()
    os.makedirs(directory, exist_ok=True)
    recorder = Recorder(os.path.join(directory, f"{socket.gethostname()}-{os.getpid()}.jsonl"), track)
    recorder.flush()  # the track line is on disk before any span
    _active = recorder
    return recorder


def stop() -> None:
    """Stop recording in this process, writing what is buffered."""
    global _active
    recorder, _active = _active, None
    if recorder is not None:
        recorder.flush()


def active() -> bool:
    """Whether this process records spans."""
    return _active is not None


def flush() -> None:
    """Write what is buffered now (the recorder does this after each call)."""
    if _active is not None:
        _active.flush()


atexit.register(flush)
