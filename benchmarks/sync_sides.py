"""The two ends of a same-node weight sync and the floor's copy, as one worker class: what
``benchmarks/rl_transfer.py`` (on Ray, with Ray's baselines beside it) and ``benchmarks/sync_memcpy.py`` (through the
process executor, for machines without Ray) time. Imports no Ray; a benchmark imports it with its own folder on
``sys.path``, and both executors' workers find it there.
"""

from __future__ import annotations

import time

import torch

import hwplace

MB = 10**6


def state_dict(megabytes: int) -> dict[str, torch.Tensor]:
    """Four float32 tensors of a quarter of ``megabytes`` each, tensor ``i`` filled with ``i``."""
    count = megabytes * MB // 16
    return {f"layer{i}.weight": torch.full((count,), float(i)) for i in range(4)}


class SyncSide(hwplace.Worker):
    """A trainer or a rollout rank: its state dicts, the sync's two ends and one copy of a state dict."""

    def __init__(self, threads: int = 0) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.copies: dict[int, dict[str, torch.Tensor]] = {}

    def prepare(self, megabytes: int) -> int:
        """Make the state dict of ``megabytes`` and the tensors its copy goes into; returns torch's thread count."""
        self.states[megabytes] = state_dict(megabytes)
        self.copies[megabytes] = {k: torch.empty_like(v) for k, v in self.states[megabytes].items()}
        return torch.get_num_threads()

    def publish(self, sync: hwplace.WeightSync, megabytes: int) -> float:
        """Publish; returns when it began (the node's CLOCK_MONOTONIC, which every process of the node shares)."""
        begin = time.monotonic()
        sync.publish(self.states[megabytes])
        return begin

    def wait_version(self, sync: hwplace.WeightSync, version: int) -> tuple[float, float]:
        """Wait for ``version`` and read a value of it; returns when the call began waiting and when it was done
        (CLOCK_MONOTONIC)."""
        began = time.monotonic()
        weights = sync.latest(min_version=version, timeout=300)
        if float(weights.tensors["layer3.weight"][-1]) != 3.0:
            raise AssertionError(f"version {version}: the last tensor's value is not 3")
        return began, time.monotonic()

    def memcpy(self, megabytes: int) -> float:
        """Seconds one copy of the state dict takes in this worker (torch ``copy_`` into tensors made before)."""
        into = self.copies[megabytes]
        begin = time.perf_counter()
        for name, tensor in self.states[megabytes].items():
            into[name].copy_(tensor)
        return time.perf_counter() - begin
