"""The plain-node backend passes the conformance kit every backend author runs."""

from __future__ import annotations

from hwplace.testing import BackendConformance
from hwplace_plugins import node


class TestPlainNode(BackendConformance):
    plugin = node
    backend_name = "node"
