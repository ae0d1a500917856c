"""The ``cluster`` fixture, with which the runtime's end-to-end tests (tests/runtime/) run against both executors: Ray
(the session's local two-node Ray cluster) and hwplace's own process executor (``hwplace.testing.process_cluster``,
two simulated nodes of child processes).

Loaded for the whole suite by tests/conftest.py (``pytest_plugins``; one conftest, so that mypy sees one module of
that name). A module asks for the ``cluster`` fixture and may set ``CLUSTER`` to the ``cluster:`` section it needs
(default ``{"num_nodes": 2}``); every test of it then runs once per executor, each in a session of its own
(``hwplace.testing.swapped_session``), so channels and weight syncs created without ``cluster=`` reach that executor.
The executor is the test id's first part: ``test_x[ray]``, ``test_x[processes]``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

import hwplace
from hwplace.testing import Session, process_cluster, swapped_session

EXECUTORS = ("ray", "processes")
PRELOAD = [name for name in ("torch",) if importlib.util.find_spec(name)]  # the process cluster's workers import it
NODES, ACCELERATORS = 2, 4  # the shape of both: the session's Ray cluster (pyproject.toml) and the process one


@pytest.fixture(scope="module", params=EXECUTORS)
def executor_name(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        pytest.importorskip("ray")
    return str(request.param)


@pytest.fixture(scope="module")
def cluster(executor_name: str, request: pytest.FixtureRequest) -> Iterator[hwplace.Cluster]:
    config: dict[str, Any] = dict(getattr(request.module, "CLUSTER", {"num_nodes": NODES}))
    with swapped_session(Session(plugin_manager=hwplace.get_plugin_manager())):
        if executor_name == "ray":
            request.getfixturevalue("hwplace_local_ray")
            yield hwplace.Cluster(config)
        else:
            rest = {k: v for k, v in config.items() if k != "num_nodes"}
            with process_cluster(config.get("num_nodes", NODES), ACCELERATORS, cluster_cfg=rest,
                                 preload=PRELOAD) as made:
                yield made
