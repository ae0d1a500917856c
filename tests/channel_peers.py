"""The worker of the channel tests between workers (tests/runtime/test_channels_groups.py, and Ray's own in
tests/plugins/ray/test_channels.py): it produces into and consumes from the channels it is handed."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

import hwplace


class Peer(hwplace.Worker):
    """Produces into and consumes from channels handed to it."""

    def create(self, name: str, group: str | None = None, rank: int | None = None, maxsize: int = 0) -> str:
        channel = self.create_channel(name, group_affinity=group, group_rank_affinity=rank, maxsize=maxsize)
        return channel.where

    def produce(self, channel: hwplace.Channel, count: int, queue_name: str = "default") -> int:
        for i in range(count):
            channel.put((self.rank, self.node_rank, i), weight=1 + i % 4, queue_name=queue_name)
        return count

    def produce_by_name(self, name: str, count: int) -> int:
        return self.produce(self.connect_channel(name), count)

    def consume(self, channel: hwplace.Channel, batch_weight: float | None, idle: float) -> list[Any]:
        got: list[Any] = []
        while True:
            try:
                if batch_weight is None:
                    got.append(channel.get(timeout=idle))
                else:
                    got.extend(channel.get_batch(batch_weight, timeout=idle))
            except hwplace.ChannelTimeout:
                return got

    def wait_for_item(self, channel: hwplace.Channel) -> str:
        start = time.monotonic()
        try:
            channel.get()
        except hwplace.HwplaceError as exc:
            return f"{type(exc).__name__} after {time.monotonic() - start:.1f} s: {exc}"
        return "got an item"

    async def wait_for_batch(self, channel: hwplace.Channel) -> str:
        try:
            await channel.get_batch(10, async_op=True)
        except hwplace.HwplaceError as exc:
            return type(exc).__name__
        return "got a batch"

    def put_array(self, channel: hwplace.Channel, size: int) -> int:
        channel.put(np.full(size, self.rank, dtype=np.float32))
        return os.getpid()

    def take(self, channel: hwplace.Channel) -> Any:
        return channel.get(timeout=30)

    def hold(self, channel: hwplace.Channel, batch_weight: float) -> tuple[int, list[Any]]:
        """Takes a batch with ``ack=False`` and keeps it held (this process's connection holds it): returns this
        process's id, for the test to kill it, and what it took."""
        return os.getpid(), list(channel.get_batch(batch_weight, ack=False, timeout=30))

    def pull(self, channel: hwplace.Channel, batch_weight: float | None, count: int, steps: int) -> list[float]:
        """The weight taken at each step: one ``get_batch(batch_weight)``, or ``count`` single gets."""
        taken = []
        for _ in range(steps):
            items = channel.get_batch(batch_weight, timeout=30) if batch_weight else \
                [channel.get(timeout=30) for _ in range(count)]
            taken.append(float(sum(len(item) for item in items)))
        return taken
