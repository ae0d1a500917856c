"""hwplace.WeightSync on two nodes of each executor (tests/runtime_clusters.py): the plan's transports, versions,
atomicity, load_into, a corrupted bucket caught by its digest (the previous version kept), and the device ring's
memory bounded by its buckets."""

from __future__ import annotations

import os
import signal
import time
import warnings
from typing import Any
from unittest import mock

import pytest

import hwplace
from hwplace.runtime.weight_sync import buckets
from hwplace.runtime.weight_sync import source as source_module
from hwplace.runtime.weight_sync import sync as weights_module
from hwplace.testing import swapped_session

torch = pytest.importorskip("torch")
nn: Any = torch.nn
pytestmark = pytest.mark.time_limit(180)

# trainer rank 0 holds accelerator 0 of node 0; rollout 0 shares it, rollout 1 is on node 0, rollout 2 on node 1
CONFIG = {"cluster": {"num_nodes": 2, "component_placement": {"trainer": "0", "rollout": "0,2,4"}}}
CLUSTER = CONFIG["cluster"]


def state_dict(version: int) -> dict[str, Any]:
    """Every value equals the version, so a mix of two versions shows; the buckets are small, so there are many."""
    return {"embed.weight": torch.full((64, 32), float(version)), "norm.weight": torch.full((32,), float(version)),
            "norm.bias": torch.full((32,), float(version)),
            "head.weight": torch.full((32, 64), version, dtype=torch.bfloat16),
            "steps": torch.tensor(version, dtype=torch.int64)}


class Model(nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(32, 64, bias=False)
        self.norm = torch.nn.LayerNorm(32)
        self.head = torch.nn.Linear(64, 32, bias=False).to(torch.bfloat16)
        self.register_buffer("steps", torch.tensor(0))


class Trainer(hwplace.Worker):
    def publish(self, sync: hwplace.WeightSync, version: int) -> int:
        return sync.publish(state_dict(version))

    def publish_corrupted(self, sync: hwplace.WeightSync, version: int, state: dict[str, Any] | None = None) -> int:
        real = buckets.pack

        def corrupting(state: Any, bucket_bytes: int) -> Any:
            entries, buckets = real(state, bucket_bytes)

            def flipped() -> Any:
                for index, (bucket, digest) in enumerate(buckets):
                    if index == 1:  # after its digest was taken: what a bad link or a bug would do
                        bucket = bucket.copy()
                        bucket[3] ^= 0xFF
                    yield bucket, digest

            return entries, flipped()

        with mock.patch.object(source_module, "pack", corrupting):
            return sync.publish(state_dict(version) if state is None else state)


    def publish_state(self, sync: hwplace.WeightSync, state: dict[str, Any]) -> int:
        return sync.publish(state)

    def publish_big(self, sync: hwplace.WeightSync, version: int, corrupt: bool = False) -> int:
        """Two 4.4 MB tensors and a small one: each large one is a bucket of its own, and the version is over
        the 4 MiB that is packed in advance, so the digests follow the buckets."""
        state = {"a": torch.full((1_100_000,), float(version)), "b": torch.full((1_100_000,), float(version)),
                 "c": torch.full((3,), float(version))}
        if not corrupt:
            return sync.publish(state)
        return self.publish_corrupted(sync, version, state)

    def publish_through_slots(self, sync: hwplace.WeightSync, version: int) -> int:
        """Publish as if the tensors were on an accelerator: the device-share slots then carry them to the rank
        that shares it (here torch's CPU shared memory, standing in for CUDA IPC), the others read host copies."""
        with mock.patch.object(weights_module, "source_device", return_value=0):  # GPU 0, which rollout 0 holds
            return sync.publish(state_dict(version))

    def ring_bytes(self, sync: hwplace.WeightSync) -> tuple[int, int]:
        """The bytes this source's ring of device buckets holds, and its host buckets."""
        source = sync._state().source
        writer = None if source is None else source.same_device.writer
        return (0, 0) if writer is None else (writer.device_bytes, writer.host_bytes)

    def segments(self, sync: hwplace.WeightSync) -> int:
        """How many shared-memory segments this source holds for ``sync``."""
        source = sync._state().source
        return 0 if source is None else source.same_node.count

    def publish_until_one_dies(self, sync: hwplace.WeightSync, attempts: int) -> tuple[int, str, dict[Any, str]]:
        """Publish until a warning names a dead target: the version then, the warning, ``sync.dead_targets``."""
        for attempt in range(2, attempts + 2):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                version = sync.publish(state_dict(attempt))
            if caught:
                return version, str(caught[0].message), sync.dead_targets
            time.sleep(0.1)
        return attempts, "no warning", sync.dead_targets


class Rollout(hwplace.Worker):
    def latest(self, sync: hwplace.WeightSync, min_version: int) -> tuple[int, list[float]]:
        weights = sync.latest(min_version=min_version, timeout=60)
        return weights.version, sorted({float(v) for t in weights.tensors.values() for v in torch.unique(t.float())})

    def latest_or_error(self, sync: hwplace.WeightSync, min_version: int) -> str:
        try:
            return f"version {sync.latest(min_version=min_version, timeout=60).version}"
        except hwplace.WeightSyncError as exc:
            return f"WeightSyncError: {exc}"

    def load(self, sync: hwplace.WeightSync, min_version: int) -> tuple[int, float]:
        model = Model()
        version = sync.load_into(model, min_version=min_version, timeout=60)
        return version, float(model.head.weight.float().mean())

    def slots_mapped(self, sync: hwplace.WeightSync) -> int:
        intake = sync._state().intake
        reader = None if intake is None else intake.same_device.reader
        return 0 if reader is None else len(reader._mapped)

    def pid(self) -> int:
        return os.getpid()

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def publish(self, sync: hwplace.WeightSync) -> str:
        try:
            sync.publish(state_dict(1))
        except hwplace.WeightSyncError as exc:
            return str(exc)
        return "published"


@pytest.fixture(scope="module")
def groups(cluster: hwplace.Cluster):
    placement = hwplace.ComponentPlacement(CONFIG, cluster)
    trainer = Trainer.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer")
    rollout = Rollout.create_group().launch(cluster, placement.get_strategy("rollout"), name="rollout")
    sync = hwplace.WeightSync.create("policy", source="trainer", targets=("rollout",), source_rank=0,
                                     bucket_bytes=4096)
    yield trainer, rollout, sync
    trainer.shutdown()
    rollout.shutdown()


def test_the_plan_has_a_transport_per_target_rank(groups) -> None:
    _, _, sync = groups
    assert [(t.group, t.rank, t.node, t.transport) for t in sync.plan] == [
        ("rollout", 0, 0, "same-device"), ("rollout", 1, 0, "same-node"), ("rollout", 2, 1, "other-node")]


def test_versions_count_up_and_never_mix(groups) -> None:
    trainer, rollout, sync = groups
    first = rollout.latest(sync, 1)  # waits (on the board, or on its broadcast) for the first version
    assert trainer.publish(sync, 1).wait(timeout=60) == [1]
    assert first.wait(timeout=60) == [(1, [1.0])] * 3
    assert trainer.publish(sync, 2).wait(timeout=60) == [2]
    assert rollout.latest(sync, 2).wait(timeout=60) == [(2, [2.0])] * 3
    assert rollout.load(sync, 2).wait(timeout=60) == [(2, 2.0)] * 3


def test_a_corrupted_bucket_is_caught_and_the_previous_version_kept(groups) -> None:
    trainer, rollout, sync = groups
    rollout.latest(sync, 2).wait(timeout=60)
    [version] = trainer.publish_corrupted(sync, 3).wait(timeout=60)
    answers = rollout.latest_or_error(sync, version).wait(timeout=60)
    assert all(a.startswith("WeightSyncError") and "does not match its digest" in a for a in answers), answers
    assert rollout.latest(sync, 0).wait(timeout=60) == [(2, [2.0])] * 3
    [good] = trainer.publish(sync, 9).wait(timeout=60)
    assert good == version + 1
    assert rollout.latest(sync, good).wait(timeout=60) == [(good, [9.0])] * 3


def test_misuse_is_a_clear_error(groups, monkeypatch: pytest.MonkeyPatch) -> None:
    _, rollout, sync = groups
    assert "publish runs on its source, group 'trainer' rank 0" in rollout.execute_on(0).publish(sync).wait(
        timeout=60)[0]
    with pytest.raises(hwplace.ConfigError, match="no running worker group named 'rolout'"):
        hwplace.WeightSync.create("other", source="trainer", targets=("rolout",))
    with pytest.raises(hwplace.ConfigError, match="source_rank"):
        hwplace.WeightSync.create("other", source="trainer", targets=("rollout",), source_rank=3)
    with swapped_session(), pytest.raises(hwplace.HwplaceError, match="inside a worker"):
        sync.latest()  # on the driver (a session of its own: other tests host a worker in this process)


def test_a_tiny_version_travels_inside_its_announcement(groups) -> None:
    trainer, rollout, _ = groups
    sync = hwplace.WeightSync.create("tiny", source="trainer", targets=("rollout",))
    waiting = rollout.latest(sync, 1)
    assert trainer.publish_state(sync, {"w": torch.full((4,), 1.0)}).wait(timeout=60) == [1]
    assert waiting.wait(timeout=60) == [(1, [1.0])] * 3
    assert trainer.segments(sync).wait(timeout=60) == [0]  # no segment: the version was in the announcement


def test_segments_are_recycled_while_targets_keep_the_newest_version(groups) -> None:
    trainer, rollout, _ = groups
    sync = hwplace.WeightSync.create("recycled", source="trainer", targets=("rollout",))
    for version in range(1, 11):
        assert trainer.publish(sync, version).wait(timeout=60) == [version]
        assert rollout.latest(sync, version).wait(timeout=60) == [(version, [float(version)])] * 3
    assert trainer.segments(sync).wait(timeout=60)[0] in (1, 2, 3)  # not one per version


@pytest.fixture(scope="module")
def far(groups, cluster: hwplace.Cluster):
    """Two rollout ranks on node 1 only: every target of a sync to them is on another node."""
    group = Rollout.create_group().launch(cluster, hwplace.NodePlacementStrategy([1, 1]), name="far")
    yield group
    group.shutdown()


def test_to_other_nodes_only_versions_stream_straight_from_the_tensors(groups, far) -> None:
    trainer, _, _ = groups
    sync = hwplace.WeightSync.create("far", source="trainer", targets=("far",))
    assert [t.transport for t in sync.plan] == ["other-node", "other-node"]
    waiting = far.latest(sync, 1)  # before the targets join, a version is offered to the sender's thread
    assert trainer.publish(sync, 1).wait(timeout=60) == [1]
    assert waiting.wait(timeout=60) == [(1, [1.0])] * 2
    assert trainer.publish_big(sync, 2).wait(timeout=60) == [2]  # joined: sent in publish, digests after
    assert far.latest(sync, 2).wait(timeout=60) == [(2, [2.0])] * 2
    [bad] = trainer.publish_big(sync, 3, True).wait(timeout=60)
    answers = far.latest_or_error(sync, bad).wait(timeout=60)
    assert all(a.startswith("WeightSyncError") and "bucket 1 of 3 does not match its digest" in a
               for a in answers), answers
    assert far.latest(sync, 0).wait(timeout=60) == [(2, [2.0])] * 2
    assert trainer.publish(sync, 4).wait(timeout=60) == [4]
    assert far.latest(sync, 4).wait(timeout=60) == [(4, [4.0])] * 2
    assert trainer.segments(sync).wait(timeout=60) == [0]  # no target on the source's node: no copy there


@pytest.mark.parametrize("nodes", [[0, 0], [1, 1]], ids=["same node", "other node"])
def test_a_target_that_dies_is_named_and_the_others_keep_getting_versions(cluster: hwplace.Cluster,
                                                                          nodes: list[int]) -> None:
    source = Trainer.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="source")
    victim = Rollout.create_group().launch(cluster, hwplace.NodePlacementStrategy(nodes), name="victim")
    try:
        sync = hwplace.WeightSync.create("dies", source="source", targets=("victim",))
        waiting = victim.latest(sync, 1)
        source.publish(sync, 1).wait(timeout=60)
        assert waiting.wait(timeout=60) == [(1, [1.0])] * 2
        victim.execute_on(1).die()
        [(version, warning, dead)] = source.publish_until_one_dies(sync, 100).wait(timeout=120)
        assert warning.startswith(f"weight sync 'dies': the link to its target group 'victim' rank 1 (node "
                                  f"{nodes[1]}) broke"), warning
        assert warning.endswith("that worker has died or shut down; it gets no more versions, the other targets do")
        assert list(dead) == [("victim", 1)]
        assert source.publish(sync, 50).wait(timeout=60) == [version + 1]  # no error: the healthy one goes on
        assert victim.execute_on(0).latest(sync, version + 1).wait(timeout=60) == [(version + 1, [50.0])]
    finally:
        source.shutdown()
        victim.shutdown()


def test_a_rank_on_the_source_accelerator_reads_its_device_slots(groups) -> None:
    trainer, rollout, _ = groups
    sync = hwplace.WeightSync.create("slots", source="trainer", targets=("rollout",))
    for version in (1, 2, 3):
        waiting = rollout.latest(sync, version)
        assert trainer.publish_through_slots(sync, version).wait(timeout=60) == [version]
        assert waiting.wait(timeout=60) == [(version, [float(version)])] * 3
    # rank 0 shares the trainer's accelerator: it read slots (two, double-buffered); the others host copies
    assert rollout.slots_mapped(sync).wait(timeout=60) == [2, 0, 0]


def test_targets_that_all_share_the_source_accelerator_need_no_host_copy(groups, cluster: hwplace.Cluster) -> None:
    trainer, _, _ = groups
    on_the_same = hwplace.ComponentPlacement(CONFIG, cluster).get_strategy("trainer")  # the trainer's accelerator
    mate = Rollout.create_group().launch(cluster, on_the_same, name="mate")
    try:
        sync = hwplace.WeightSync.create("mate", source="trainer", targets=("mate",))
        assert [t.transport for t in sync.plan] == ["same-device"]
        waiting = mate.latest(sync, 1)
        assert trainer.publish_through_slots(sync, 1).wait(timeout=60) == [1]
        assert waiting.wait(timeout=60) == [(1, [1.0])]
        assert trainer.segments(sync).wait(timeout=60) == [0]
        assert mate.slots_mapped(sync).wait(timeout=60) == [1]
    finally:
        mate.shutdown()


def test_a_ring_smaller_than_the_model_bounds_the_source_and_every_version_arrives_whole(groups) -> None:
    trainer, rollout, _ = groups
    sync = hwplace.WeightSync.create("ring", source="trainer", targets=("rollout",), bucket_bytes="1KiB",
                                     device_buckets=3)
    assert "ring of 3 buckets of 1 KiB" in str(sync.plan)
    assert sync.plan.device_bytes(12_600) == {"source": 3 * 1024, "rollout 0": 12_600}
    for version in range(1, 9):  # 12,808 bytes a version: 3 buckets in the ring, 10 in host buckets
        assert trainer.publish_through_slots(sync, version).wait(timeout=60) == [version]
        assert rollout.latest(sync, version).wait(timeout=60) == [(version, [float(version)])] * 3
        assert trainer.ring_bytes(sync).wait(timeout=60) == [(3 * 1024, 12_808 - 3 * 1024)]
    assert rollout.load(sync, 8).wait(timeout=60) == [(8, 8.0)] * 3  # tensors across buckets too
    assert rollout.slots_mapped(sync).wait(timeout=60)[0] == 13


def test_bucket_sizes_out_of_bounds_are_refused_by_name(groups) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^device_buckets: .* \(got 0\); a whole number from 1 to 65536"):
        hwplace.WeightSync.create("bad", source="trainer", targets=("rollout",), device_buckets=0)
    with pytest.raises(hwplace.ConfigError, match=r"^bucket_bytes: is the size of one bucket \(got 0\)"):
        hwplace.WeightSync.create("bad", source="trainer", targets=("rollout",), bucket_bytes=0)


def test_a_target_that_has_not_asked_yet_holds_up_no_other(groups) -> None:
    trainer, rollout, _ = groups
    sync = hwplace.WeightSync.create("straggler", source="trainer", targets=("rollout",))
    first = rollout.execute_on(1).latest(sync, 1)  # ranks 0 and 2 have not asked for weights
    assert trainer.publish(sync, 1).wait(timeout=60) == [1]
    assert first.wait(timeout=60) == [(1, [1.0])]
    assert trainer.publish(sync, 2).wait(timeout=60) == [2]
    assert rollout.latest(sync, 2).wait(timeout=60) == [(2, [2.0])] * 3  # the late ones get the newest
