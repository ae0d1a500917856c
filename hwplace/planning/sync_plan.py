"""The plan of a weight sync: how each target rank gets the source's weights, chosen from the placements alone.

Pure functions over :class:`~hwplace.Placement` records, naming each transport by where the target runs (SPEC §9):
``same-device`` for a target holding an accelerator the source holds (CUDA IPC on GPUs), ``same-node`` for one on
the source's node (the node's shared memory, read in place), ``other-node`` for one elsewhere (over a
communicator). Each node other than the source's has a **relay**: its first target rank (in group then rank
order), to which the source sends each version once; the relay passes it on to that node's other target ranks
through the node's shared memory, so each byte crosses to each node once (:func:`relays`). The plan is what the
placements allow; ``publish`` confirms ``same-device`` per version from where
the tensors are (:mod:`hwplace.runtime.weight_sync.transports`). The ``weight_sync:`` section itself is parsed
in :mod:`hwplace.config.weight_sync`.
Imports the layers below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hwplace.contracts.records import Placement

SAME_DEVICE = "same-device"
SAME_NODE = "same-node"
OTHER_NODE = "other-node"
TRANSPORTS = (SAME_DEVICE, SAME_NODE, OTHER_NODE)


@dataclass(frozen=True)
class SyncTarget:
    """One target rank of a weight sync: its group, rank, node, and the transport its weights take; for an
    ``other-node`` target, ``relay``: the (group, rank) that relays to its node (its own for the relay itself)."""

    group: str
    rank: int
    node: int
    transport: str
    relay: tuple[str, int] | None = None

    @property
    def relays(self) -> bool:
        """Whether this target is its node's relay (the source sends it each version, it passes it on)."""
        return self.relay == (self.group, self.rank)

    @property
    def direct(self) -> bool:
        """Whether the source sends to this target itself (a target on its node, or a relay)."""
        return self.relay is None or self.relays


def share_accelerator(a: Placement, b: Placement) -> bool:
    """Whether two placements hold a common accelerator (same node, same type, a common device index)."""
    return (a.node_rank == b.node_rank and a.hardware_type == b.hardware_type and a.local_accelerator_id >= 0
            and b.local_accelerator_id >= 0 and bool(set(a.local_hardware_ranks) & set(b.local_hardware_ranks)))


def transport(source: Placement, target: Placement) -> str:
    """The transport from ``source`` to ``target``."""
    if share_accelerator(source, target):
        return SAME_DEVICE
    return SAME_NODE if source.node_rank == target.node_rank else OTHER_NODE


def plan_sync(source: Placement, targets: Mapping[str, Sequence[Placement]]) -> tuple[SyncTarget, ...]:
    """Every rank of every target group, in group then rank order, with its transport from ``source`` and, on
    another node, the relay of that node: its first target rank in that order."""
    first: dict[int, tuple[str, int]] = {}
    plan = []
    for group, placements in targets.items():
        for p in placements:
            how = transport(source, p)
            relay = first.setdefault(p.node_rank, (group, p.rank)) if how == OTHER_NODE else None
            plan.append(SyncTarget(group, p.rank, p.node_rank, how, relay))
    return tuple(plan)


def relays(plan: Sequence[SyncTarget]) -> dict[int, tuple[str, int]]:
    """The relay of each node other than the source's, by node."""
    return {t.node: (t.group, t.rank) for t in plan if t.relays}


def relayed(plan: Sequence[SyncTarget], relay: tuple[str, int]) -> tuple[SyncTarget, ...]:
    """The targets ``relay`` passes each version on to (its node's other target ranks)."""
    return tuple(t for t in plan if t.relay == relay and not t.relays)
