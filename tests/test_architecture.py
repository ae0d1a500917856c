"""The core's layers (SPEC section 1, docs/architecture.md), checked over its import graph.

`lint-imports` (tox -e lint) checks the layer order too; this test also counts imports inside functions, and
checks cycles, module sizes, docstrings and that every package reaches the wheel.
"""

from __future__ import annotations

import ast
import runpy
from pathlib import Path
from typing import Any

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "hwplace"
LAYERS = ["foundation", "contracts", "plugin", "config", "inventory", "planning|channels", "runtime",
          "application", "testing"]
FACES = {"hwplace", "hwplace.__main__", "hwplace.errors", "hwplace.executor", "hwplace.names"}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(CORE.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """The index of a module's layer in LAYERS (planning and channels share one), None for the faces."""
    parts = module.split(".")
    if len(parts) < 2 or module in FACES:
        return None
    for index, names in enumerate(LAYERS):
        if parts[1] in names.split("|"):
            return index
    raise AssertionError(f"{module} is in no layer: put it in one of {LAYERS} or list it among the faces")


class Import:
    def __init__(self, source: str, target: str, line: int, in_function: bool, annotations: bool = False) -> None:
        self.source, self.target, self.line, self.in_function = source, target, line, in_function
        self.annotations = annotations  # under `if TYPE_CHECKING:`: it counts in the type graph all the same

    def __repr__(self) -> str:
        where = " (inside a function)" if self.in_function else ""
        kind = " (under TYPE_CHECKING)" if self.annotations else ""
        return f"{self.source}:{self.line} imports {self.target}{where}{kind}"


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(n.lineno for n in ast.walk(sub) if hasattr(n, "lineno"))
    return lines


def imports(known: dict[str, Path]) -> list[Import]:
    """Every import of a hwplace module by a hwplace module, at any depth, those only for annotations included
    (SPEC section 1: the type graph has no circle either)."""
    found: list[Import] = []
    for module, path in known.items():
        tree = ast.parse(path.read_text())
        annotations_only = _type_checking_lines(tree)
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, in_function: bool, module: str = module, is_package: bool = is_package,
                  annotations_only: set[int] = annotations_only) -> None:
            for child in ast.iter_child_nodes(node):
                inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                if isinstance(child, ast.Import | ast.ImportFrom):
                    for target in _targets(module, child, is_package, known):
                        found.append(Import(module, target, child.lineno, inside, child.lineno in annotations_only))
                visit(child, inside)

        visit(tree, False)
    return found


def _targets(module: str, node: ast.Import | ast.ImportFrom, is_package: bool, known: dict[str, Any]) -> set[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{alias.name}" for alias in node.names]
        names = [name if name in known else base for name in names]
    return {name for name in names if name in known and name != module and not module.startswith(name + ".")}


KNOWN = modules()
IMPORTS = imports(KNOWN)


def test_every_module_of_the_core_is_in_a_layer_or_is_a_face() -> None:
    for module in KNOWN:
        layer_of(module)  # raises for a module outside every layer


def test_a_module_imports_only_its_own_layer_or_the_layers_below() -> None:
    upward = [i for i in IMPORTS if (src := layer_of(i.source)) is not None
              and ((dst := layer_of(i.target)) is None or dst > src)]
    assert upward == []


def test_planning_and_channels_do_not_import_each_other() -> None:
    def room(module: str) -> str:
        return [*module.split("."), ""][1]

    across = [i for i in IMPORTS if {room(i.source), room(i.target)} == {"planning", "channels"}]
    assert across == []


def test_no_hwplace_module_is_imported_inside_a_function() -> None:
    assert [i for i in IMPORTS if i.in_function] == []


def test_the_import_graph_has_no_cycle() -> None:
    graph: dict[str, set[str]] = {m: set() for m in KNOWN}
    for i in IMPORTS:
        if i.source != "hwplace":  # the package face re-exports everything; nothing of the core imports it
            graph[i.source].add(i.target)
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    cycles: list[list[str]] = []

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                walk(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert cycles == []


def test_only_the_faces_and_the_tests_import_the_test_helpers() -> None:
    users = {i.source for i in IMPORTS if i.target.startswith("hwplace.testing")}
    assert users - {"hwplace"} - {m for m in KNOWN if m.startswith("hwplace.testing")} == set()


def test_no_layer_imports_a_public_face() -> None:
    assert [i for i in IMPORTS if layer_of(i.source) is not None and i.target in FACES] == []


@pytest.mark.parametrize("module", sorted(KNOWN))
def test_every_module_is_small_and_says_what_it_holds(module: str) -> None:
    text = KNOWN[module].read_text()
    assert text.count("\n") <= MAX_LINES, f"{module} has {text.count(chr(10))} lines; split it by what it holds"
    assert ast.get_docstring(ast.parse(text)), f"{module} has no docstring saying what it holds"


def test_every_package_goes_into_the_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    """setup.py finds the packages: every folder of hwplace/ and plugins/ with an __init__.py is among them."""
    captured: dict[str, Any] = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    folders = {module_name(p.parent) for p in CORE.rglob("__init__.py")}
    for init in (ROOT / "plugins").rglob("__init__.py"):
        folders.add(".".join(["hwplace_plugins", *init.parent.relative_to(ROOT / "plugins").parts]))
    assert folders == set(captured["packages"])
    assert {"hwplace.planning", "hwplace.channels", "hwplace_plugins.ray", "hwplace_plugins"} <= folders


ROOMS = {  # the runtime's rooms, and which other modules of the runtime each may import (their docstrings say so)
    "hwplace.runtime.messaging": set(),
    "hwplace.runtime.turns": set(),
    "hwplace.runtime.weight_sync": {"hwplace.runtime.messaging.communicator"},
}


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_room_of_the_runtime_imports_only_what_its_docstring_allows(room: str) -> None:
    def other_runtime(target: str) -> bool:
        return target.startswith("hwplace.runtime.") and not target.startswith(room + ".") and target != room

    found = {i.target for i in IMPORTS if i.source.startswith(room + ".") and other_runtime(i.target)}
    assert found <= ROOMS[room]


def test_no_pattern_ends_with_a_dollar() -> None:
    # "$" also matches before a final newline: "gpu\n" passed as a label. Patterns end with "\Z" (or fullmatch)
    found = []
    for path in sorted([*CORE.rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("re.compile", "re.match", "re.search") \
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                    and node.args[0].value.endswith("$"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
