"""Running the GPU checks: hwplace importable without installing it, one fresh interpreter per check with a time
limit, and the JSON report.

:func:`importable` puts a directory on ``sys.path`` (and ``PYTHONPATH``, for the checks' own processes) that
holds ``hwplace`` and ``hwplace_plugins`` as links into this repository and a ``hwplace-0.0.dist-info`` whose
``entry_points.txt`` is pyproject.toml's ``[project.entry-points.hwplace]``, so the plugin manager finds the
built-in plugins as if hwplace were installed. A check is a function registered with :func:`check`: it returns
the numbers it measured (``pass``) or raises :class:`CheckFailed`, :class:`CheckSkipped` or :class:`CheckHung`;
any other exception is ``error``. :func:`orchestrate` runs each in a new session (its spawned processes with it),
sends SIGUSR1 (every thread's stack to the log) and then SIGKILL to the session of one that outlives its limit,
and goes on.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
ENTRY = BENCHMARKS / "gpu_check.py"
SHIM_VARIABLE = "HWPLACE_GPU_CHECK_SHIM"
STATUSES = ("pass", "fail", "error", "hang", "skip")
LOG_TAIL = 4000  # characters of a check's log kept in the report when it does not pass


# -- hwplace without installing it ---------------------------------------------------------------------------


def entry_points(pyproject: Path = REPO / "pyproject.toml") -> str:
    """The ``[hwplace]`` section of an ``entry_points.txt``: pyproject.toml's ``[project.entry-points.hwplace]``."""
    lines, inside = ["[hwplace]"], False
    for line in pyproject.read_text(encoding="utf-8").splitlines():
        stripped = line.split("#", 1)[0].strip()
        if stripped.startswith("["):
            inside = stripped == "[project.entry-points.hwplace]"
        elif inside and (found := re.fullmatch(r'([\w.-]+)\s*=\s*"([^"]+)"', stripped)):
            lines.append(f"{found[1]} = {found[2]}")
    if len(lines) == 1:
        raise RuntimeError(f"{pyproject} has no [project.entry-points.hwplace] entries")
    return "\n".join(lines) + "\n"


def importable() -> Path:
    """Make this repository's hwplace importable here and in every process started from here; the shim dir."""
    shim = Path(os.environ.get(SHIM_VARIABLE, ""))
    if not os.environ.get(SHIM_VARIABLE) or not (shim / "hwplace").exists():
        shim = Path(tempfile.mkdtemp(prefix="hwplace-gpu-check-"))
        (shim / "hwplace").symlink_to(REPO / "hwplace", target_is_directory=True)
        (shim / "hwplace_plugins").symlink_to(REPO / "plugins", target_is_directory=True)
        info = shim / "hwplace-0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hwplace\nVersion: 0.0\n", encoding="utf-8")
        (info / "entry_points.txt").write_text(entry_points(), encoding="utf-8")
        os.environ[SHIM_VARIABLE] = str(shim)
    for path in (str(BENCHMARKS), str(shim)):
        if path not in sys.path:
            sys.path.insert(0, path)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(shim), str(BENCHMARKS), *parts])
    return shim


# -- the registry --------------------------------------------------------------------------------------------


class Outcome(Exception):
    """A check's result other than ``pass``: a status, a message and the details measured so far."""

    status = "error"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class CheckFailed(Outcome):
    status = "fail"


class CheckSkipped(Outcome):
    status = "skip"


class CheckHung(Outcome):
    status = "hang"


@dataclass(frozen=True)
class Check:
    """One check: ``function(gpu)`` returns its details; ``limit`` seconds; ``cpu``: whether it has something to
    run without a GPU; ``known_defect``: a ``fail`` shows a defect issue ``issue`` names (still open)."""

    name: str
    function: Callable[[bool], dict[str, Any]]
    limit: float
    cpu: bool
    issue: str
    known_defect: bool


CHECKS: dict[str, Check] = {}
MODULES = ("gpu_checks.nvml_checks", "gpu_checks.slot_checks", "gpu_checks.nccl_checks", "gpu_checks.e2e_checks")


def check(name: str, limit: float, *, cpu: bool = True, issue: str = "",
          known_defect: bool = False) -> Callable[[Callable[[bool], dict[str, Any]]], Callable[[bool], dict[str, Any]]]:
    """Register a check (in the order the modules define them)."""

    def register(function: Callable[[bool], dict[str, Any]]) -> Callable[[bool], dict[str, Any]]:
        CHECKS[name] = Check(name, function, limit, cpu, issue, known_defect)
        return function

    return register


def load_checks() -> dict[str, Check]:
    import importlib

    for module in MODULES:
        importlib.import_module(module)
    return CHECKS


def traceback_tail(exc: BaseException, limit: int = 3000) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-limit:]


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {str(exc)[:2000]}"


def watch_stacks() -> None:
    """SIGUSR1 prints every thread's stack to stderr (the harness sends it to a check about to be killed)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


# -- one check, in its own interpreter -----------------------------------------------------------------------


def run_one(name: str, gpu: bool, result: Path) -> None:
    watch_stacks()
    checks = load_checks()
    started = time.monotonic()
    try:
        found: dict[str, Any] = {"status": "pass", "details": checks[name].function(gpu)}
    except Outcome as outcome:
        found = {"status": outcome.status, "details": {"message": outcome.message, **outcome.details}}
    except BaseException as exc:
        found = {"status": "error", "details": {"exception": error_text(exc), "traceback": traceback_tail(exc)}}
    found["seconds"] = round(time.monotonic() - started, 3)
    result.write_text(json.dumps(found, default=str, indent=1), encoding="utf-8")


def environment() -> dict[str, Any]:
    """Versions, the GPUs, and what decides whether CUDA IPC through pidfd_getfd is allowed."""
    found: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                             "executable": sys.executable, "cpu_count": os.cpu_count(),
                             "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                             "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    with contextlib.suppress(OSError):
        found["ptrace_scope"] = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found["hwplace_commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                                 text=True, timeout=10).stdout.strip() or None
    try:
        import torch

        found.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
        if found["cuda_available"]:
            found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            found["gpus"] = [{"name": p.name, "total_memory": p.total_memory, "uuid": str(p.uuid),
                              "capability": f"{p.major}.{p.minor}", "multi_processor_count": p.multi_processor_count}
                             for p in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))]
    except Exception as exc:
        found["torch_error"] = error_text(exc)
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            found["driver"] = pynvml.nvmlSystemGetDriverVersion()
            found["cuda_driver"] = pynvml.nvmlSystemGetCudaDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        found["nvml_error"] = error_text(exc)
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            found["nvidia_smi_L"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                                   timeout=30).stdout.strip()
    return found


# -- all of them ---------------------------------------------------------------------------------------------


def _kill_session(process: subprocess.Popen[bytes], stacks: bool) -> None:
    """End a check's session (its own processes and the ones it spawned): stacks first when ``stacks``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if stacks:
            os.killpg(process.pid, signal.SIGUSR1)
            time.sleep(2)
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


def _child(args: list[str], log: Path, limit: float) -> tuple[int | None, float, bool]:
    """Run this script with ``args`` in a new session; (return code, seconds, whether it outlived ``limit``)."""
    started = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, str(ENTRY), *args], stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
        try:
            code: int | None = process.wait(limit)
            hung = False
        except subprocess.TimeoutExpired:
            code, hung = None, True
        _kill_session(process, stacks=hung)  # the spawned processes a finished check left behind go too
    return code, time.monotonic() - started, hung


def _tail(log: Path) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL:]
    return ""


def run_check(item: Check, gpu: bool, logs: Path, limit: float) -> dict[str, Any]:
    log, result = logs / f"{item.name}.log", logs / f"{item.name}.json"
    result.unlink(missing_ok=True)
    code, seconds, hung = _child(["--one", item.name, "--mode", "gpu" if gpu else "cpu", "--result", str(result)],
                                 log, limit)
    found: dict[str, Any]
    if result.exists():
        found = json.loads(result.read_text(encoding="utf-8"))
    elif hung:
        found = {"status": "hang", "details": {"message": f"still running after its limit of {limit:.0f} s: "
                                                          "killed (its threads' stacks are in the log)"}}
    else:
        found = {"status": "error", "details": {"message": f"the check's process ended with code {code} "
                                                           "without a result"}}
    found["seconds"] = round(seconds, 3)
    found["limit_s"] = round(limit, 1)
    found.update(issue=item.issue, known_defect=item.known_defect)
    if found["status"] != "pass":
        found["log_tail"] = _tail(log)
    return found


def orchestrate(out: Path, cpu: bool, budget: float, only: list[str]) -> dict[str, Any]:
    started = time.monotonic()
    checks = load_checks()
    logs = out.parent / f"{out.stem}_logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    env_file = logs / "environment.json"
    _child(["--environment", str(env_file)], logs / "environment.log", 120)
    env = json.loads(env_file.read_text(encoding="utf-8")) if env_file.exists() else {"error": _tail(
        logs / "environment.log")}
    gpu = not cpu and bool(env.get("cuda_available"))
    why = "--cpu given" if cpu else "" if gpu else "torch.cuda.is_available() is False"
    report: dict[str, Any] = {"mode": "gpu" if gpu else "cpu", "mode_reason": why, "environment": env, "checks": {}}
    for item in checks.values():
        if only and item.name not in only:
            continue
        left = budget - (time.monotonic() - started)
        if not gpu and not item.cpu:
            found = {"status": "skip", "seconds": 0.0, "details": {"message": f"needs a CUDA GPU ({why})"}}
        elif left < 15:
            found = {"status": "skip", "seconds": 0.0, "details": {"message": f"the run's budget of {budget:.0f} s "
                                                                              "is spent"}}
        else:
            found = run_check(item, gpu, logs, min(item.limit, left - 5))
        found.setdefault("issue", item.issue)
        found.setdefault("known_defect", item.known_defect)
        report["checks"][item.name] = found
        print(summary_line(item.name, found), flush=True)
    report["seconds"] = round(time.monotonic() - started, 1)
    report["counts"] = {s: sum(c["status"] == s for c in report["checks"].values()) for s in STATUSES}
    out.write_text(json.dumps(report, default=str, indent=1), encoding="utf-8")
    return report


def summary_line(name: str, found: dict[str, Any]) -> str:
    details = found.get("details", {})
    note = details.get("message") or details.get("summary") or ""
    return f"{found['status']:5} {name:24} {found['seconds']:7.1f} s  {str(note).splitlines()[0][:150] if note else ''}"
