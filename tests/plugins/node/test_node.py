"""The plain-node backend: the node itself as one resource."""

from __future__ import annotations

import os

from hwplace_plugins.node import PlainNode


def test_reports_this_node() -> None:
    (device,) = PlainNode().detect([])
    assert device.index == 0
    assert device.healthy
    assert device.properties["cpus"] >= 1
    assert device.properties["cpus"] <= (os.cpu_count() or 1)
    assert device.properties["memory_bytes"] > 2**20
    assert device.properties["address"]
    assert device.properties["hostname"]


def test_asks_for_no_isolation() -> None:
    assert PlainNode().isolation_env([PlainNode().detect([])[0]]) == {}
    assert (PlainNode.name, PlainNode.kind) == ("node", "node")
