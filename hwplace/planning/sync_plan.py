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

What a sync costs in device memory (:func:`device_bytes`, :func:`memory_lines`, and :class:`SyncPlan`, the plan
with the numbers that decide it) follows from its plan alone: only a GPU the source shares with a target holds
anything, the source's ring of ``device_buckets`` buckets of ``bucket_bytes``
(:mod:`hwplace.runtime.weight_sync.device_ring`) and each such target's copy of the version ``latest()`` returned.
Imports the layers below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.config.weight_sync import DEFAULT_BUCKET_BYTES, DEFAULT_DEVICE_BUCKETS
from hwplace.contracts.records import Placement
from hwplace.foundation.sizes import format_size

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


RING_ALIGN = 256  # a device bucket's size is a multiple of this (each tensor starts at a multiple of it)


def ring_bucket_bytes(bucket_bytes: int) -> int:
    """The size of one device bucket: ``bucket_bytes`` rounded up to a multiple of :data:`RING_ALIGN`."""
    return -(-bucket_bytes // RING_ALIGN) * RING_ALIGN


def source_ring_bytes(model_bytes: int, bucket_bytes: int, device_buckets: int) -> tuple[int, int]:
    """The memory the source holds for a state dict of ``model_bytes`` (its tensors back to back), written again
    and again: on its GPU, the ring's buckets (two versions while both fit in half the ring, else one, at most
    ``device_buckets`` buckets), and in host shared memory, what of a version does not fit in the ring. (A model
    whose size changes may keep a bucket as large as it once was: never more than ``bucket_bytes`` each.)"""
    size = ring_bucket_bytes(bucket_bytes)
    count = max(1, -(-model_bytes // size))
    one = max(model_bytes, 1)
    if 2 * count <= device_buckets:
        return 2 * one, 0
    ring = min(one, device_buckets * size)
    return ring, one - ring


def device_bytes(plan: Sequence[SyncTarget], model_bytes: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 device_buckets: int = DEFAULT_DEVICE_BUCKETS) -> dict[str, int]:
    """The most GPU memory a sync takes besides the model, for a state dict of ``model_bytes``, by who holds it:
    ``"source"`` (its ring, when a target shares its GPU) and ``"<group> <rank>"`` for each same-device target
    (its copy of the version ``latest()`` returned; none with ``load_into``); ``{}`` without such a target."""
    shared = [t for t in plan if t.transport == SAME_DEVICE]
    if not shared:
        return {}
    ring, _ = source_ring_bytes(model_bytes, bucket_bytes, device_buckets)
    return {"source": ring, **{f"{t.group} {t.rank}": max(model_bytes, 1) for t in shared}}


def memory_lines(plan: Sequence[SyncTarget], source: str, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 device_buckets: int = DEFAULT_DEVICE_BUCKETS) -> list[str]:
    """What the sync costs in device memory, per device, in words (what ``hwplace plan`` and :class:`SyncPlan`
    print): ``source`` names the source (``trainer 0 (node 0, device 0)``)."""
    shared = [t for t in plan if t.transport == SAME_DEVICE]
    if not shared:
        return ["device memory: none (no target shares a device with the source)"]
    size = ring_bucket_bytes(bucket_bytes)
    return [f"device memory, for a model of M bytes (ring of {device_buckets} buckets of {format_size(size)}):",
            f"  source {source}: at most {format_size(device_buckets * size)}; 2 M while two versions fit in "
            "half the ring, else M up to the ring (the rest in host shared memory)",
            *(f"  {t.group} {t.rank} (node {t.node}, the source's device): M with latest(), 0 with load_into"
              for t in shared)]


class SyncPlan(tuple[SyncTarget, ...]):
    """A weight sync's plan: its targets (a tuple of :class:`SyncTarget`, in group then rank order), with what
    decides its device memory: the source (``source``: its group and rank, ``node``, ``devices``: node-local
    hardware ranks), ``bucket_bytes`` and ``device_buckets``. Printed, it lists both."""

    source: tuple[str, int]
    node: int
    devices: tuple[int, ...]
    bucket_bytes: int
    device_buckets: int

    def __new__(cls, targets: Sequence[SyncTarget], source: tuple[str, int], node: int, devices: Sequence[int],
                bucket_bytes: int = DEFAULT_BUCKET_BYTES, device_buckets: int = DEFAULT_DEVICE_BUCKETS) -> SyncPlan:
        made = super().__new__(cls, targets)
        made.source, made.node, made.devices = (source[0], source[1]), node, tuple(devices)
        made.bucket_bytes, made.device_buckets = bucket_bytes, device_buckets
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        return SyncPlan, (tuple(self), self.source, self.node, self.devices, self.bucket_bytes, self.device_buckets)

    def device_bytes(self, model_bytes: int) -> dict[str, int]:
        """See :func:`device_bytes`."""
        return device_bytes(self, model_bytes, self.bucket_bytes, self.device_buckets)

    def memory(self) -> list[str]:
        """See :func:`memory_lines`."""
        devices = ",".join(map(str, self.devices)) or "none"
        return memory_lines(self, f"{self.source[0]} {self.source[1]} (node {self.node}, device {devices})",
                            self.bucket_bytes, self.device_buckets)

    def __repr__(self) -> str:
        return "\n".join([f"SyncPlan({tuple.__repr__(self)})", *self.memory()])

    __str__ = __repr__


def sync_plan(source: Placement, who: tuple[str, int], targets: Mapping[str, Sequence[Placement]],
              bucket_bytes: int = DEFAULT_BUCKET_BYTES, device_buckets: int = DEFAULT_DEVICE_BUCKETS) -> SyncPlan:
    """:func:`plan_sync` of the source ``who`` (its group and rank) at ``source``, with what decides its device
    memory."""
    devices = source.local_hardware_ranks if source.local_accelerator_id >= 0 else ()
    return SyncPlan(plan_sync(source, targets), who, source.node_rank, devices, bucket_bytes, device_buckets)
