"""Shared fixtures: a fresh plugin manager, vendor distributions installed into a temporary path, and the
``time_limit`` marker."""

from __future__ import annotations

import importlib
import signal
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hwplace.plugin import manager as plugin_manager

FakeDistribution = Callable[..., Path]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "time_limit(seconds): the test fails with TimeoutError after that many "
                                       "seconds rather than hang (SIGALRM; mutmut's own timeout counts CPU time)")


@pytest.fixture(autouse=True)
def _time_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    marker = request.node.get_closest_marker("time_limit")
    if marker is None:
        yield
        return
    seconds = int(marker.args[0])

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the test took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def fresh_manager(monkeypatch: pytest.MonkeyPatch) -> Callable[[], plugin_manager.PluginManager]:
    """Returns a function that builds a new process-wide plugin manager from the current environment."""

    def make() -> plugin_manager.PluginManager:
        manager = plugin_manager.PluginManager()
        monkeypatch.setattr(plugin_manager, "_manager", manager)
        return manager

    return make


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
