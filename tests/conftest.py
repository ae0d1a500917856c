"""Shared fixtures: a fresh plugin manager, vendor distributions installed into a temporary path, a counter of
function calls (work done, where a test would otherwise time something), and the ``time_limit`` marker."""

from __future__ import annotations

import contextlib
import importlib
import sys
import textwrap
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from limits import alarm

from hwplace.plugin import manager as plugin_manager
from hwplace.testing import Session, swapped_session

pytest_plugins = ("runtime_clusters",)  # the two-executor cluster fixture of the runtime's tests

FakeDistribution = Callable[..., Path]


# Hypothesis fails an example that runs over 200 ms by default: a wall-clock assertion, which no test makes (a
# loaded machine stretches any example past it). The time_limit marker and pytest-timeout bound a test instead.
settings.register_profile("hwplace", deadline=None)
settings.load_profile("hwplace")


TIME_LIMIT_GRACE = 30
"""Seconds past a ``time_limit`` after which pytest-timeout's thread ends the run: SIGALRM cannot interrupt a
test blocked in C code (a ``ray.get``), the thread can."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "time_limit(seconds): the test fails with TimeoutError after that many "
                                       "seconds rather than hang (SIGALRM; mutmut's own timeout counts CPU time); "
                                       f"if SIGALRM cannot reach it, pytest-timeout ends the run {TIME_LIMIT_GRACE} "
                                       "s later")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("time_limit")
        if marker is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(int(marker.args[0]) + TIME_LIMIT_GRACE, method="thread"))


@dataclass
class CallCount:
    """The function calls (Python and C) made inside a :func:`count_calls` block; ``of[function]``: the calls of
    each Python function it was asked to watch."""

    count: int = 0
    of: dict[Callable[..., Any], int] = field(default_factory=dict)


@pytest.fixture
def count_calls() -> Callable[..., contextlib.AbstractContextManager[CallCount]]:
    """``with count_calls() as calls: ...`` counts the calls made in the block: the work done, which a loaded
    machine does not stretch as it stretches wall-clock time. ``count_calls(f, g)`` also counts the calls of
    ``f`` and of ``g`` in ``calls.of``, by their code, whatever name a caller imported them under (this thread
    only)."""

    @contextlib.contextmanager
    def counting(*functions: Callable[..., Any]) -> Iterator[CallCount]:
        calls = CallCount(of=dict.fromkeys(functions, 0))
        watched = {function.__code__: function for function in functions}

        def count(frame: Any, event: str, arg: Any) -> None:
            if event in ("call", "c_call"):
                calls.count += 1
            if event == "call" and frame.f_code in watched:
                calls.of[watched[frame.f_code]] += 1

        sys.setprofile(count)
        try:
            yield calls
        finally:
            sys.setprofile(None)

    return counting


@pytest.fixture(autouse=True)
def _time_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    marker = request.node.get_closest_marker("time_limit")
    if marker is None:
        yield
        return
    seconds = int(marker.args[0])

    def expired() -> TimeoutError:  # with where every other thread was: the cause of a hang is often there
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        stacks = "".join(f"\n--- thread {names.get(ident, ident)}\n{''.join(traceback.format_stack(frame))}"
                         for ident, frame in sys._current_frames().items() if ident != threading.get_ident())
        return TimeoutError(f"the test took over {seconds} s; the other threads:{stacks}")

    with alarm(seconds, expired):
        yield


@pytest.fixture
def fresh_manager() -> Iterator[Callable[[], plugin_manager.PluginManager]]:
    """Returns a function that builds a new process-wide plugin manager from the current environment, in a session
    of its own (``hwplace.testing.swapped_session``) until the test ends."""
    with contextlib.ExitStack() as sessions:

        def make() -> plugin_manager.PluginManager:
            manager = plugin_manager.PluginManager()
            sessions.enter_context(swapped_session(Session(plugin_manager=manager)))
            return manager

        yield make


@pytest.fixture
def vendor_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDistribution]:
    """Installs a tiny distribution (dist-info with an ``hwplace`` entry point, plus its module) on sys.path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    modules: list[str] = []

    def install(dist: str, module: str, source: str, entry_point: str | None = None) -> Path:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[hwplace]\n{entry_point or module} = {module}\n")
        modules.append(module)
        importlib.invalidate_caches()
        return info

    yield install
    for module in modules:
        sys.modules.pop(module, None)
