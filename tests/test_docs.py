"""The code in the docs runs, so what readers copy works; the error messages shown are the real ones; the
API reference names every public name.

One test per doc runs its fenced blocks in order, in a temporary working directory that holds a copy of
``examples/*.yaml`` (so ``examples/quickstart.yaml`` works, as in a fresh clone):

- ```python blocks run in one namespace per doc, shared by all its blocks; a block written as a doctest
  (``>>>``) runs with doctest (ELLIPSIS on) in that same namespace.
- A block right after ``<!-- file: PATH -->`` is written to PATH instead of being run: the YAML a later
  block loads, a module it imports. Written ``test_*.py`` files are run with pytest at the end of the doc,
  in a fresh process with the working directory importable, as the doc tells its readers to.
- A ```pytb block right after a python block is the error that block raises (``type: message``, the end of
  the traceback); the block must raise exactly that.
- A ```console block of ``$ hwplace ...`` commands runs each command (as ``python -m hwplace``) and
  compares its output (stdout and stderr) with the lines under it. Other console blocks and every other
  language (yaml, toml, bash, json, text) are not run.
- ``<!-- run: ENVIRONMENT -->`` runs the next python block alone, in a fresh process set up as one of
  ``ENVIRONMENTS`` says (Ray not installed, say), or the next console block with its variables.
- ``<!-- not run: REASON -->`` skips the next block. Every skip is listed in ``NOT_RUN``, so none is silent.

In compared text, ``...`` stands for any text within one line and a line of only ``...`` for any number of
lines; Ray node ids (12 or more hex digits) and IPv4 addresses are normalised, and so are runs of spaces
inside a line (table columns widen with a longer address or host name).

A doc whose code starts or reaches a Ray cluster gets the session's 2-node cluster (``hwplace_local_ray``),
with no channels left over from earlier tests, and at most ``DOC_TIME_LIMIT`` seconds.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from limits import alarm

import hwplace

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted(ROOT.glob("docs/*.md")), *sorted(ROOT.glob("docs/backends/*.md"))]
DOCS.append(ROOT / "README.md")

NOT_RUN: list[tuple[str, str]] = []
"""(doc, reason) of every block marked ``<!-- not run: REASON -->``, in order. Keep it short."""

DOC_TIME_LIMIT = 180  # seconds for one doc's blocks: a broken worker or channel fails the test, never hangs it
COMMAND_TIME_LIMIT = 120  # seconds for one command or fresh process that a doc runs

FENCE = re.compile(r"^( *)(`{3,}|~{3,})\s*([\w+-]*)")
DIRECTIVE = re.compile(r"^<!--\s*(file|not run|run)\s*:\s*(.*?)\s*-->$")
DIRECTIVE_LIKE = re.compile(r"^<!--\s*(file|not run|run)\b")
RAY_CODE = re.compile(r"\bhwplace\.Cluster\(|\bChannel\.(?:create|connect)\(|\.launch\(|\brun_job\(")
NODE_ID = re.compile(r"\b[0-9a-f]{12,}\b")
IPV4 = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b")


class DocError(Exception):
    """A block of a doc failed, or a doc breaks the conventions above; the message says where."""


class DocTimeout(BaseException):  # not an Exception: code under test that catches those does not swallow it
    """A doc took longer than its time limit."""


# -- reading a doc ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One fenced block of a doc, with the directive written right before it, if any."""

    doc: str  # as reported: the path from the repository root
    source: str  # the file's absolute path (for tracebacks that show the doc's lines)
    line: int  # the line of the block's first line of code
    lang: str
    text: str
    directive: str | None = None  # "file", "not run" or "run"
    argument: str = ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def is_doctest(self) -> bool:
        return any(line.lstrip().startswith(">>>") for line in self.text.splitlines())


def display_name(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return path.resolve().relative_to(ROOT).as_posix()
    return path.name


def parse(path: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of a markdown file (or of ``text``, a part of it), in order."""
    name = display_name(path)
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    pending: tuple[str, str, int] | None = None
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        fence = FENCE.match(lines[i])
        if fence:
            indent, marker, lang = fence.groups()
            closing = re.compile(rf"^\s*{re.escape(marker[0])}{{{len(marker)},}}\s*$")
            start = i + 1
            body = []
            i += 1
            while i < len(lines) and not closing.match(lines[i]):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
                i += 1
            if i == len(lines):
                raise DocError(f"{name}:{start}: this block is never closed")
            directive, argument = (pending[0], pending[1]) if pending else (None, "")
            blocks.append(Block(name, str(path.resolve()), start + 1, lang.lower(), "\n".join(body) + "\n",
                                directive, argument))
            pending = None
        elif match := DIRECTIVE.match(stripped):
            if pending:
                raise DocError(f"{name}:{pending[2]}: `<!-- {pending[0]}: ... -->` is followed by another directive")
            if not match[2]:
                wanted = "reason" if match[1] == "not run" else "value"
                raise DocError(f"{name}:{i + 1}: `{stripped}` needs its {wanted}")
            pending = (match[1], match[2], i + 1)
        elif DIRECTIVE_LIKE.match(stripped):
            raise DocError(f"{name}:{i + 1}: `{stripped}` is not a directive; write `<!-- file: PATH -->`, "
                           "`<!-- run: ENVIRONMENT -->` or `<!-- not run: REASON -->`")
        elif stripped and pending:
            raise DocError(f"{name}:{pending[2]}: `<!-- {pending[0]}: ... -->` must come right before a fenced block")
        i += 1
    if pending:
        raise DocError(f"{name}:{pending[2]}: `<!-- {pending[0]}: ... -->` must come right before a fenced block")
    return blocks


def needs_ray(blocks: list[Block]) -> bool:
    return any(b.lang == "python" and b.directive is None and RAY_CODE.search(b.text) for b in blocks)


# -- comparing output --------------------------------------------------------------------------------------


def normalise(text: str) -> str:
    lines = []
    for line in text.rstrip("\n").split("\n"):
        line = IPV4.sub("<ip>", NODE_ID.sub("<id>", line.rstrip()))
        indent = len(line) - len(line.lstrip(" "))
        lines.append(line[:indent] + re.sub(r" {2,}", "  ", line[indent:]))
    return "\n".join(lines)


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is ``expected`` once both are normalised, ``...`` standing for what varies."""
    pattern = ""
    for line in normalise(expected).split("\n"):
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += r"[^\n]*?".join(map(re.escape, line.split("..."))) + r"\n"
    return re.fullmatch(pattern, normalise(actual) + "\n") is not None


def check_output(shown: Block, actual: str, what: str) -> None:
    if not matches(shown.text, actual):
        raise DocError(f"{shown.where}: the doc shows\n{textwrap.indent(shown.text.rstrip(), '    ')}\n"
                       f"but {what} is\n{textwrap.indent(actual.rstrip(), '    ')}")


def exception_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n")


def doc_traceback(exc: BaseException, block: Block) -> str:
    """The traceback from the doc's own line on (the harness's frames left out)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != block.source:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


# -- environments for `<!-- run: ... -->` -------------------------------------------------------------------


@dataclass(frozen=True)
class Environment:
    """How a block marked ``<!-- run: NAME -->`` is run: Python run first in a fresh process, and variables."""

    prelude: str = ""
    make_env: Callable[[Path], dict[str, str]] = lambda cwd: {}


NO_RAY = '''
import sys

class _NoRay:  # this process finds no Ray, as where it is not installed
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoRay())
'''


def broken_plugin(cwd: Path) -> dict[str, str]:
    """my-tpu-hwplace installed (its entry point and module), its module importing a driver that is missing."""
    site = cwd / ".site"
    info = site / "my_tpu_hwplace-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-tpu-hwplace\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[hwplace]\nmy-tpu = my_tpu_hwplace\n")
    (site / "my_tpu_hwplace.py").write_text("import mytpu_driver  # the vendor's library, not installed here\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


ENVIRONMENTS = {
    "in a fresh process": Environment(),  # for a block that starts its own Ray, as a script would
    "without ray": Environment(prelude=NO_RAY),
    "with a broken plugin": Environment(make_env=broken_plugin),
    "with token mode and no token": Environment(make_env=lambda cwd: {
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "", "RAY_AUTH_TOKEN_PATH": "", "RAY_ADDRESS": "",
        "HOME": str(cwd)}),
}

RUN_ALONE = '''
import sys, traceback
source, doc, line, result = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    exec(compile("\\n" * (line - 1) + source, doc, "exec"), {"__name__": "__main__"})
except BaseException as exc:
    with open(result, "w") as out:
        out.write("".join(traceback.format_exception_only(type(exc), exc)))
    raise
'''


def process_env(cwd: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(cwd)]))
    return env


# -- running a doc ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def time_limit(seconds: int, what: str) -> Iterator[None]:
    """Raises DocTimeout in the main thread after ``seconds``, and every 10 s after that until the block ends
    (doctest catches everything, so one alarm may be spent on one example)."""
    with alarm(seconds, lambda: DocTimeout(f"{what} took over {seconds} s"), again_every=10):
        yield


class DocRun:
    """Runs the blocks of one doc in order; see the module docstring for what each kind of block does."""

    def __init__(self, blocks: list[Block], cwd: Path) -> None:
        self.blocks = blocks
        self.cwd = cwd
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.skipped: list[Block] = []
        self.test_files: list[Path] = []

    def run(self) -> None:
        i = 0
        while i < len(self.blocks):
            block = self.blocks[i]
            shown = self.blocks[i + 1] if i + 1 < len(self.blocks) and self.blocks[i + 1].lang == "pytb" else None
            if block.lang == "pytb":
                raise DocError(f"{block.where}: a pytb block shows the error of the python block right before it; "
                               "this one follows none")
            if block.directive == "file":
                self.write(block)
            elif block.directive == "not run":
                if block.lang not in ("python", "console"):
                    raise DocError(f"{block.where}: only python and console blocks are run: `not run` means "
                                   "nothing here")
                self.skipped.append(block)
                if block.lang == "python" and shown is not None:
                    i += 1  # the error it would raise is not checked either
            elif block.lang == "python":
                if block.is_doctest and shown is not None:
                    raise DocError(f"{shown.where}: a doctest shows its errors itself; a pytb block follows only "
                                   "plain python blocks")
                if block.directive == "run":
                    self.run_alone(block, shown)
                elif block.is_doctest:
                    self.run_doctest(block)
                else:
                    self.run_python(block, shown)
                if shown is not None:
                    i += 1  # checked with its block
            elif block.lang == "console":
                self.run_console(block)
            elif block.directive == "run":
                raise DocError(f"{block.where}: only python and console blocks can be run in an environment")
            i += 1
        if self.test_files:
            self.run_tests()

    def write(self, block: Block) -> None:
        target = (self.cwd / block.argument).resolve()
        if not target.is_relative_to(self.cwd.resolve()):
            raise DocError(f"{block.where}: {block.argument!r} is outside the doc's working directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text, encoding="utf-8")
        if block.lang == "python" and target.name.startswith("test_"):
            self.test_files.append(target)

    def run_python(self, block: Block, shown: Block | None) -> None:
        code = compile("\n" * (block.line - 1) + block.text, block.source, "exec")
        try:
            exec(code, self.namespace)
        except Exception as exc:
            if shown is None:
                raise DocError(f"{block.where}: the block raised {type(exc).__name__}\n"
                               f"{doc_traceback(exc, block)}") from None
            check_output(shown, exception_text(exc), f"the error the block at {block.where} raises")
        else:
            if shown is not None:
                raise DocError(f"{block.where}: the block should raise what {shown.where} shows; it raised nothing")

    def run_doctest(self, block: Block) -> None:
        test = doctest.DocTestParser().get_doctest(block.text, self.namespace, block.where, block.source,
                                                   block.line - 1)
        report = io.StringIO()
        result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test, out=report.write, clear_globs=False)
        self.namespace.update(test.globs)  # a DocTest runs in a copy: later blocks see what it defined
        if result.failed:
            raise DocError(f"{block.where}: the doctest failed\n{report.getvalue()}")

    def environment(self, block: Block) -> Environment:
        if block.argument not in ENVIRONMENTS:
            raise DocError(f"{block.where}: no environment {block.argument!r}; there are: {', '.join(ENVIRONMENTS)}")
        return ENVIRONMENTS[block.argument]

    def process(self, command: list[str], env: dict[str, str], where: str,
                stderr: int = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
        """Runs a command in the doc's directory, bounded in time; the working directory is importable."""
        try:
            return subprocess.run(command, cwd=self.cwd, env=process_env(self.cwd, env), stdout=subprocess.PIPE,
                                  stderr=stderr, text=True, timeout=COMMAND_TIME_LIMIT, check=False)
        except subprocess.TimeoutExpired:
            raise DocError(f"{where}: {command[1:3]} did not finish within {COMMAND_TIME_LIMIT} s") from None

    def run_alone(self, block: Block, shown: Block | None) -> None:
        environment = self.environment(block)
        result = self.cwd / ".raised"
        result.unlink(missing_ok=True)
        done = self.process([sys.executable, "-c", environment.prelude + RUN_ALONE, block.text, block.source,
                             str(block.line), str(result)], environment.make_env(self.cwd), block.where)
        if not result.exists():
            if done.returncode != 0:
                raise DocError(f"{block.where}: the block's process ended with code {done.returncode}\n{done.stderr}")
            if shown is not None:
                raise DocError(f"{block.where}: the block should raise what {shown.where} shows; it raised nothing")
            return
        if shown is None:
            raise DocError(f"{block.where}: the block raised, run {block.argument}\n{done.stderr}")
        check_output(shown, result.read_text(), f"the error the block at {block.where} raises")

    def run_console(self, block: Block) -> None:
        lines = block.text.rstrip("\n").split("\n")
        if not lines[0].startswith("$ hwplace "):
            if block.directive == "run":
                raise DocError(f"{block.where}: only `$ hwplace ...` commands are run")
            return  # another program's session: shown, not run
        extra = self.environment(block).make_env(self.cwd) if block.directive == "run" else {}
        starts = [i for i, line in enumerate(lines) if line.startswith("$ ")]
        for start, end in zip(starts, [*starts[1:], len(lines)], strict=True):
            argv, where = shlex.split(lines[start][2:]), f"{block.doc}:{block.line + start}"
            if argv[0] != "hwplace":
                raise DocError(f"{where}: a console block that runs hwplace runs only hwplace; show other commands "
                               "in a block of their own")
            done = self.process([sys.executable, "-m", "hwplace", *argv[1:]], extra, where, stderr=subprocess.STDOUT)
            shown = Block(block.doc, block.source, block.line + start, "console", "\n".join(lines[start + 1:end]))
            check_output(shown, done.stdout, f"what `{lines[start][2:]}` prints")

    def run_tests(self) -> None:
        pytest_command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        done = self.process([*pytest_command, *map(str, self.test_files)], {}, self.blocks[0].doc)
        if done.returncode != 0:
            names = ", ".join(f.relative_to(self.cwd).as_posix() for f in self.test_files)
            raise DocError(f"{self.blocks[0].doc}: the test files it writes ({names}) fail under pytest\n{done.stdout}")

    def clean_up(self) -> None:
        """Groups a failed doc left running are shut down, and modules it imported from its directory forgotten."""
        for value in list(self.namespace.values()):
            if isinstance(value, hwplace.WorkerGroup):
                with contextlib.suppress(Exception):
                    value.shutdown()
        cwd = str(self.cwd.resolve())
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(cwd):
                del sys.modules[name]


def ray_is_up() -> bool:
    return "ray" in sys.modules and bool(sys.modules["ray"].is_initialized())


def drop_channels() -> None:
    """Stops every channel's host: each doc starts as a fresh driver would, with no channels."""
    import ray

    from hwplace_plugins.ray.executor import ACTOR_PREFIX

    for name in ray.util.list_named_actors():
        if name.startswith(ACTOR_PREFIX):
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name))


def run_doc(path: Path, cwd: Path, monkeypatch: pytest.MonkeyPatch, *, ray: bool = False) -> DocRun:
    blocks = parse(path)
    examples = cwd / "examples"
    examples.mkdir()
    for example in (ROOT / "examples").glob("*.yaml"):
        shutil.copy(example, examples / example.name)
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    run = DocRun(blocks, cwd)
    if ray:
        drop_channels()
    try:
        with time_limit(DOC_TIME_LIMIT, display_name(path)):
            run.run()
    finally:
        run.clean_up()
        if ray:
            drop_channels()
    return run


# -- the docs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS, ids=display_name)
def test_the_code_in_the_doc_runs(doc: Path, request: pytest.FixtureRequest, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    failure = None
    ray_before = ray_is_up()
    try:
        ray = needs_ray(parse(doc))
        if ray:
            request.getfixturevalue("hwplace_local_ray")
            ray_before = True
        run = run_doc(doc, tmp_path, monkeypatch, ray=ray)
    except (DocError, DocTimeout) as exc:
        failure = str(exc)
    if not ray_before and ray_is_up():
        sys.modules["ray"].shutdown()  # so that the session's cluster can still start
        failure = (f"{display_name(doc)} started Ray on its own: add its call to RAY_CODE so that it runs on the "
                   f"session's cluster\n{failure or ''}")
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    for block in run.skipped:
        print(f"{block.where}: not run: {block.argument}")


def test_only_the_blocks_listed_in_NOT_RUN_are_skipped() -> None:
    skipped = [(b.doc, b.argument) for doc in DOCS for b in parse(doc) if b.directive == "not run"]
    assert skipped == NOT_RUN, "a block marked <!-- not run: REASON --> must be listed in NOT_RUN, and only those"
    assert len(NOT_RUN) <= 5, "most docs' code runs here: a skip is for what truly needs real hardware"


def test_python_blocks_say_python() -> None:
    for doc in DOCS:
        for block in parse(doc):
            if block.lang in ("py", "python3", "pycon", "ipython"):
                pytest.fail(f"{block.where}: write ```python, the language the docs' tests run")


# -- the harness itself: every rule can fail ---------------------------------------------------------------


def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, markdown: str) -> DocRun:
    tmp_path.mkdir(parents=True, exist_ok=True)
    doc = tmp_path / "doc.md"
    doc.write_text(textwrap.dedent(markdown))
    work = tmp_path / "work"
    work.mkdir()
    return run_doc(doc, work, monkeypatch)


def test_a_block_that_raises_fails_with_the_doc_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DocError, match=r"(?s)doc\.md:6: the block raised ZeroDivisionError.*doc\.md\", line 7"):
        harness(tmp_path, monkeypatch, """\
            # A doc

            Some text.

            ```python
            x = 1
            y = x / 0
            ```
            """)


def test_blocks_share_one_namespace_and_files_are_written_first(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    run = harness(tmp_path, monkeypatch, """\
        <!-- file: job.yaml -->
        ```yaml
        cluster: {num_nodes: 1, component_placement: {actor: 0-1}}
        ```

        ```python
        import hwplace
        cfg = hwplace.load_config("job.yaml")
        ```

        ```python
        >>> cfg["cluster"]["component_placement"]
        {'actor': '0-1'}

        ```

        ```python
        >>> doctest_name = 2

        ```

        ```python
        assert open("examples/quickstart.yaml") and doctest_name == 2
        ```
        """)
    assert run.namespace["cfg"]["cluster"]["num_nodes"] == 1


def test_a_failing_doctest_fails_with_the_doc_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DocError, match=r"(?s)doc\.md:2: the doctest failed.*line 3.*Expected:\s+3\s+Got:\s+2"):
        harness(tmp_path, monkeypatch, """\
            ```python
            >>> x = 1
            >>> x + 1
            3
            ```
            """)


def test_a_shown_error_must_be_the_one_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = """\
        ```python
        {}["key"]
        ```

        ```pytb
        KeyError: %s
        ```
        """
    harness(tmp_path, monkeypatch, doc % "'key'")
    with pytest.raises(DocError, match=r"doc\.md:6: the doc shows\n    KeyError: 'other'\nbut the error"):
        harness(tmp_path / "b", monkeypatch, doc % "'other'")
    with pytest.raises(DocError, match=r"doc\.md:2: the block should raise what doc\.md:6 shows; it raised nothing"):
        harness(tmp_path / "c", monkeypatch, doc.replace('{}["key"]', "{}"))


def test_compared_text_allows_only_ellipses_ids_and_addresses_to_vary() -> None:
    shown = "error: node 0b6f8d1c2e3a at 192.0.2.2 on ...\nTraceback:\n...\nKeyError: 'x'"
    traceback = "Traceback:\n  File a\n  File b\nKeyError: 'x'"
    assert matches(shown, f"error: node 58f03d433249 at 10.0.0.15 on host-a\n{traceback}")
    assert matches(shown, "error: node 58f03d433249 at 10.0.0.15 on h\nTraceback:\nKeyError: 'x'")  # no lines
    assert not matches(shown, "error: node 58f03d433249 at 10.0.0.15 on a\nb\nTraceback:\nKeyError: 'x'")
    assert not matches(shown, "error: node 0 at 192.0.2.2 on a\nTraceback:\nKeyError: 'y'")
    assert matches("  a  b", "  a      b   ")
    assert not matches("    ^^^", "  ^^^")


def test_a_console_block_runs_its_hwplace_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = """\
        <!-- file: job.yaml -->
        ```yaml
        cluster: {num_nodes: 1, component_placement: {actor: 0-3:0-2}}
        ```

        ```console
        $ hwplace plan job.yaml --nodes 1x8
        hwplace: error: component 'actor', entry '0-3:0-2' of '0-3:0-2': 4 resources and 3 processes: ...
            actor: 0-3:0-2
                   %s
        ```
        """
    harness(tmp_path, monkeypatch, doc % "^^^^^^^")
    with pytest.raises(DocError, match=r"(?s)doc\.md:7: the doc shows.*but what `hwplace plan job\.yaml"):
        harness(tmp_path / "b", monkeypatch, doc % " ^^^^^^")


def test_written_test_files_run_with_pytest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = """\
        <!-- file: mymodule.py -->
        ```python
        VALUE = 2
        ```

        <!-- file: tests/test_mine.py -->
        ```python
        import mymodule

        def test_value():
            assert mymodule.VALUE == %s
        ```
        """
    harness(tmp_path, monkeypatch, doc % 2)
    with pytest.raises(DocError, match=r"(?s)doc\.md: the test files it writes \(tests/test_mine\.py\) fail.*1 failed"):
        harness(tmp_path / "b", monkeypatch, doc % 3)


def test_a_block_run_without_ray_finds_no_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    harness(tmp_path, monkeypatch, """\
        <!-- run: without ray -->
        ```python
        import ray
        ```

        ```pytb
        ModuleNotFoundError: No module named 'ray'
        ```
        """)


@pytest.mark.parametrize(("markdown", "problem"), [
    ("<!-- not run -->\n```python\nx\n```\n", r"doc\.md:1: `<!-- not run -->` is not a directive"),
    ("<!-- not run: -->\n```python\nx\n```\n", r"doc\.md:1: `<!-- not run: -->` needs its reason"),
    ("<!-- file: a.yaml -->\nText.\n```yaml\n```\n", r"doc\.md:1: .* must come right before a fenced block"),
    ("```python\nx = 1\n", r"doc\.md:1: this block is never closed"),
    ("```pytb\nKeyError: 'x'\n```\n", r"doc\.md:2: a pytb block shows the error of the python block"),
    ("<!-- not run: why -->\n```yaml\nx: 1\n```\n", r"doc\.md:3: only python and console blocks are run"),
    ("<!-- run: on the moon -->\n```python\nx\n```\n", r"doc\.md:3: no environment 'on the moon'"),
    ("<!-- file: ../x.py -->\n```python\nx\n```\n", r"doc\.md:3: '\.\./x\.py' is outside"),
])
def test_broken_conventions_are_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, markdown: str,
                                       problem: str) -> None:
    with pytest.raises(DocError, match=problem):
        harness(tmp_path, monkeypatch, markdown)


def test_a_skipped_block_is_recorded_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = harness(tmp_path, monkeypatch, """\
        <!-- not run: needs a real Ray head at host:port -->
        ```python
        raise SystemExit("never run")
        ```
        """)
    assert [(b.line, b.argument) for b in run.skipped] == [(3, "needs a real Ray head at host:port")]


def test_a_doc_that_hangs_fails_within_its_time_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "DOC_TIME_LIMIT", 1)
    with pytest.raises(DocTimeout, match=r"doc\.md took over 1 s"):
        harness(tmp_path, monkeypatch, "```python\nimport time\ntime.sleep(30)\n```\n")


# -- docs/errors.md: every error it shows is reproduced ------------------------------------------------------


def test_every_error_in_the_errors_guide_is_reproduced_and_has_a_fix() -> None:
    doc = ROOT / "docs" / "errors.md"
    sections = re.split(r"^### ", doc.read_text(encoding="utf-8"), flags=re.M)[1:]
    assert 12 <= len(sections) <= 24
    for section in sections:
        title = section.splitlines()[0]
        blocks = parse(doc, section)
        checked = [b for b in blocks if b.lang == "pytb" or (b.lang == "console" and b.text.startswith("$ hwplace "))]
        assert checked, f"errors.md, {title!r}: shows no message that the tests reproduce (a pytb or console block)"
        assert not any(b.directive == "not run" for b in blocks), f"errors.md, {title!r}: every message is checked"
        assert "**Fix**" in section, f"errors.md, {title!r}: says no **Fix**"


# -- docs/api.md: one entry per public name ------------------------------------------------------------------


def api_headings() -> list[str]:
    return re.findall(r"^### `([^`]+)`", (ROOT / "docs" / "api.md").read_text(encoding="utf-8"), flags=re.M)


def names_in_hwplace_testing() -> list[str]:
    """The names hwplace.testing offers (its __all__), but its constants."""
    return [n for n in hwplace.testing.__all__ if not n.isupper()]


def test_the_api_reference_has_an_entry_for_every_public_name() -> None:
    headings = api_headings()
    public = [n for n in hwplace.__all__ if n != "__version__"]
    missing = [n for n in public if n not in headings]
    missing += [f"testing.{n}" for n in names_in_hwplace_testing() if f"testing.{n}" not in headings]
    assert not missing, f"docs/api.md has no entry (a heading: ### `NAME`) for {missing}"
    assert len(headings) == len(set(headings)), "docs/api.md has an entry twice"


def test_every_api_reference_entry_names_something_real() -> None:
    from hwplace_plugins.ray import pytest_plugin

    for heading in api_headings():
        module, _, attribute = heading.rpartition(".")
        if module == "testing":
            assert hasattr(hwplace.testing, attribute), f"docs/api.md: hwplace.testing has no {attribute!r}"
        elif module:
            pytest.fail(f"docs/api.md: `{heading}`: entries are hwplace's names, testing.NAME or a pytest fixture")
        else:
            assert heading in hwplace.__all__ or hasattr(pytest_plugin, heading), (
                f"docs/api.md: `{heading}` is not in hwplace.__all__, nor a fixture of hwplace's pytest plugin")


def anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives a markdown file's headings."""
    headings, in_code = [], False
    for line in doc.read_text(encoding="utf-8").splitlines():
        in_code ^= bool(FENCE.match(line))
        if not in_code and (heading := re.match(r"#+ (.+)$", line)):
            headings.append(heading[1])
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_api_reference_link_leads_to_a_guide_section() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)(?:#([^)]*))?\)", text)
    assert len(links) > 40
    for target, anchor in links:
        assert (ROOT / "docs" / target).is_file(), f"docs/api.md links to {target}, which does not exist"
        assert not anchor or anchor in anchors(ROOT / "docs" / target), f"{target} has no section #{anchor}"
