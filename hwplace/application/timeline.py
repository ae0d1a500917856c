"""The timeline of a run (SPEC §13): ``hwplace run --trace FILE`` and ``--profile FILE``.

:func:`recording` gives the workers a folder to record their spans in (``HWPLACE_TRACE_DIR``, read by
:mod:`hwplace.foundation.trace`) for the length of a run; :func:`merge` turns the folder's files into one Chrome /
Perfetto trace: a process per node (``pid`` = node rank), a track per worker thread (``tid``; the worker's main
thread is named ``<group> rank <r>``), ``X`` (complete) events for the spans and ``M`` events naming the tracks.
``otherData.hwplace.tracks`` says, per track, the worker's group, rank, node and devices, which ``hwplace report``
reads. Imports the layers below and :mod:`hwplace.application.profiling`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwplace.application.profiling import build_profile
from hwplace.config.job_config import JobConfig
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.settings import TRACE_DIR
from hwplace.plugin.session import get_plugin_manager

FORMAT = "hwplace-trace/1"


@dataclass
class Recorded:
    """What :func:`recording` wrote, once its block has ended: the profile (None without a profile file)."""

    profile: dict[str, Any] | None = None


@contextlib.contextmanager
def recording(trace_file: str | None, profile_file: str | None,
              config: JobConfig | None = None) -> Iterator[Recorded]:
    """For the block, workers launched from this process record spans; after it (also when it raises: the trace
    of a failed run is the one worth reading) the trace goes to ``trace_file`` and the profile to ``profile_file``
    (with the placements and declared memory of ``config``), which the yielded :class:`Recorded` then holds too.
    Nothing when both are ``None``."""
    recorded = Recorded()
    if trace_file is None and profile_file is None:
        yield recorded
        return
    for option, path in (("--trace", trace_file), ("--profile", profile_file)):
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise ConfigError(option, "names a file in a folder that does not exist", value=path,
                              allowed="a file in an existing folder (it is written when the job ends)")
    folder = tempfile.mkdtemp(prefix="hwplace-trace-")
    before = os.environ.get(TRACE_DIR)
    os.environ[TRACE_DIR] = folder
    try:
        yield recorded
    finally:
        if before is None:
            os.environ.pop(TRACE_DIR, None)
        else:
            os.environ[TRACE_DIR] = before
        try:
            trace = merge(folder)
            if trace_file is not None:
                write_json(trace, trace_file)
            if profile_file is not None:
                placements = {name: spec.placement for name, spec in config.cluster.components.items()} \
                    if config is not None else {}
                recorded.profile = build_profile(trace, config.resources if config is not None else (), placements,
                                                 get_plugin_manager().node_backend().name)
                write_json(recorded.profile, profile_file)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def write_json(data: Any, path: str) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(data, file, separators=(",", ":"))
        file.write("\n")


def merge(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The Chrome trace of every worker file in ``folder`` (a line cut short by a crash is left out)."""
    tracks: dict[str, dict[str, Any]] = {}
    events: list[dict[str, Any]] = []
    spans: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (line, its worker's track)
    names: list[tuple[dict[str, Any], int, str]] = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        worker: dict[str, Any] | None = None
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if "track" in entry:
                worker = entry["track"]
            elif worker is None:
                continue
            elif "thread" in entry:
                names.append((worker, entry["thread"], entry["name"]))
            else:
                spans.append((entry, worker))
    origin = min((entry["ts"] for entry, _ in spans), default=0)
    for entry, worker in spans:
        event = {"ph": "X", "name": entry["n"], "cat": entry["c"], "ts": (entry["ts"] - origin) / 1000,
                 "dur": entry["d"] / 1000, "pid": worker["node"], "tid": entry["t"]}
        if "a" in entry:
            event["args"] = entry["a"]
        events.append(event)
    meta: list[dict[str, Any]] = []
    nodes = sorted({worker["node"] for worker, _, _ in names} | {worker["node"] for _, worker in spans})
    for node in nodes:
        meta.append({"ph": "M", "name": "process_name", "pid": node, "tid": 0, "args": {"name": f"node {node}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": node, "tid": 0, "args": {"sort_index": node}})
    ordered = sorted(names, key=lambda n: (n[0]["group"], n[0]["rank"], n[1] != n[0]["tid"], n[1]))
    for index, (worker, tid, thread) in enumerate(ordered):
        label = f"{worker['group']} rank {worker['rank']}"
        if tid != worker["tid"]:
            label += f": {thread}"
        meta.append({"ph": "M", "name": "thread_name", "pid": worker["node"], "tid": tid, "args": {"name": label}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": worker["node"], "tid": tid,
                     "args": {"sort_index": index}})
        tracks[f"{worker['node']}:{tid}"] = {"group": worker["group"], "rank": worker["rank"],
                                             "node": worker["node"], "devices": worker.get("devices", []),
                                             "host": worker.get("host"), "os_pid": worker.get("pid"),
                                             "thread": thread, "main": tid == worker["tid"]}
    events.sort(key=lambda e: (e["ts"], -e["dur"]))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"hwplace": {"format": FORMAT, "origin_ns": origin, "tracks": tracks}}}


def load_trace(path: str) -> dict[str, Any]:
    """A trace ``hwplace run --trace`` wrote; a :class:`~hwplace.ConfigError` naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as file:
            data: Any = json.load(file)
    except OSError as exc:
        raise ConfigError("FILE", f"cannot be read ({exc.strerror or exc})", value=path,
                          allowed="a trace written by hwplace run --trace FILE") from None
    except ValueError as exc:
        raise ConfigError("FILE", f"is not JSON ({exc})", value=path,
                          allowed="a trace written by hwplace run --trace FILE") from None
    other = data.get("otherData") if isinstance(data, dict) else None
    ours = other.get("hwplace") if isinstance(other, dict) else None
    if not isinstance(ours, dict) or ours.get("format") != FORMAT or not isinstance(data.get("traceEvents"), list):
        raise ConfigError("FILE", "is not a trace hwplace wrote (no otherData.hwplace of format "
                          f"{FORMAT!r})", value=path, allowed="a trace written by hwplace run --trace FILE")
    return data  # type: ignore[no-any-return]
