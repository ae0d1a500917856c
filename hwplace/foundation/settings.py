"""Every ``HWPLACE_*`` environment variable the core reads: its name, its default, and its reader.

One place, so a variable is never spelled two ways or read with two defaults. Plugins keep their own
variables (``HWPLACE_SERIAL_ROBOTS`` is the serial backend's). Imports only :mod:`hwplace.foundation.errors` and
:mod:`hwplace.foundation.sizes`.
"""

from __future__ import annotations

import math
import os
import sys

from hwplace.foundation.errors import ConfigError, PluginError
from hwplace.foundation.sizes import parse_size

DISABLED_PLUGINS = "HWPLACE_DISABLED_PLUGINS"
"""Plugins not to load, by name, comma-separated (``a,b``); default none."""

TRACE_PLUGINS = "HWPLACE_TRACE_PLUGINS"
"""``1`` (or true, yes, on) prints every hook call and its result to stderr; default off."""

DETECT_TIMEOUT = "HWPLACE_DETECT_TIMEOUT"
"""The time bound of one backend's ``detect``, in seconds; default :data:`DEFAULT_DETECT_TIMEOUT`."""

NODE_RANK = "HWPLACE_NODE_RANK"
"""A node's cluster-wide rank, set on the node (``HWPLACE_NODE_RANK=1 ray start ...``); wins over the order
the executor finds nodes in."""

FAKE_ACCELERATORS = "HWPLACE_FAKE_ACCELERATORS"
"""How many ``fake-accelerator`` devices the fake backend finds on a node; default 0."""

FAKE_ACCELERATOR_MEMORY = "HWPLACE_FAKE_ACCELERATOR_MEMORY"
"""The memory of each ``fake-accelerator`` (``Device.properties["memory_bytes"]``), of the fake backend and of
offline inventories alike: bytes, or an amount with a unit (``80GiB``); default
:data:`DEFAULT_FAKE_ACCELERATOR_MEMORY`."""

DEFAULT_FAKE_ACCELERATOR_MEMORY = "80GiB"

FAKE_ACCELERATOR = "fake-accelerator"
"""The fake backend's accelerator type (``hardware.type``, ``Placement.hardware_type``), the default of offline
inventories (``--nodes 2x4``, ``fake_cluster``)."""

FAKE_ROBOT = "fake-robot"
"""The fake backend's device type: one robot per ``hardware.configs`` entry."""

FAKE_VISIBLE_DEVICES = "FAKE_VISIBLE_DEVICES"
"""The fake accelerators a worker owns (node-local indices), as the fake backend isolates them."""

FAKE_ROBOTS = "FAKE_ROBOTS"
"""The fake robots a worker owns (their names), as the fake backend isolates them."""

JOB_NAME = "HWPLACE_JOB_NAME"
"""The name a job's groups and leases go by on a shared cluster (``hwplace status``); default: the name of the
script the driver runs (``hwplace run`` names a job after its config file)."""

LOG_LEVEL = "HWPLACE_LOG_LEVEL"
"""The level of workers' loggers (``DEBUG``, ``INFO``, ...); default ``INFO``."""

QUIET_WORKERS = "HWPLACE_QUIET_WORKERS"
"""``1`` keeps workers' output and the executor's own log lines (Ray's raylet warnings) out of the driver's
terminal: they stay in the executor's logs, which the executor names once. ``hwplace run`` sets it unless
given ``--worker-output``; default off (a script sees its workers' prints)."""

TRACE_DIR = "HWPLACE_TRACE_DIR"
"""A folder: every worker a driver with this variable launches records its spans there, one file per process
(``hwplace run --trace FILE`` sets it and merges the files into FILE); default unset, nothing recorded."""

LINK_BANDWIDTH = "HWPLACE_LINK_BANDWIDTH"
"""An emulated link between each pair of nodes, for benchmarks on one machine: the bytes per second a process may
send from its node to another (``100MB``: 100 MB/s, a token bucket per node pair,
:mod:`hwplace.runtime.weight_sync.link_model`); default unset, no emulation. Weight sync's sends to other nodes
honour it."""

DEFAULT_DETECT_TIMEOUT = 10.0
MAX_DETECT_TIMEOUT = 3600.0
_TRUE = frozenset({"1", "true", "yes", "on"})


def read_flag(name: str) -> bool:
    """Whether the variable ``name`` is set to 1, true, yes or on (any letter case)."""
    return os.environ.get(name, "").strip().lower() in _TRUE


def read_quiet_workers() -> bool:
    """``HWPLACE_QUIET_WORKERS``: whether workers' output and the executor's log lines stay out of the terminal."""
    return read_flag(QUIET_WORKERS)


def read_list(name: str) -> list[str]:
    """The comma-separated items of the variable ``name``, stripped, empty ones left out."""
    return [part.strip() for part in os.environ.get(name, "").split(",") if part.strip()]


def read_detect_timeout() -> float:
    """``HWPLACE_DETECT_TIMEOUT`` in seconds; :class:`~hwplace.PluginError` when it is not a usable number."""
    raw = os.environ.get(DETECT_TIMEOUT, "").strip()
    if not raw:
        return DEFAULT_DETECT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_DETECT_TIMEOUT:  # also refuses nan and inf
        raise PluginError(f"{DETECT_TIMEOUT} is {raw!r}; allowed: a number of seconds above 0 and at "
                          f"most {MAX_DETECT_TIMEOUT:g}")
    return value


def read_fake_accelerator_memory() -> int:
    """``HWPLACE_FAKE_ACCELERATOR_MEMORY`` in bytes (digits alone are bytes); ``80GiB`` when unset or empty. A value
    that is no amount of memory is a :class:`~hwplace.ConfigError` naming the variable."""
    raw = os.environ.get(FAKE_ACCELERATOR_MEMORY, "").strip() or DEFAULT_FAKE_ACCELERATOR_MEMORY
    return parse_size(int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 20 else raw,
                      FAKE_ACCELERATOR_MEMORY)


def read_link_bandwidth() -> int | None:
    """``HWPLACE_LINK_BANDWIDTH`` in bytes per second (digits alone, or an amount such as ``100MB``); ``None``
    when unset or empty. A value that is no amount, or 0, is a :class:`~hwplace.ConfigError` naming the variable."""
    raw = os.environ.get(LINK_BANDWIDTH, "").strip()
    if not raw:
        return None
    rate = parse_size(int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 20 else raw, LINK_BANDWIDTH)
    if rate <= 0:
        raise ConfigError(LINK_BANDWIDTH, "bytes per second above 0, such as 100MB", value=raw)
    return rate


def read_trace_dir() -> str | None:
    """``HWPLACE_TRACE_DIR``, the folder workers record their spans in; ``None`` when unset or empty."""
    return os.environ.get(TRACE_DIR, "").strip() or None


def trace_env() -> dict[str, str]:
    """What a worker's environment takes of the driver's to record spans: ``HWPLACE_TRACE_DIR`` when set."""
    folder = read_trace_dir()
    return {TRACE_DIR: folder} if folder else {}


def read_node_rank() -> str | None:
    """``HWPLACE_NODE_RANK`` as set (unchecked text: its reader says what is wrong with it), or ``None`` when unset."""
    return os.environ.get(NODE_RANK)


def read_log_level() -> str:
    """``HWPLACE_LOG_LEVEL``, upper-cased; ``INFO`` when unset."""
    return os.environ.get(LOG_LEVEL, "").strip().upper() or "INFO"


def read_job_name() -> str:
    """``HWPLACE_JOB_NAME``; when unset, the driver script's file name without ``.py`` (``python`` for none)."""
    raw = os.environ.get(JOB_NAME, "").strip()
    if raw:
        return raw[:100]
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    return script.removesuffix(".py") or "python"
