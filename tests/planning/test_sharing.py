"""Which processes of different components share an accelerator (hwplace.planning.sharing), offline."""

from __future__ import annotations

import hwplace
from hwplace.planning.sharing import HOST, NCCL, Share, accelerator_units, message_path, shared_accelerators

CONFIG = {"cluster": {"num_nodes": 2, "component_placement": {
    "rollout,trainer": "0-1", "inference": "1-2", "big": "4-7:0-1", "eval": "5", "env": {"node_group": "node",
                                                                                       "placement": "0-1"}}}}


def test_colocated_components_share_their_accelerators_rank_by_rank() -> None:
    cluster = hwplace.testing.fake_cluster(CONFIG["cluster"], accelerators_per_node=4)
    plan = hwplace.ComponentPlacement(CONFIG, cluster)
    shares = shared_accelerators({name: plan.get_placements(name) for name in plan.components})
    kind = "fake-accelerator"
    assert shares[("trainer", 0)] == (Share(0, kind, 0, "rollout", 0),)
    assert shares[("trainer", 1)] == (Share(0, kind, 1, "inference", 0), Share(0, kind, 1, "rollout", 1))
    assert ("inference", 1) not in shares  # accelerator 2: its own
    assert shares[("big", 0)] == (Share(1, kind, 1, "eval", 0),)  # accelerators 0-1 of node 1
    assert shares[("eval", 0)] == (Share(1, kind, 1, "big", 0),)
    assert not any(name == "env" for name, _ in shares)  # a process on a node owns no accelerator
    assert str(shares[("trainer", 0)][0]) == "shares fake-accelerator 0 (node 0) with rollout rank 0"
    assert accelerator_units(plan.get_placements("big")[1]) == ((kind, 2), (kind, 3))


def test_a_pair_on_one_gpu_sends_device_tensors_through_the_host_and_other_pairs_over_nccl() -> None:
    cluster = hwplace.testing.fake_cluster(CONFIG["cluster"], accelerators_per_node=4)
    plan = hwplace.ComponentPlacement(CONFIG, cluster)
    trainer, rollout, inference, big, env = (plan.get_placements(name) for name in
                                             ("trainer", "rollout", "inference", "big", "env"))
    assert message_path(trainer[0], rollout[0]) == HOST  # colocated: one GPU, taking turns (NCCL refuses it)
    assert message_path(trainer[1], inference[0]) == HOST  # one accelerator in common is enough
    assert message_path(trainer[0], rollout[1]) == NCCL  # GPUs 0 and 1 of node 0
    assert message_path(inference[1], big[0]) == NCCL  # accelerator 2 of node 0, 0-1 of node 1
    assert message_path(big[1], inference[1]) == NCCL  # index 2 on both, but of nodes 1 and 0
    assert message_path(trainer[0], env[0]) == HOST  # a node process holds no accelerator
    assert message_path(trainer[0], rollout[1], ("nccl", "")) == HOST  # one end cannot use NCCL
    assert message_path(trainer[0], rollout[1], ("gloo", "gloo")) == HOST
    # two MIG slices of one GPU, or a GPU the placements do not show as shared: their physical ids say so
    assert message_path(trainer[0], rollout[1], physical=("n0/pci 0000:17:00", "n0/pci 0000:17:00")) == HOST
    assert message_path(trainer[0], rollout[1], physical=("n0/pci 0000:17:00", "n0/pci 0000:2a:00")) == NCCL
    assert message_path(trainer[0], rollout[1], physical=("", "")) == NCCL  # unknown: the placements decide
