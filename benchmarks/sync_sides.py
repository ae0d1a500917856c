"""The two ends of a same-node weight sync and the floor's copy, as one worker class: what
``benchmarks/rl_transfer.py`` (on Ray, with Ray's baselines beside it) and ``benchmarks/sync_memcpy.py`` (through the
process executor, for machines without Ray) time. Imports no Ray; a benchmark imports it with its own folder on
``sys.path``, and both executors' workers find it there.
"""

from __future__ import annotations

import functools
import importlib
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

import hwplace

MB = 10**6
FOUND = "<found>"  # a value for SyncSide.setting: the attribute as it was found
TIMES: dict[str, list[float]] = {}  # a worker's: seconds each profiled step took, by its name


def timed(owner: Any, name: str, label: str) -> None:
    """Wrap ``owner.name`` (a function of a module, or a method of a class) to record in :data:`TIMES` how long each
    call took."""
    original = getattr(owner, name)
    if getattr(original, "timed", False):
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TIMES.setdefault(label, []).append(time.perf_counter() - begin)

    wrapper.timed = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)


def state_dict(megabytes: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Four float32 tensors of a quarter of ``megabytes`` each, tensor ``i`` filled with ``i``, on ``device``."""
    count = megabytes * MB // 16
    return {f"layer{i}.weight": torch.full((count,), float(i), device=device) for i in range(4)}


class SyncSide(hwplace.Worker):
    """A trainer or a rollout rank: its state dicts, the sync's two ends and one copy of a state dict. With
    ``cuda``, the state dicts lie on the worker's GPU (it sees only its own), and each time waits for the GPU."""

    def __init__(self, threads: int = 0, cuda: bool = False) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.device = "cpu"
        if cuda:
            torch.cuda.set_device(0)
            self.device = "cuda:0"
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.copies: dict[int, dict[str, torch.Tensor]] = {}
        self.found: dict[tuple[str, str], Any] = {}  # what :meth:`setting` found each attribute set to

    def prepare(self, megabytes: int) -> int:
        """Make the state dict of ``megabytes`` and the tensors its copy goes into; returns torch's thread count."""
        self.states[megabytes] = state_dict(megabytes, self.device)
        self.copies[megabytes] = {k: torch.empty_like(v) for k, v in self.states[megabytes].items()}
        self._synchronize()
        return torch.get_num_threads()

    def profile(self, steps: Sequence[tuple[str, str]]) -> None:
        """From now on, time each step, ``(module, attribute)`` (``Class.method`` or a module's function as a name
        the module looks up when it runs)."""
        for module, attribute in steps:
            owner: Any = importlib.import_module(module)
            *path, name = attribute.split(".")
            for part in path:
                owner = getattr(owner, part)
            timed(owner, name, attribute)

    def setting(self, changes: Sequence[tuple[str, str, Any]]) -> None:
        """Set each ``(module, attribute, value)`` (``Class.name`` for a class's), the attribute's first value kept
        as it was found: ``value`` :data:`FOUND` puts it back."""
        for module, attribute, value in changes:
            owner: Any = importlib.import_module(module)
            *path, name = attribute.split(".")
            for part in path:
                owner = getattr(owner, part)
            found = self.found.setdefault((module, attribute), getattr(owner, name))
            setattr(owner, name, found if value == FOUND else value)

    def timings(self) -> dict[str, tuple[int, float]]:
        """Each profiled step's calls and their median in ms since the last call; then forgets them."""
        out = {label: (len(runs), statistics.median(runs) * 1e3) for label, runs in TIMES.items()}
        TIMES.clear()
        return out

    def _synchronize(self) -> None:
        if self.device != "cpu":
            torch.cuda.synchronize()

    def publish(self, sync: hwplace.WeightSync, megabytes: int) -> float:
        """Publish; returns when it began (the node's CLOCK_MONOTONIC, which every process of the node shares)."""
        begin = time.monotonic()
        sync.publish(self.states[megabytes])
        return begin

    def wait_version(self, sync: hwplace.WeightSync, version: int) -> tuple[float, float]:
        """Wait for ``version`` and read a value of it (on a GPU, once what the sync enqueued has run); returns when
        the call began waiting and when it was done (CLOCK_MONOTONIC)."""
        began = time.monotonic()
        weights = sync.latest(min_version=version, timeout=300)
        if float(weights.tensors["layer3.weight"][-1]) != 3.0:
            raise AssertionError(f"version {version}: the last tensor's value is not 3")
        return began, time.monotonic()

    def memcpy(self, megabytes: int) -> float:
        """Seconds one copy of the state dict takes in this worker (torch ``copy_`` into tensors made before)."""
        into = self.copies[megabytes]
        self._synchronize()
        begin = time.perf_counter()
        for name, tensor in self.states[megabytes].items():
            into[name].copy_(tensor)
        self._synchronize()
        return time.perf_counter() - begin
