"""hwplace.WeightSync of CUDA tensors (``tox -e cuda``): a rollout rank on the trainer's GPU gets them through
CUDA IPC, on its GPU, without host memory, while a rank on another GPU of the node reads the host copy; skips,
saying why, without CUDA GPUs and Ray."""

from __future__ import annotations

import os

import pytest

import hwplace

torch = pytest.importorskip("torch", reason="torch is not installed: pip install 'hwplace[torch]'")
pytest.importorskip("ray", reason="Ray is not installed: pip install 'hwplace[ray]'")

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_a_gpu = pytest.mark.skipif(GPUS < 1, reason=f"needs a CUDA GPU for CUDA IPC; this machine has {GPUS} "
                                 "(torch.cuda.device_count())")


class Trainer(hwplace.Worker):
    def __init__(self) -> None:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())

    def publish(self, sync: hwplace.WeightSync, scale: float) -> int:
        state = {"w": torch.arange(4096, dtype=torch.float32, device="cuda").reshape(64, 64) * scale,
                 "big": torch.full((2_000_000,), scale, dtype=torch.bfloat16, device="cuda")}
        return sync.publish(state)

    def publish_on(self, sync: hwplace.WeightSync, scale: float, device: int) -> int:
        state = {"w": torch.full((4096,), scale, device=f"cuda:{device}")}
        return sync.publish(state)

    def close(self, sync: hwplace.WeightSync) -> tuple[int, int]:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        sync.close()
        sync.close()
        return before, torch.cuda.memory_allocated()


class Rollout(hwplace.Worker):
    def latest(self, sync: hwplace.WeightSync, version: int) -> tuple[int, str, float, float]:
        weights = sync.latest(min_version=version, timeout=120)
        w, big = weights.tensors["w"], weights.tensors["big"]
        return weights.version, w.device.type, float(w.float().sum()), float(big.float().mean())

    def load(self, sync: hwplace.WeightSync, version: int) -> tuple[int, float, int]:
        module = torch.nn.Module()
        module.register_buffer("w", torch.zeros(64, 64, device="cuda"))
        module.register_buffer("big", torch.zeros(2_000_000, dtype=torch.bfloat16, device="cuda"))
        loaded = sync.load_into(module, min_version=version, timeout=120)
        intake = sync._state().intake
        return loaded, float(module.big.float().mean()), int(intake is not None and intake._buffer is not None)

    def latest_w(self, sync: hwplace.WeightSync, version: int) -> tuple[int, str, float]:
        weights = sync.latest(min_version=version, timeout=120)
        return weights.version, weights.tensors["w"].device.type, float(weights.tensors["w"].float().mean())

    def close(self, sync: hwplace.WeightSync) -> None:
        sync.close()


@needs_a_gpu
@pytest.mark.time_limit(300)
def test_cuda_tensors_reach_a_rank_on_the_same_gpu_through_cuda_ipc() -> None:
    placement = "0" if GPUS == 1 else "0,1"
    config = {"cluster": {"num_nodes": 1, "address": "local",
                          "node_groups": [{"label": "gpu", "node_ranks": "0", "hardware": {"type": "cuda"}}],
                          "component_placement": {"trainer": {"node_group": "gpu", "placement": "0"},
                                                  "rollout": {"node_group": "gpu", "placement": placement}}}}
    cluster = hwplace.Cluster(config["cluster"])
    plan = hwplace.ComponentPlacement(config, cluster)
    trainer = Trainer.create_group().launch(cluster, plan.get_strategy("trainer"), name="trainer")
    rollout = Rollout.create_group().launch(cluster, plan.get_strategy("rollout"), name="rollout")
    try:
        sync = hwplace.WeightSync.create("policy", source="trainer", targets=("rollout",))
        transports = [t.transport for t in sync.plan]
        assert transports == (["same-device"] if GPUS == 1 else ["same-device", "same-node"])
        total = float(sum(range(4096)))
        for version, scale in ((1, 1.0), (2, 2.0), (3, 0.5)):
            waiting = rollout.latest(sync, version)
            assert trainer.publish(sync, scale).wait(timeout=120) == [version]
            got = waiting.wait(timeout=120)
            assert got[0] == (version, "cuda", total * scale, scale)  # on the GPU: CUDA IPC
            if GPUS > 1:
                assert got[1][0] == version
                assert got[1][2:] == (total * scale, scale)
    finally:
        trainer.shutdown()
        rollout.shutdown()


@needs_a_gpu
@pytest.mark.time_limit(300)
def test_load_into_reads_the_ring_in_place_and_close_gives_the_ring_back() -> None:
    config = {"cluster": {"num_nodes": 1, "address": "local",
                          "node_groups": [{"label": "gpu", "node_ranks": "0", "hardware": {"type": "cuda"}}],
                          "component_placement": {"trainer": {"node_group": "gpu", "placement": "0"},
                                                  "rollout": {"node_group": "gpu", "placement": "0"}}}}
    cluster = hwplace.Cluster(config["cluster"])
    plan = hwplace.ComponentPlacement(config, cluster)
    trainer = Trainer.create_group().launch(cluster, plan.get_strategy("trainer"), name="trainer")
    rollout = Rollout.create_group().launch(cluster, plan.get_strategy("rollout"), name="rollout")
    try:
        sync = hwplace.WeightSync.create("policy", source="trainer", targets=("rollout",))
        assert sync.device_bytes(10) == {"source": 20, "rollout 0": 10}
        for version, scale in ((1, 1.0), (2, 3.0)):
            waiting = rollout.load(sync, version)
            assert trainer.publish(sync, scale).wait(timeout=120) == [version]
            assert waiting.wait(timeout=120) == [(version, scale, 0)]  # no buffer of the target's own
        rollout.close(sync).wait(timeout=120)
        [(before, after)] = trainer.close(sync).wait(timeout=120)
        assert before - after >= 2 * (4096 * 4 + 2_000_000 * 2)  # both ends of the ring given back
    finally:
        trainer.shutdown()
        rollout.shutdown()


needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs two CUDA GPUs; this machine has {GPUS}")


@needs_two_gpus
@pytest.mark.time_limit(300)
def test_a_target_on_the_sources_other_gpu_gets_the_host_copy() -> None:
    config = {"cluster": {"num_nodes": 1, "address": "local",
                          "node_groups": [{"label": "gpu", "node_ranks": "0", "hardware": {"type": "cuda"}}],
                          "component_placement": {"trainer": {"node_group": "gpu", "placement": "0-1:0"},
                                                  "rollout": {"node_group": "gpu", "placement": "1"}}}}
    cluster = hwplace.Cluster(config["cluster"])
    plan = hwplace.ComponentPlacement(config, cluster)
    trainer = Trainer.create_group().launch(cluster, plan.get_strategy("trainer"), name="trainer")
    rollout = Rollout.create_group().launch(cluster, plan.get_strategy("rollout"), name="rollout")
    try:
        sync = hwplace.WeightSync.create("policy", source="trainer", targets=("rollout",))
        assert [t.transport for t in sync.plan] == ["same-device"]  # the placements share GPU 1
        waiting = rollout.latest_w(sync, 1)
        assert trainer.publish_on(sync, 2.0, 0).wait(timeout=120) == [1]  # but the tensors lie on GPU 0
        assert waiting.wait(timeout=120) == [(1, "cpu", 2.0)]  # the host copy, not a failed CUDA IPC
    finally:
        trainer.shutdown()
        rollout.shutdown()
