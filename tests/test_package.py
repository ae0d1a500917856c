"""Package-level promises: light imports, the public names, and hooks that are documented and tested."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hwplace
from hwplace.contracts import hookspecs

ROOT = Path(__file__).resolve().parents[1]


def test_import_hwplace_imports_neither_ray_nor_torch() -> None:
    code = "import sys, hwplace, hwplace.testing; print(sorted({'ray', 'torch', 'omegaconf'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_worker_process_imports_only_the_part_of_hwplace_it_uses() -> None:
    # a worker's host loads Worker and its hosting (what an executor's worker side takes from hwplace.executor);
    # what a worker may never use (channels, the group launcher and the placement strategies, messaging, turns,
    # the cluster and its config) loads the first time it does, and the job runner and weight sync stay unloaded
    code = ("import sys, hwplace, hwplace.executor as e; hwplace.Worker; e.start_worker, e.run_method, "
            "e.run_method_async, e.RemoteFailure, e.GroupRuntime, e.Handle, e.Incarnations, e.WorkerContext; "
            "print(sorted(m for m in sys.modules if m.startswith('hwplace.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = result.stdout
    assert "'hwplace.runtime.hosting'" in loaded
    for unused in ("hwplace.application", "hwplace.planning", "hwplace.runtime.weight_sync", "hwplace.testing",
                   "hwplace.channels", "hwplace.runtime.group", "hwplace.runtime.messaging",
                   "hwplace.runtime.turns", "hwplace.inventory", "hwplace.config.section"):
        assert f"'{unused}" not in loaded, unused
    code = ("import sys, hwplace; hwplace.Worker.create_group, hwplace.Worker.turn; "
            "print(sorted(m for m in sys.modules if m.startswith('hwplace.')))")  # naming a method loads nothing
    assert "'hwplace.channels" not in subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                     check=True).stdout


@pytest.mark.parametrize("face", ["hwplace/executor.py", "hwplace/runtime/deferred.py"])
def test_the_names_other_modules_load_on_first_use_are_the_ones_type_checkers_see(face: str) -> None:
    module = importlib.import_module(face.removesuffix(".py").replace("/", "."))
    tree = ast.parse((ROOT / face).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    seen: dict[str, str] = {alias.asname or alias.name: f"{node.module}" if alias.asname in (None, alias.name)
                            else f"{node.module}:{alias.name}" for node in block.body
                            if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert seen == module._HOMES
    assert set(module.__all__) == set(seen)
    for name in module.__all__:
        home, _, attribute = seen[name].partition(":")
        assert getattr(module, name) is getattr(importlib.import_module(home), attribute or name)


def test_the_lazy_public_names_are_the_ones_type_checkers_see() -> None:
    # hwplace/__init__.py loads most public names on first use (its _HOMES); the imports under TYPE_CHECKING
    # name the same modules, and those names with the ones imported at once make up __all__
    tree = ast.parse((ROOT / "hwplace" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    seen: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        assert node.module is not None
        for alias in node.names:
            name = alias.asname or alias.name
            if node.module == "hwplace":
                seen[name] = f"hwplace.{alias.name}"
            else:
                seen[name] = node.module if alias.name == name else f"{node.module}:{alias.name}"
    assert seen == hwplace._HOMES
    eager = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
             and (node.module or "").startswith("hwplace") for alias in node.names
             if not re.match(r"_[^_]", alias.asname or alias.name)}  # a private helper is no public name
    eager |= {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
              if isinstance(target, ast.Name) and not target.id.startswith("_")}
    assert not eager & set(seen)
    assert set(hwplace.__all__) | {"errors", "executor"} == eager | set(seen)  # two public modules not in __all__


def test_error_hierarchy() -> None:
    import queue

    assert issubclass(hwplace.ConfigError, hwplace.HwplaceError)
    assert issubclass(hwplace.ConfigError, ValueError)
    assert issubclass(hwplace.PlacementError, ValueError)
    assert issubclass(hwplace.WorkerError, RuntimeError)
    assert issubclass(hwplace.ChannelEmpty, queue.Empty)
    assert issubclass(hwplace.ChannelFull, queue.Full)
    assert issubclass(hwplace.ChannelTimeout, TimeoutError)
    assert issubclass(hwplace.ChannelLost, ConnectionError)
    for name in ("ChannelClosed", "PluginError", "ChannelEmpty", "ChannelFull", "ChannelTimeout", "ChannelLost"):
        assert issubclass(getattr(hwplace, name), hwplace.HwplaceError)


def test_public_names_are_exported() -> None:
    for name in hwplace.__all__:
        assert hasattr(hwplace, name), name
    assert (ROOT / "hwplace" / "py.typed").exists()


def hook_names() -> list[str]:
    return [name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("hwplace_")]


def test_every_hook_is_documented() -> None:
    docs = (ROOT / "docs" / "plugins.md").read_text()
    assert hook_names()
    for name in hook_names():
        assert re.search(rf"^### `{name}", docs, re.MULTILINE), f"{name} is not documented in docs/plugins.md"


def test_every_hook_is_tested() -> None:
    this = Path(__file__).resolve()
    tests = [p.read_text() for p in (ROOT / "tests").rglob("test_*.py") if p.resolve() != this]
    for name in hook_names():
        assert any(f"def {name}(" in text for text in tests), f"no test implements {name}"


@pytest.mark.time_limit(1)
def test_the_time_limit_marker_ends_a_test_that_runs_over() -> None:
    with pytest.raises(TimeoutError, match=r"^the test took over 1 s; the other threads:\n--- thread pytest_timeout "):
        time.sleep(5)  # and it names where the other threads were (pytest-timeout's own is one of them)
