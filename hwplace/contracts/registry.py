"""The records of a cluster's registry: which job launched which group, where its workers run and which devices
they hold (device leases), as ``WorkerGroup.launch`` hands them to the executor and ``hwplace status`` shows them.

Records only; the code that builds them sits in the runtime, the code that keeps them in an executor plugin.
Imports nothing of hwplace.
"""

from __future__ import annotations

from dataclasses import dataclass

IDENTITY_PROPERTIES = ("uuid", "physical_id", "port", "url", "name")
"""Device properties that say which device it is on its node, whatever index a config gives it."""


@dataclass(frozen=True)
class DeviceLease:
    """One accelerator or device that a group's workers hold on one node.

    Two leases are of the same device when their :attr:`key` is equal: the node, the hardware type and the
    device's identity there (its UUID, port or name when its backend reports one, else its index).
    """

    hardware_type: str
    index: int
    identity: str
    node_id: str
    node_rank: int
    address: str
    ranks: tuple[int, ...]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.node_id, self.hardware_type, self.identity)

    def describe(self) -> str:
        """``"fake-accelerator 0 (uuid=FAKE-h-0) of node 1 (10.0.0.2)"``."""
        known = "" if self.identity == f"index={self.index}" else f" ({self.identity})"
        return f"{self.hardware_type} {self.index}{known} of node {self.node_rank} ({self.address})"


@dataclass(frozen=True)
class WorkerRecord:
    """Where one worker of a group runs: its rank, node and what it holds there (``"fake-accelerator 0,1"``); its
    ``state`` (``serving``, ``restarting``, ``dead``), the ``restarts`` it used and its last death's ``cause``."""

    rank: int
    node_rank: int
    node_id: str
    address: str
    hardware: str
    state: str = "serving"
    restarts: int = 0
    cause: str = ""


@dataclass(frozen=True)
class GroupRecord:
    """A launched group as the registry keeps it: its job's name, its own name, worker class, workers, leases."""

    job_name: str
    group: str
    worker_class: str
    workers: tuple[WorkerRecord, ...]
    leases: tuple[DeviceLease, ...]


@dataclass(frozen=True)
class LeaseConflict:
    """A device another live job holds: the lease asked for, and the holder's job and group."""

    lease: DeviceLease
    job_name: str
    job_id: str
    driver: str  # "pid 1234 on host-a"
    group: str

    def describe(self) -> str:
        return (f"{self.lease.describe()} is held by job {self.job_name!r} (id {self.job_id}, {self.driver}), "
                f"group {self.group!r}")
