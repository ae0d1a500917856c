"""The records the layers above pass around: a :class:`Node`, a process's :class:`Placement`, a worker's
:class:`WorkerContext`. Records only; the code that builds them sits above. Imports the foundation and the
hardware contract."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hwplace.contracts.hardware import Device
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.frozen import FrozenDict
from hwplace.foundation.wording import safe_repr


@dataclass(frozen=True)
class Node:
    """One node: its cluster-wide ``rank``, the executor's ``node_id``, and its hardware by backend name.

    ``problems`` maps what failed on this node (a backend's name, or ``plugin 'x'``) to the reason.
    Immutable: ``hardware`` and ``problems`` are read-only mappings.
    """

    rank: int
    node_id: str
    address: str
    hardware: Mapping[str, tuple[Device, ...]] = field(default_factory=FrozenDict)
    problems: Mapping[str, str] = field(default_factory=FrozenDict)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ConfigError("nodes", f"node {self.node_id!r} has rank {safe_repr(self.rank)}",
                              allowed="a node rank is a non-negative integer")
        hardware = {str(name): tuple(devices) for name, devices in self.hardware.items()}
        for name, devices in hardware.items():
            if not all(isinstance(d, Device) for d in devices):
                raise ConfigError("nodes", f"node {self.rank}: hardware[{name!r}] holds something that is not "
                                  "a hwplace.Device")
        object.__setattr__(self, "hardware", FrozenDict(hardware))
        object.__setattr__(self, "problems", FrozenDict({str(k): str(v) for k, v in self.problems.items()}))

    def devices(self, hardware_type: str) -> tuple[Device, ...]:
        """This node's devices of one hardware type (empty when it has none)."""
        return self.hardware.get(hardware_type, ())


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one process runs and what it sees; immutable (tuples and a read-only ``env``) and picklable."""

    rank: int
    node_id: str
    node_rank: int
    local_accelerator_id: int
    local_rank: int
    local_world_size: int
    visible_accelerators: tuple[int, ...]
    isolate_accelerator: bool
    local_hardware_ranks: tuple[int, ...]
    hardware_type: str
    node_group: str
    env: FrozenDict[str, str]


@dataclass(frozen=True)
class WorkerContext:
    """Who a worker is: its group, rank, group size, placement, the environment hwplace set for it, and the
    name of the executor running it (its channels are started through that executor). ``attempt`` counts the
    restarts in place of this rank (0: its first process) and ``cause`` says why the last one ended."""

    group: str
    rank: int
    world_size: int
    placement: Placement
    env: Mapping[str, str]
    executor: str = ""
    attempt: int = 0
    cause: str = ""


@dataclass(frozen=True)
class RestartInfo:
    """What ``Worker.on_restart(info)`` is told: its ``rank``, the ``attempt`` (1 for the first restart) and the
    ``cause`` of the death it replaces."""

    rank: int
    attempt: int
    cause: str
