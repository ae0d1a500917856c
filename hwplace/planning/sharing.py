"""Which processes of different components share an accelerator: the colocated components that take turns.

Pure functions over :class:`Placement` records; ``hwplace plan`` prints what they find and the executor starts
a turn arbiter on each node where it finds something. :func:`message_path` says, from the same facts, how
tensors on accelerators travel between two workers (NCCL refuses two ranks on one GPU). Imports the contracts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hwplace.contracts.records import Placement

Unit = tuple[str, int]  # an accelerator on its node: its hardware type and node-local index
HOST, NCCL = "host", "nccl"  # the paths of a pair's device tensors: through host memory (gloo), or NCCL


@dataclass(frozen=True, order=True)
class Share:
    """An accelerator a process shares with a process of another component: ``hardware_type`` ``index`` of node
    ``node_rank``, shared with rank ``rank`` of ``component``."""

    node_rank: int
    hardware_type: str
    index: int
    component: str
    rank: int

    def __str__(self) -> str:
        return (f"shares {self.hardware_type} {self.index} (node {self.node_rank}) with {self.component} "
                f"rank {self.rank}")


def accelerator_units(placement: Placement) -> tuple[Unit, ...]:
    """The accelerators a process owns, as ``(hardware_type, index)`` on its node; none for a process placed on
    a node or on devices (it has no own accelerator)."""
    if placement.local_accelerator_id < 0:
        return ()
    return tuple((placement.hardware_type, index) for index in placement.local_hardware_ranks)


def shared_accelerators(components: Mapping[str, Sequence[Placement]]) -> dict[tuple[str, int], tuple[Share, ...]]:
    """For each ``(component, rank)`` that shares an accelerator with another component, what it shares with whom.

    Processes of one component may sit on one accelerator without taking turns: only different components do.
    """
    users: dict[tuple[int, str, int], list[tuple[str, int]]] = {}
    for name, placements in components.items():
        for placement in placements:
            for hardware_type, index in accelerator_units(placement):
                users.setdefault((placement.node_rank, hardware_type, index), []).append((name, placement.rank))
    found: dict[tuple[str, int], set[Share]] = {}
    for (node_rank, hardware_type, index), who in users.items():
        for name, rank in who:
            for other, other_rank in who:
                if other != name:
                    found.setdefault((name, rank), set()).add(Share(node_rank, hardware_type, index, other, other_rank))
    return {key: tuple(sorted(shares)) for key, shares in sorted(found.items())}


def message_path(a: Placement, b: Placement, backends: tuple[str, str] = ("nccl", "nccl"),
                 physical: tuple[str, str] = ("", "")) -> str:
    """How tensors on accelerators travel between the workers placed at ``a`` and ``b``: :data:`NCCL` (device
    to device), or :data:`HOST` (copied to host memory, sent over gloo, put back on the receiver's device).

    NCCL only when both hold accelerators, each worker can use NCCL (``backends``: the collective backend each
    one's accelerator backend names and its process can load, ``""`` for none), and they hold no GPU in common:
    not one accelerator of one node (the placements say so: the colocated components that take turns), nor one
    physical GPU seen otherwise, such as two MIG slices of it (``physical``: each worker's device id, its node
    and PCI address, where known). NCCL refuses two ranks on one GPU ("Duplicate GPU detected").
    """
    if a.local_accelerator_id < 0 or b.local_accelerator_id < 0 or backends != (NCCL, NCCL):
        return HOST
    if a.node_rank == b.node_rank and set(accelerator_units(a)) & set(accelerator_units(b)):
        return HOST
    return HOST if physical[0] and physical[0] == physical[1] else NCCL
