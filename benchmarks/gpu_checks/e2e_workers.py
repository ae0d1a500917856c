"""The worker classes of the end-to-end GPU checks: a trainer that publishes and sends, a rollout that takes.

In a module of their own so that the process executor's worker processes import them by name.
"""

from __future__ import annotations

import time
from typing import Any

import hwplace


def _torch() -> Any:
    import torch

    return torch


def _device() -> str:
    torch = _torch()
    if torch.cuda.is_available():
        torch.cuda.set_device(0)  # the worker sees only its own GPU (CUDA_VISIBLE_DEVICES by UUID)
        return "cuda:0"
    torch.set_num_threads(1)
    return "cpu"


def ring_bytes(sync: hwplace.WeightSync) -> tuple[int, int]:
    """What this source's ring of device buckets holds now, and its host buckets (0, 0 before any same-device
    version)."""
    source = sync._state().source
    writer = None if source is None else source.same_device.writer
    return (0, 0) if writer is None else (writer.device_bytes, writer.host_bytes)


def state(version: int, mib: int, device: str) -> dict[str, Any]:
    """A state dict of about ``mib`` MiB whose every value says its version, with an odd-length bf16 tensor."""
    torch = _torch()
    return {
        "big": torch.full((mib * 2**20 // 4,), float(version), device=device),
        "odd_bf16": torch.full((7,), float(version), dtype=torch.bfloat16, device=device),  # 14 bytes
        "step": torch.tensor([version], dtype=torch.int64, device=device),
    }


class Trainer(hwplace.Worker):
    def __init__(self) -> None:
        self.device = _device()

    def gpu(self) -> dict[str, Any]:
        torch = _torch()
        if self.device == "cpu":
            return {"device": "cpu"}
        return {"device": self.device, "name": torch.cuda.get_device_name(0),
                "allocated": torch.cuda.memory_allocated(0)}

    def publish(self, sync: hwplace.WeightSync, versions: int, mib: int) -> dict[str, Any]:
        torch = _torch()
        seconds = []
        memory = []
        ring = []
        for v in range(1, versions + 1):
            weights = state(v, mib, self.device)
            start = time.perf_counter()
            assert sync.publish(weights) == v
            seconds.append(time.perf_counter() - start)
            if v in (1, 10, versions):
                ring.append((v, ring_bytes(sync)))  # bytes the ring (device) and the host buckets hold
                if self.device != "cpu":
                    torch.cuda.synchronize()
                    memory.append((v, torch.cuda.memory_allocated(0)))
        model = sum(t.numel() * t.element_size() for t in weights.values())
        return {"publish_s_median": sorted(seconds)[len(seconds) // 2], "memory": memory, "ring": ring,
                "model_bytes": model, "plan_device_bytes": sync.device_bytes(weights), "plan": str(sync.plan)}

    def send_to(self, group: str, rank: int, mib: int, value: float) -> float:
        torch = _torch()
        start = time.perf_counter()
        self.send(torch.full((mib * 2**20 // 4,), value, device=self.device), group, rank)
        return time.perf_counter() - start

    def exchange(self, group: str, rank: int, mib: int, value: float, timeout: float) -> dict[str, Any]:
        """Send a tensor to the peer and receive its one, both at once."""
        torch = _torch()
        start = time.perf_counter()
        handle = self.send(torch.full((mib * 2**20 // 4,), value, device=self.device), group, rank, async_op=True)
        got = self.recv(group, rank, timeout=timeout)
        handle.wait(timeout=timeout)
        return {"seconds": time.perf_counter() - start, "received": float(got[0]), "device": str(got.device)}


class Rollout(Trainer):
    def take(self, sync: hwplace.WeightSync, versions: int, timeout: float) -> dict[str, Any]:
        torch = _torch()
        seen = []
        memory = []
        wrong = []
        version = 0
        while version < versions:
            weights = sync.latest(min_version=version + 1, timeout=timeout)
            version = weights.version
            tensors = weights.tensors
            for key, tensor in tensors.items():
                if float(tensor.float().min()) != float(version) or float(tensor.float().max()) != float(version):
                    wrong.append((version, key))
            seen.append(version)
            if self.device != "cpu" and ((version >= 10 and not memory) or version == versions):
                torch.cuda.synchronize()
                memory.append((version, torch.cuda.memory_allocated(0)))
        return {"versions_seen": len(seen), "last": seen[-1] if seen else 0, "wrong": wrong[:5],
                "devices": sorted({str(t.device) for t in tensors.values()}), "memory": memory}

    def receive_from(self, group: str, rank: int, timeout: float) -> dict[str, Any]:
        got = self.recv(group, rank, timeout=timeout)
        return {"received": float(got[0]), "device": str(got.device), "numel": int(got.numel())}
