"""Every reference to hwplace's modules, objects and files in the docs and the docstrings resolves.

What is read:

- the docs: ``docs/*.md``, ``docs/backends/*.md`` and ``README.md``, outside fenced blocks (the python
  ones are run by test_docs.py; the others are configs and output) and HTML comments;
- the docstrings of ``hwplace/`` and ``plugins/``: every string standing alone as a statement (the
  docstrings of modules, classes and functions, and those written under an assignment).

What is checked in them:

- dotted names rooted at ``hwplace`` or ``hwplace_plugins`` (``hwplace.testing.fake_cluster``,
  ``hwplace_plugins.ray.executor``), backticked or not, unless part of a path or an address: the longest
  prefix that is a module is imported and the rest looked up with getattr (an attribute a class only
  annotates, or sets on ``self``, counts);
- Sphinx roles in docstrings (``:mod:``, ``:class:``, ``:func:``, ``:meth:``, ``:attr:``, ``:exc:``,
  ``:data:``, ``:obj:``, ``:const:``), ``~`` and ``title <target>`` forms too: a qualified target as above;
  an unqualified one from where the docstring is, looked up in the enclosing classes (innermost first),
  then the module (its names imported under TYPE_CHECKING included), then ``hwplace`` and the builtins;
- paths into the repository (``hwplace/``, ``plugins/``, ``tests/``, ``docs/``, ``examples/``,
  ``benchmarks/``), in the docs' inline code and anywhere in a docstring: the file or folder exists;
- the map of the layers in docs/architecture.md (its one fenced block): each name a layer's row lists, outside
  parentheses, is a module of that layer or a name its package offers.

A reference whose root is another package (``ray.util.queue``, ``torch.Tensor``), directly or through the
module's imports, is not checked.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted(ROOT.glob("docs/*.md")), *sorted(ROOT.glob("docs/backends/*.md")), ROOT / "README.md"]
PACKAGES = {"hwplace": ROOT / "hwplace", "hwplace_plugins": ROOT / "plugins"}
OURS = tuple(PACKAGES)

DOTTED = re.compile(r"(?<![\w/.\-])((?:hwplace|hwplace_plugins)(?:\.[A-Za-z_]\w*)+)")
ROLE = re.compile(r":(?:py:)?(mod|class|func|meth|attr|exc|data|obj|const):`([^`]+)`")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
REPO_PATH = re.compile(r"(?<![\w/.\-])((?:hwplace|plugins|tests|docs|examples|benchmarks)/[\w./\-]*)")
FENCE = re.compile(r"^ *(`{3,}|~{3,})")
COMMENT = re.compile(r"<!--.*?-->", re.S)


@dataclass(frozen=True)
class Reference:
    where: str  # path:line
    text: str  # as written
    target: str  # what is resolved: a dotted name, or a path
    kind: str  # "dotted", "role" or "path"
    module: str = ""  # a docstring's module, for an unqualified role target
    classes: tuple[str, ...] = ()  # the classes around a docstring, outermost first

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


# -- reading references --------------------------------------------------------------------------------


def line_of(text: str, offset: int, first_line: int = 1) -> int:
    return first_line + text.count("\n", 0, offset)


def prose(markdown: str) -> str:
    """The markdown without its fenced blocks and HTML comments, blanked out so that lines keep their numbers."""
    kept, fence = [], None
    for line in markdown.split("\n"):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match[1]
            kept.append("")
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            kept.append("")
        else:
            kept.append(line)
    return COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), "\n".join(kept))


def doc_references(path: Path) -> Iterator[Reference]:
    name = path.relative_to(ROOT).as_posix()
    text = prose(path.read_text(encoding="utf-8"))
    for match in DOTTED.finditer(text):
        yield Reference(f"{name}:{line_of(text, match.start())}", match[1], match[1], "dotted")
    for span in CODE_SPAN.finditer(text):
        for match in REPO_PATH.finditer(span[2]):
            target = match[1].rstrip(".")
            yield Reference(f"{name}:{line_of(text, span.start(2) + match.start())}", target, target, "path")


def string_statements(tree: ast.Module) -> Iterator[tuple[str, int, tuple[str, ...]]]:
    """Every string standing alone as a statement: its text, its first line and the classes around it."""

    def walk(body: list[Any], classes: tuple[str, ...], in_function: bool) -> Iterator[tuple[str, int, Any]]:
        for node in body:
            value = node.value if isinstance(node, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield value.value, value.lineno, classes
            elif isinstance(node, ast.ClassDef):
                # a class inside a function cannot be looked up from the module: its docstrings' names are
                # looked up in the module only
                yield from walk(node.body, () if in_function else (*classes, node.name), in_function)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(node.body, classes, True)
            else:  # if, try, with, for, while: the statements inside
                for field in ("body", "orelse", "finalbody", "handlers"):
                    yield from walk(getattr(node, field, []), classes, in_function)

    yield from walk(tree.body, (), False)


def module_name(package: str, path: Path) -> str:
    parts = [package, *path.relative_to(PACKAGES[package]).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> Iterator[tuple[str, Path]]:
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            yield package, path


def docstring_references(package: str, path: Path) -> Iterator[Reference]:
    name, module = path.relative_to(ROOT).as_posix(), module_name(package, path)
    for text, first_line, classes in string_statements(ast.parse(path.read_text(encoding="utf-8"))):
        roles = list(ROLE.finditer(text))
        for match in DOTTED.finditer(text):
            if not any(role.start() <= match.start() < role.end() for role in roles):  # the role's, below
                yield Reference(f"{name}:{line_of(text, match.start(), first_line)}", match[1], match[1],
                                "dotted")
        for match in REPO_PATH.finditer(text):
            target = match[1].rstrip(".")
            yield Reference(f"{name}:{line_of(text, match.start(), first_line)}", target, target, "path")
        for match in roles:
            target = match[2]
            if (titled := re.search(r"<([^<>]+)>$", target)) is not None:
                target = titled[1]
            target = target.strip().lstrip("~").removesuffix("()")
            yield Reference(f"{name}:{line_of(text, match.start(), first_line)}", match[0], target, "role",
                            module, classes)


def all_references() -> list[Reference]:
    found = [r for doc in DOCS for r in doc_references(doc)]
    found += [r for package, path in source_files() for r in docstring_references(package, path)]
    return found


# -- resolving them -----------------------------------------------------------------------------------


class Unresolved(Exception):
    """A reference that leads nowhere; the message says how far it got."""


class NotOurs(Exception):
    """A reference to another package's object: not checked."""


def imported_names(module: ModuleType) -> dict[str, str]:
    """The names a module imports anywhere in its source (TYPE_CHECKING blocks included), as dotted targets."""
    source = getattr(module, "__file__", None)
    if source is None or not source.endswith(".py"):
        return {}
    names: dict[str, str] = {}
    package = module.__name__ if source.endswith("__init__.py") else module.__name__.rpartition(".")[0]
    for node in ast.walk(ast.parse(Path(source).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.partition(".")[0]] = alias.name if alias.asname else \
                    alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per dot past the first
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def instance_attributes(cls: type) -> set[str]:
    """What a class (or one it derives from, among hwplace's) annotates, or assigns on ``self`` in its methods."""
    names: set[str] = set()
    for klass in cls.__mro__:
        names.update(getattr(klass, "__annotations__", {}))
        names.update(getattr(klass, "__slots__", ()))
        module = sys.modules.get(klass.__module__)
        if module is None or not klass.__module__.startswith(OURS) or getattr(module, "__file__", None) is None:
            continue
        for node in ast.walk(ast.parse(Path(module.__file__).read_text(encoding="utf-8"))):  # type: ignore[arg-type]
            if isinstance(node, ast.ClassDef) and node.name == klass.__name__:
                for sub in ast.walk(node):
                    if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                            and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                        names.add(sub.attr)
    return names


def follow(start: Any, path: list[str], reached: str) -> Any:
    """``start`` then getattr along ``path``; an attribute only an instance has ends the walk, resolved."""
    obj = start
    for i, part in enumerate(path):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            reached = f"{reached}.{part}"
        elif isinstance(obj, type) and part in instance_attributes(obj) and i == len(path) - 1:
            return None
        else:
            raise Unresolved(f"{reached} has no attribute {part!r}")
    return obj


def resolve_dotted(target: str) -> Any:
    """A dotted name rooted at one of hwplace's packages: import the longest module prefix, getattr the rest."""
    parts = target.split(".")
    if parts[0] not in OURS:
        raise NotOurs(target)
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not exc.name.startswith(OURS):
                raise NotOurs(f"{target} needs {exc.name}, not installed here") from None
            if exc.name is not None and name.startswith(exc.name):
                continue  # not a module: the rest is looked up on a shorter prefix
            raise
        return follow(module, parts[cut:], name)
    raise Unresolved(f"no module {parts[0]}")


def resolve_role(reference: Reference) -> Any:
    first, *rest = reference.target.split(".")
    if first in OURS:
        return resolve_dotted(reference.target)
    module = importlib.import_module(reference.module)
    scopes: list[Any] = []
    obj: Any = module
    for name in reference.classes:
        obj = getattr(obj, name)
        scopes.append(obj)
    for scope in reversed(scopes):
        if hasattr(scope, first) or (not rest and first in instance_attributes(scope)):
            return follow(scope, [first, *rest], scope.__qualname__) if hasattr(scope, first) else None
    if hasattr(module, first):
        return follow(module, [first, *rest], reference.module)
    imported = imported_names(module)
    if first in imported:
        return resolve_dotted(".".join([imported[first], *rest]))
    hwplace = importlib.import_module("hwplace")
    if hasattr(hwplace, first):
        return follow(hwplace, [first, *rest], "hwplace")
    if hasattr(builtins, first):
        return follow(builtins, [first, *rest], "builtins")
    if rest and first.isidentifier() and importlib.util.find_spec(first) is not None:
        raise NotOurs(reference.target)
    where = " or ".join([*(s.__qualname__ for s in reversed(scopes)), reference.module, "hwplace", "builtins"])
    raise Unresolved(f"no {first!r} in {where}")


def resolve(reference: Reference) -> None:
    if reference.kind == "path":
        if not (ROOT / reference.target).exists():
            raise Unresolved("no such file or folder in the repository")
    elif reference.kind == "dotted":
        resolve_dotted(reference.target)
    else:
        resolve_role(reference)


def unresolved(references: list[Reference]) -> list[str]:
    problems = []
    for reference in references:
        try:
            resolve(reference)
        except NotOurs:
            pass
        except (Unresolved, ImportError) as exc:
            problems.append(f"{reference}: {exc}")
    return problems


def layer_map(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, layer, name) for each name in the rows of the layer map: ``N │ layer   name, name (remark); name │``,
    continued on lines without a layer, in one or two columns."""
    block = re.search(r"^```text\n(.*?)^```", text, re.S | re.M)
    assert block is not None, "docs/architecture.md has no map of the layers (a ```text block)"
    first_line = line_of(text, block.start(1))
    layers: dict[int, str] = {}
    for number, line in enumerate(block[1].split("\n"), first_line):
        for column, cell in enumerate(line.split("│")[1:-1]):
            words = cell.split(maxsplit=1)
            if words and (ROOT / "hwplace" / words[0]).is_dir():
                layers[column], cell = words[0], words[1] if len(words) > 1 else ""
            listed = re.sub(r"\([^)]*\)", "", cell)
            for name in filter(None, (n.strip() for n in re.split(r"[,;]", listed))):
                yield number, layers.get(column, "?"), name


def unmapped(text: str) -> list[str]:
    problems = []
    for line, layer, name in layer_map(text):
        package = f"hwplace.{layer}"
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            problems.append(f"docs/architecture.md:{line}: {name!r} in the row of {layer}: not a name")
        elif importlib.util.find_spec(package) is None or not (
                hasattr(importlib.import_module(package), name) or importlib.util.find_spec(f"{package}.{name}")):
            problems.append(f"docs/architecture.md:{line}: {name!r} is no module of {package}, nor a name it offers")
    return problems


# -- the tests ------------------------------------------------------------------------------------------


def test_every_reference_in_the_docs_and_docstrings_resolves() -> None:
    references = all_references()
    assert len(references) > 300, "the extraction finds far fewer references than the docs hold"
    problems = unresolved(references)
    if problems:
        pytest.fail(f"{len(problems)} references lead nowhere:\n" + "\n".join(problems), pytrace=False)


def test_every_name_in_the_map_of_the_layers_is_a_module_of_its_layer() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert len(list(layer_map(text))) > 40, "the map of the layers lists far fewer modules than the core has"
    problems = unmapped(text)
    if problems:
        pytest.fail(f"{len(problems)} names in the map of the layers lead nowhere:\n" + "\n".join(problems),
                    pytrace=False)


def test_the_map_of_the_layers_is_read_by_layer_and_column() -> None:
    text = ("```text\n"
            "2 │ contracts     hardware (HardwareBackend, Device), executor (Executor, ...),  │\n"
            "  │               hookspecs, gone                                                │\n"
            "6 │ planning      resources,     │ channels    wire, nowhere │\n"
            "```\n")
    assert unmapped(text) == ["docs/architecture.md:3: 'gone' is no module of hwplace.contracts, nor a name it offers",
                              "docs/architecture.md:4: 'nowhere' is no module of hwplace.channels, nor a name it "
                              "offers"]


def write(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "doc.md"
    path.write_text(source)
    return path


def references_in(text: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    return [r.text for r in doc_references(write(tmp_path, text))]


def test_the_docs_references_are_read_outside_code_blocks_and_comments(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    text = ("See `hwplace.testing.fake_cluster` and hwplace.Cluster, in `hwplace/inventory/cluster.py`.\n"
            "<!-- file: hwplace.nothing -->\n```python\nhwplace.not_checked\n```\n"
            "Not these: https://example.com/hwplace.git, my_hwplace.x, hwplace, `tests`, hwplace/x.\n")
    assert references_in(text, monkeypatch, tmp_path) == [
        "hwplace.testing.fake_cluster", "hwplace.Cluster", "hwplace/inventory/cluster.py"]


@pytest.mark.parametrize(("reference", "problem"), [
    (Reference("d.md:1", "hwplace.channel_wire", "hwplace.channel_wire", "dotted"),
     "d.md:1: hwplace.channel_wire: hwplace has no attribute 'channel_wire'"),
    (Reference("d.md:2", "hwplace.Cluster.nodez", "hwplace.Cluster.nodez", "dotted"),
     "d.md:2: hwplace.Cluster.nodez: hwplace.Cluster has no attribute 'nodez'"),
    (Reference("m.py:3", ":class:`Nowhere`", "Nowhere", "role", "hwplace.channels.server"),
     "m.py:3: :class:`Nowhere`: no 'Nowhere' in hwplace.channels.server or hwplace or builtins"),
    (Reference("d.md:4", "tests/test_gone.py", "tests/test_gone.py", "path"),
     "d.md:4: tests/test_gone.py: no such file or folder in the repository"),
])
def test_an_unresolved_reference_is_reported_with_where_it_is(reference: Reference, problem: str) -> None:
    assert unresolved([reference]) == [problem]


@pytest.mark.parametrize("reference", [
    Reference("d.md:1", "hwplace.Cluster.nodes", "hwplace.Cluster.nodes", "dotted"),  # set on self
    Reference("m.py:1", ":class:`WeightedQueues`", "WeightedQueues", "role", "hwplace.channels.server"),
    Reference("m.py:1", ":meth:`put`", "put", "role", "hwplace.channels.channel", ("Channel",)),
    Reference("m.py:1", ":class:`~ray.actor.ActorHandle`", "ray.actor.ActorHandle", "role", "hwplace.errors"),
    Reference("m.py:1", ":exc:`TimeoutError`", "TimeoutError", "role", "hwplace.errors"),
])
def test_what_resolves(reference: Reference) -> None:
    assert unresolved([reference]) == []
