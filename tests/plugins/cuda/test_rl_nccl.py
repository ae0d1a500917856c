"""Messaging of CUDA tensors over NCCL between workers on two GPUs (``tox -e cuda``); skips, saying why, where
there are not two CUDA GPUs. The backend's ``collective_backend`` is checked everywhere."""

from __future__ import annotations

import pytest

import hwplace
from hwplace_plugins.cuda import CudaBackend

torch = pytest.importorskip("torch", reason="torch is not installed: pip install 'hwplace[torch]'")
pytest.importorskip("ray", reason="Ray is not installed: pip install 'hwplace[ray]'")

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs two CUDA GPUs for NCCL between two workers; "
                                    f"this machine has {GPUS} (torch.cuda.device_count())")


def test_the_cuda_backend_asks_for_nccl() -> None:
    assert CudaBackend.collective_backend == "nccl"
    assert hwplace.HardwareBackend.collective_backend == "gloo"


class GpuPeer(hwplace.Worker):
    def __init__(self) -> None:
        import os

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

    def send_tensor(self) -> None:
        self.send(torch.arange(1024, dtype=torch.float16, device="cuda"), "b", 0)

    def recv_tensor(self) -> tuple[str, str, float]:
        tensor = self.recv("a", 0, timeout=120)
        return tensor.device.type, str(tensor.dtype), float(tensor.float().sum())


@needs_two_gpus
@pytest.mark.time_limit(300)
def test_cuda_tensors_travel_over_nccl_and_arrive_on_the_gpu() -> None:
    config = {"cluster": {"num_nodes": 1, "address": "local",
                          "node_groups": [{"label": "gpu", "node_ranks": "0", "hardware": {"type": "cuda"}}],
                          "component_placement": {"a": {"node_group": "gpu", "placement": "0"},
                                                  "b": {"node_group": "gpu", "placement": "1"}}}}
    cluster = hwplace.Cluster(config["cluster"])
    plan = hwplace.ComponentPlacement(config, cluster)
    a = GpuPeer.create_group().launch(cluster, plan.get_strategy("a"), name="a")
    b = GpuPeer.create_group().launch(cluster, plan.get_strategy("b"), name="b")
    try:
        got = b.recv_tensor()
        a.send_tensor().wait(timeout=120)
        assert got.wait(timeout=120) == [("cuda", "torch.float16", float(sum(range(1024))))]
    finally:
        a.shutdown()
        b.shutdown()
