"""hwplace.WeightSync to a node of several target ranks, through its relay, on two nodes of each executor
(tests/runtime_clusters.py): the bytes leaving the source's node per version (counted, once per node whatever the
ranks), every rank getting each version intact, and a relay that dies: restarted, its node's ranks get versions
again through the new process; not restarted, their ``latest()`` is a ``WeightSyncError`` naming it, and the
source names it in ``dead_targets``."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

import hwplace
from hwplace.runtime.weight_sync.link_model import traffic

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.time_limit(240)

# the trainer on node 0; three rollout ranks on node 1: rank 0 relays to ranks 1 and 2
CONFIG = {"cluster": {"num_nodes": 2, "component_placement": {"trainer": "0", "rollout": "4-6"}}}
CLUSTER = CONFIG["cluster"]
WORDS = 250_000  # 1 MB of float32 per version, in two tensors


def state_dict(version: int) -> dict[str, Any]:
    """Every value equals the version, so a mix of two versions shows."""
    return {"a": torch.full((WORDS - 3,), float(version)), "b": torch.full((3,), float(version))}


class Trainer(hwplace.Worker):
    def publish(self, sync: hwplace.WeightSync, version: int) -> int:
        return sync.publish(state_dict(version))

    def sent(self) -> dict[tuple[int, int], int]:
        """The bytes this process has sent to each other node, by (its node, the other)."""
        return dict(traffic().sent)

    def dead_targets(self, sync: hwplace.WeightSync) -> list[tuple[str, int]]:
        return sorted(sync.dead_targets)


class Rollout(hwplace.Worker):
    def latest(self, sync: hwplace.WeightSync, min_version: int) -> tuple[int, list[float]]:
        weights = sync.latest(min_version=min_version, timeout=120)
        return weights.version, sorted({float(v) for t in weights.tensors.values() for v in torch.unique(t.float())})

    def latest_or_error(self, sync: hwplace.WeightSync, min_version: int) -> str:
        try:
            return f"version {sync.latest(min_version=min_version, timeout=120).version}"
        except hwplace.WeightSyncError as exc:
            return f"WeightSyncError: {exc}"

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def launch(cluster: hwplace.Cluster, restart: hwplace.Restart | None) -> tuple[hwplace.WorkerGroup,
                                                                             hwplace.WorkerGroup]:
    placement = hwplace.ComponentPlacement(CONFIG, cluster)
    trainer = Trainer.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer")
    rollout = Rollout.create_group().launch(cluster, placement.get_strategy("rollout"), name="rollout",
                                            restart=restart)
    return trainer, rollout


def test_each_version_leaves_the_source_node_once_for_a_node_of_three_ranks(cluster: hwplace.Cluster) -> None:
    trainer, rollout = launch(cluster, None)
    try:
        sync = hwplace.WeightSync.create("relayed", source="trainer", targets=("rollout",))
        assert [(t.node, t.transport, t.relay) for t in sync.plan] == [(1, "other-node", ("rollout", 0))] * 3
        [before] = trainer.sent().wait(timeout=60)
        for version in (1, 2, 3):
            waiting = rollout.latest(sync, version)
            assert trainer.publish(sync, version).wait(timeout=60) == [version]
            assert waiting.wait(timeout=60) == [(version, [float(version)])] * 3
            [sent] = trainer.sent().wait(timeout=60)
            assert set(sent) == {(0, 1)}
            # each version's 1 MB and its announcement (a few KiB): once for the node, not once per rank
            assert version * 4 * WORDS <= sent[0, 1] - before.get((0, 1), 0) < version * (4 * WORDS + 32 * 1024), sent
    finally:
        trainer.shutdown()
        rollout.shutdown()


def test_a_relay_that_dies_is_named_to_its_node_and_to_the_source(cluster: hwplace.Cluster) -> None:
    trainer, rollout = launch(cluster, None)
    try:
        sync = hwplace.WeightSync.create("no-relay", source="trainer", targets=("rollout",))
        waiting = rollout.latest(sync, 1)
        trainer.publish(sync, 1).wait(timeout=60)
        assert waiting.wait(timeout=60) == [(1, [1.0])] * 3
        rollout.execute_on(0).die()
        answers = rollout.execute_on(1, 2).latest_or_error(sync, 2).wait(timeout=150)
        assert all(a.startswith("WeightSyncError: weight sync 'no-relay': the link from its node's relay, group "
                                "'rollout' rank 0 (node 1) broke") for a in answers), answers
        deadline = time.monotonic() + 60
        while trainer.dead_targets(sync).wait(timeout=60) != [[("rollout", 0)]] and time.monotonic() < deadline:
            trainer.publish(sync, 2).wait(timeout=60)
            time.sleep(0.2)
        assert trainer.dead_targets(sync).wait(timeout=60) == [[("rollout", 0)]]
    finally:
        trainer.shutdown()
        rollout.shutdown()


def test_a_restarted_relay_takes_up_its_node_again(cluster: hwplace.Cluster) -> None:
    trainer, rollout = launch(cluster, hwplace.Restart(max_restarts=2))
    try:
        sync = hwplace.WeightSync.create("relay-back", source="trainer", targets=("rollout",))
        waiting = rollout.latest(sync, 1)
        trainer.publish(sync, 1).wait(timeout=60)
        assert waiting.wait(timeout=60) == [(1, [1.0])] * 3
        rollout.execute_on(0).die()
        while not all(s.restarts >= 1 for s in rollout.status() if s.rank == 0) or \
                any(s.state != "serving" for s in rollout.status()):
            time.sleep(0.05)
        mates = rollout.execute_on(1, 2).latest(sync, 2)  # they wait for the new relay, which joins as it asks
        relay = rollout.execute_on(0).latest(sync, 2)
        version = 1
        while not (mates.done() and relay.done()):  # a publish before the new relay linked may go to no one
            version += 1
            trainer.publish(sync, version).wait(timeout=60)
            time.sleep(0.2)
        results = mates.wait(timeout=60) + relay.wait(timeout=60)
        assert all(v >= 2 and values == [float(v)] for v, values in results), results
    finally:
        trainer.shutdown()
        rollout.shutdown()
