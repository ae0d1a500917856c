"""Two messaging pairs of one process, talking over gloo through a rendezvous of threads: worker ("a", 0) and
worker ("b", 0), placed by a fake cluster (tests/runtime/test_pair.py, and on a GPU
tests/plugins/cuda/test_pair_cuda.py)."""

from __future__ import annotations

import threading

import hwplace
from hwplace.contracts.capabilities import Rendezvous
from hwplace.contracts.executor import GroupEntry
from hwplace.contracts.records import Placement
from hwplace.runtime.messaging.communicator import Communicator, Member, connect
from hwplace.runtime.messaging.pair import Pair

SECTION = {"num_nodes": 1, "component_placement": {"trainer,rollout": "0-1"}}


class Store(Rendezvous):
    """The rendezvous of threads of one process."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.changed = threading.Condition()

    def kv_put(self, key: str, value: bytes) -> None:
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def kv_wait(self, key: str, timeout: float) -> bytes:
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.values, timeout):
                raise TimeoutError(key)
            return self.values[key]


def placements() -> tuple[list[Placement], list[Placement]]:
    cluster = hwplace.testing.fake_cluster(SECTION, accelerators_per_node=2)
    plan = hwplace.ComponentPlacement({"cluster": SECTION}, cluster)
    return plan.get_placements("trainer"), plan.get_placements("rollout")


def two_pairs(a: Placement, b: Placement) -> tuple[Pair, Pair]:
    """``a`` is worker ("a", 0), ``b`` worker ("b", 0); each one's pair to the other."""
    store = Store()

    def connector(key: str, members: tuple[Member, ...], index: int) -> Communicator:
        return connect(store, key, members, index, "127.0.0.1", None, timeout=30)

    entry_a = GroupEntry("a", "launch-a", (a,), ("127.0.0.1",))
    entry_b = GroupEntry("b", "launch-b", (b,), ("127.0.0.1",))
    return (Pair(connector, entry_a, 0, a, lambda: None, entry_b, 0),
            Pair(connector, entry_b, 0, b, lambda: None, entry_a, 0))
