"""pytest fixtures for suites that run workers on Ray: one local multi-node Ray cluster per test session.

Part of the Ray executor's plugin, loaded through the ``pytest11`` entry point ``hwplace-ray``; it imports Ray
only when a test asks for the fixture.
The cluster's shape comes from the ini options ``hwplace_ray_nodes`` (default 2) and
``hwplace_ray_accelerators`` (fake accelerators per node, default 4).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from hwplace.testing import local_ray_cluster


@dataclass(frozen=True)
class LocalRay:
    """The session's local Ray cluster: its address and shape."""

    address: str
    num_nodes: int
    accelerators_per_node: int


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("hwplace_ray_nodes", "nodes of the session's local Ray cluster", default="2")
    parser.addini("hwplace_ray_accelerators", "fake accelerators on each of its nodes", default="4")


@pytest.fixture(scope="session")
def hwplace_local_ray(pytestconfig: pytest.Config) -> Iterator[LocalRay]:
    """A real multi-node Ray cluster on this machine (``hwplace.testing.local_ray_cluster``), shared by the
    session; the driver stays connected to it until the session ends."""
    nodes = int(pytestconfig.getini("hwplace_ray_nodes"))
    accelerators = int(pytestconfig.getini("hwplace_ray_accelerators"))
    with local_ray_cluster(nodes, accelerators) as address:
        yield LocalRay(address, nodes, accelerators)
