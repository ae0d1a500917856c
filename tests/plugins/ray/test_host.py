"""The worker's side of the Ray executor (``plugins/ray/host.py``): what a worker process loads before it answers."""

from __future__ import annotations

from typing import Any

import pytest

import hwplace
from hwplace_plugins.ray.pytest_plugin import LocalRay

ray = pytest.importorskip("ray")

# The probe's class is made from source in a module of its own that no worker can import, so it travels by value:
# a worker loads only what hosting it takes, not this test module (nor pytest) with it.
PROBE = '''
import sys

import hwplace


class Probe(hwplace.Worker):
    def modules(self):
        return sorted(name for name in sys.modules if name.split(".")[0] in ("hwplace", "hwplace_plugins"))
'''

DRIVER_SIDE = [
    "hwplace_plugins.ray.runtime",  # groups and handles
    "hwplace_plugins.ray.executor",  # the cluster's discovery, leases, registry
    "hwplace.runtime.restarts",  # the supervisor of a group's ranks
    "hwplace.runtime.group",  # launching groups
    "hwplace.plugin.manager",  # hooks and detection: a worker looks its executor up only when it uses it
    "hwplace.contracts.registry",  # the registry's records
    "hwplace.config",  # parsing configs
    "hwplace.planning",  # placement
]


def probe_class() -> Any:
    namespace: dict[str, Any] = {"__name__": "hwplace_host_probe"}
    exec(compile(PROBE, "<probe>", "exec"), namespace)  # a fixed source: a class that travels by value
    return namespace["Probe"]


def test_a_worker_process_loads_the_host_and_not_the_drivers_side(hwplace_local_ray: LocalRay) -> None:
    cluster = hwplace.Cluster({"num_nodes": 1})
    group = probe_class().create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="host-probe")
    try:
        [loaded] = group.modules().wait(timeout=120)
    finally:
        group.shutdown()
    assert "hwplace_plugins.ray.host" in loaded, loaded
    assert "hwplace.runtime.hosting" in loaded, loaded
    assert "hwplace_host_probe" not in loaded  # the probe came by value: what is listed is what hosting took
    found = [name for name in loaded if any(name == m or name.startswith(f"{m}.") for m in DRIVER_SIDE)]
    assert found == [], f"a worker process loaded the driver's side: {found} (of {len(loaded)}: {loaded})"
