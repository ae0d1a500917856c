"""Messaging of CUDA tensors between workers on GPUs (``tox -e cuda``): over NCCL between two GPUs, both ways at
once, to a worker's own device, with a peer killed mid-transfer; through the host between two workers on one GPU
(the colocated layout, where NCCL refuses a pair). Skips, saying why, where there are not enough CUDA GPUs. The
backend's ``collective_backend`` is checked everywhere."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

import hwplace
from hwplace_plugins.cuda import CudaBackend

torch = pytest.importorskip("torch", reason="torch is not installed: pip install 'hwplace[torch]'")
pytest.importorskip("ray", reason="Ray is not installed: pip install 'hwplace[ray]'")

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_a_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU; torch.cuda.device_count() is 0")
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

    def send_tensor_to(self, peer: str) -> None:
        self.send(torch.arange(1024, dtype=torch.float16, device="cuda"), peer, 0)

    def recv_tensor(self) -> tuple[str, str, float]:
        tensor = self.recv("a", 0, timeout=120)
        return tensor.device.type, str(tensor.dtype), float(tensor.float().sum())

    def swap(self, peer: str, sign: float) -> tuple[str, float]:
        """Send a 256 MiB CUDA tensor to ``peer`` and take the one it sends, both at once."""
        mine = sign * torch.ones(2**26, device="cuda")
        handle = self.send(mine, peer, 0, async_op=True)
        theirs = self.recv(peer, 0, timeout=120)
        handle.wait(timeout=120)
        return str(theirs.device), float(theirs.sum())

    def choose(self, device: int) -> None:
        torch.cuda.set_device(device)

    def recv_device(self, peer: str) -> str:
        return str(self.recv(peer, 0, timeout=120).device)

    def send_until_killed(self, peer: str) -> None:
        """Send 1 GiB tensors to ``peer`` until this process is killed, 3 s in (mid-transfer, most likely)."""
        big = torch.ones(2**28, device="cuda")
        threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
        while True:
            self.send(big, peer, 0)

    def recv_until_error(self, peer: str) -> str:
        try:
            while True:
                self.recv(peer, 0)  # no timeout: a dead peer must end it
        except hwplace.WorkerError as exc:
            return f"WorkerError group={exc.group} rank={exc.rank}: {exc}"



def launch(placements: dict[str, str], hardware: str = "cuda") -> tuple[Any, ...]:
    config = {"cluster": {"num_nodes": 1, "address": "local",
                          "node_groups": [{"label": "gpu", "node_ranks": "0", "hardware": {"type": hardware}}],
                          "component_placement": {name: {"node_group": "gpu", "placement": where}
                                                  for name, where in placements.items()}}}
    cluster = hwplace.Cluster(config["cluster"])
    plan = hwplace.ComponentPlacement(config, cluster)
    return tuple(GpuPeer.create_group().launch(cluster, plan.get_strategy(name), name=name) for name in placements)


@needs_a_gpu
@pytest.mark.time_limit(300)
def test_two_workers_on_one_gpu_swap_large_cuda_tensors_through_the_host() -> None:
    """The colocated layout: NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); the pair goes through
    the host, and the tensors land on the GPU."""
    a, b = launch({"a": "0", "b": "0"})
    try:
        handles = [a.swap("b", 1.0), b.swap("a", -1.0)]
        assert [h.wait(timeout=240) for h in handles] == [[("cuda:0", -2.0**26)], [("cuda:0", 2.0**26)]]
    finally:
        a.shutdown()
        b.shutdown()


@needs_two_gpus
@pytest.mark.time_limit(300)
def test_two_workers_on_two_gpus_swap_large_cuda_tensors_over_nccl_at_once() -> None:
    """Both send a large tensor to the other at once: one NCCL group per direction, neither waits for the other."""
    a, b = launch({"a": "0", "b": "1"})
    try:
        handles = [a.swap("b", 1.0), b.swap("a", -1.0)]
        assert [h.wait(timeout=240) for h in handles] == [[("cuda:0", -2.0**26)], [("cuda:0", 2.0**26)]]
    finally:
        a.shutdown()
        b.shutdown()


@needs_two_gpus
@pytest.mark.time_limit(300)
def test_a_received_tensor_lands_on_the_device_the_worker_chose() -> None:
    a, b = launch({"a": "0-1", "b": "0"})  # a holds two GPUs and works on its second
    try:
        a.choose(1).wait(timeout=60)
        got = a.recv_device("b")
        b.send_tensor_to("a").wait(timeout=120)
        assert got.wait(timeout=120) == ["cuda:1"]
    finally:
        a.shutdown()
        b.shutdown()


@needs_two_gpus
@pytest.mark.time_limit(300)
def test_a_peer_killed_mid_transfer_is_a_worker_error_naming_it_without_a_recv_timeout() -> None:
    a, b = launch({"a": "0", "b": "1"})
    try:
        waiting = b.recv_until_error("a")
        a.send_until_killed("b")
        [answer] = waiting.wait(timeout=120)
        assert answer.startswith("WorkerError group=a rank=0"), answer
    finally:
        a.shutdown()
        b.shutdown()


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
