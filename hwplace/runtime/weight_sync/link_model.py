"""The bytes a process sends to other nodes, counted per node pair, and an emulated link between nodes.

Every send of a weight sync to another node (:func:`~hwplace.runtime.weight_sync.links.fan_out`) is charged to its
node pair here: :class:`Traffic` counts the bytes (``sent[(from_node, to_node)]``: what left this process's node
for each other node, which tests and benchmarks read), and, where ``HWPLACE_LINK_BANDWIDTH`` is set
(:func:`hwplace.foundation.settings.read_link_bandwidth`), holds the sender to that many bytes per second per node
pair: a :class:`TokenBucket` per pair, so that on one machine (a local cluster whose nodes share the loopback) the
link's bandwidth, not the loopback's, decides how long a transfer takes. The sends to several pairs go at once, each
at its pair's rate; several sends on one pair share its rate. The bucket is the sender process's own: what two
processes of one node send to one other node is not added up (a weight sync's only cross-node sender is its
source). Imports the foundation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hwplace.foundation.settings import read_link_bandwidth

Pair = tuple[int, int]  # (the sender's node, the receiver's node)
BURST_SECONDS = 0.001  # a bucket holds at most this many seconds of its rate: sends come out at the rate


class TokenBucket:
    """A link of ``rate`` bytes per second: :meth:`charge` books bytes on it and says when they have crossed.

    Booked as a queue (a virtual clock): a send of ``n`` bytes takes ``n / rate`` seconds after the link is free
    again, less the burst the bucket has saved up while idle (at most ``burst`` bytes)."""

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"a link's rate is bytes per second above 0, got {rate!r}")
        self.rate = float(rate)
        self.burst = float(rate * BURST_SECONDS if burst is None else burst)
        self._clock = clock
        self._free = -float("inf")  # when the link has sent everything booked so far
        self._lock = threading.Lock()

    def charge(self, nbytes: int) -> float:
        """Book ``nbytes`` on the link; returns the time (on the bucket's clock) when they have crossed."""
        with self._lock:
            now = self._clock()
            start = max(self._free, now - self.burst / self.rate)
            self._free = start + nbytes / self.rate
            return self._free


class Traffic:
    """This process's sends to other nodes: bytes per node pair, and the emulated links (``rate``: bytes per
    second per pair, None: none)."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate
        self.sent: dict[Pair, int] = {}
        self._buckets: dict[Pair, TokenBucket] = {}
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()

    def charge(self, pair: Pair, nbytes: int) -> float:
        """Count ``nbytes`` sent on ``pair``; returns when they have crossed its emulated link (0: no emulation,
        or the pair's two ends are one node)."""
        with self._lock:
            self.sent[pair] = self.sent.get(pair, 0) + nbytes
            if self.rate is None or pair[0] == pair[1]:
                return 0.0
            bucket = self._buckets.get(pair)
            if bucket is None:
                bucket = self._buckets[pair] = TokenBucket(self.rate, clock=self._clock)
        return bucket.charge(nbytes)

    def wait(self, until: float) -> None:
        """Sleep until ``until`` (a time :meth:`charge` returned): the bytes have crossed their links."""
        left = until - self._clock()
        if left > 0:
            self._sleep(left)

    def reset(self) -> None:
        """Forget the counts (a benchmark's or test's fresh start); the links keep their bookings."""
        with self._lock:
            self.sent.clear()


_TRAFFIC: list[Traffic] = []
_TRAFFIC_LOCK = threading.Lock()


def traffic() -> Traffic:
    """This process's :class:`Traffic`, made on first use from ``HWPLACE_LINK_BANDWIDTH``."""
    with _TRAFFIC_LOCK:
        if not _TRAFFIC:
            _TRAFFIC.append(Traffic(read_link_bandwidth()))
        return _TRAFFIC[0]
