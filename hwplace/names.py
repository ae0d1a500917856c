"""The names hwplace and its plugins share, from one place: the environment variables hwplace reads or sets, and
the fake backend's hardware types and isolation variables. Plugins import them from here (a public face, like
:mod:`hwplace.executor`); the core's own modules import :mod:`hwplace.foundation.settings`, where they are
defined. No module of hwplace imports this one.
"""

from __future__ import annotations

from hwplace.foundation.settings import (
    DEFAULT_FAKE_ACCELERATOR_MEMORY,
    DETECT_TIMEOUT,
    DISABLED_PLUGINS,
    FAKE_ACCELERATOR,
    FAKE_ACCELERATOR_MEMORY,
    FAKE_ACCELERATORS,
    FAKE_ROBOT,
    FAKE_ROBOTS,
    FAKE_VISIBLE_DEVICES,
    JOB_NAME,
    LOG_LEVEL,
    NODE_RANK,
    TRACE_PLUGINS,
)

__all__ = [
    "DEFAULT_FAKE_ACCELERATOR_MEMORY",
    "DETECT_TIMEOUT",
    "DISABLED_PLUGINS",
    "FAKE_ACCELERATOR",
    "FAKE_ACCELERATORS",
    "FAKE_ACCELERATOR_MEMORY",
    "FAKE_ROBOT",
    "FAKE_ROBOTS",
    "FAKE_VISIBLE_DEVICES",
    "JOB_NAME",
    "LOG_LEVEL",
    "NODE_RANK",
    "TRACE_PLUGINS",
]
