"""hwplace.WeightSync on a real two-node Ray cluster: the plan's transports, versions, atomicity, load_into,
and a corrupted bucket caught by its digest (the previous version kept)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

import hwplace
from hwplace.pytest_plugin import LocalRay
from hwplace.runtime import buckets, current
from hwplace.runtime import weights as weights_module

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
nn: Any = torch.nn
pytestmark = pytest.mark.time_limit(180)

# trainer rank 0 holds accelerator 0 of node 0; rollout 0 shares it, rollout 1 is on node 0, rollout 2 on node 1
CONFIG = {"cluster": {"num_nodes": 2, "component_placement": {"trainer": "0", "rollout": "0,2,4"}}}


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

    def publish_corrupted(self, sync: hwplace.WeightSync, version: int) -> int:
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

        with mock.patch.object(weights_module, "pack", corrupting):
            return sync.publish(state_dict(version))


class Rollout(hwplace.Worker):
    def latest(self, sync: hwplace.WeightSync, min_version: int) -> tuple[int, list[float]]:
        weights = sync.latest(min_version=min_version, timeout=60)
        return weights.version, sorted({float(v) for t in weights.tensors.values() for v in t.float().reshape(-1)})

    def latest_or_error(self, sync: hwplace.WeightSync, min_version: int) -> str:
        try:
            return f"version {sync.latest(min_version=min_version, timeout=60).version}"
        except hwplace.WeightSyncError as exc:
            return f"WeightSyncError: {exc}"

    def load(self, sync: hwplace.WeightSync, min_version: int) -> tuple[int, float]:
        model = Model()
        version = sync.load_into(model, min_version=min_version, timeout=60)
        return version, float(model.head.weight.float().mean())

    def publish(self, sync: hwplace.WeightSync) -> str:
        try:
            sync.publish(state_dict(1))
        except hwplace.WeightSyncError as exc:
            return str(exc)
        return "published"


@pytest.fixture(scope="module")
def groups(hwplace_local_ray: LocalRay):
    cluster = hwplace.Cluster(CONFIG["cluster"])
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
        ("rollout", 0, 0, "shared-memory"), ("rollout", 1, 0, "object-store"), ("rollout", 2, 1, "broadcast")]


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
    monkeypatch.setattr(current, "_context", [])  # other tests host a worker in this process
    with pytest.raises(hwplace.HwplaceError, match="inside a worker"):
        sync.latest()
