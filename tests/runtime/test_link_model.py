"""The link emulator of weight sync's sends to other nodes (hwplace.runtime.weight_sync.link_model), on a clock of
the test's own: a token bucket per node pair, pairs side by side, sends on one pair one after another, the bytes
counted per pair; and ``HWPLACE_LINK_BANDWIDTH``, read and refused by name."""

from __future__ import annotations

import pytest

import hwplace
from hwplace.foundation.settings import LINK_BANDWIDTH, read_link_bandwidth
from hwplace.runtime.weight_sync.link_model import TokenBucket, Traffic


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_bucket_lets_bytes_through_at_its_rate_after_its_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(1000.0, burst=100.0, clock=clock)
    assert bucket.charge(500) == pytest.approx(100.4)  # idle: the burst's 100 bytes go at once
    assert bucket.charge(500) == pytest.approx(100.9)  # queued behind the first
    clock.now = 200.0
    assert bucket.charge(1000) == pytest.approx(200.9)  # idle again: one burst saved up, no more


def test_pairs_send_side_by_side_and_one_pair_in_turn() -> None:
    clock = Clock()
    links = Traffic(1000.0, clock=clock, sleep=clock.sleep)
    due = [links.charge((0, node), 1000) for node in (1, 2, 3)]  # three nodes at once: one second in all
    assert max(due) == pytest.approx(101.0, abs=0.01)
    due.append(links.charge((0, 1), 1000))  # a second copy to node 1 waits for the first
    assert max(due) == pytest.approx(102.0, abs=0.01)
    links.wait(max(due))
    assert clock.now == pytest.approx(102.0, abs=0.01)
    assert links.charge((1, 1), 10**9) == 0.0  # within a node: counted, never held
    assert links.sent == {(0, 1): 2000, (0, 2): 1000, (0, 3): 1000, (1, 1): 10**9}
    links.reset()
    assert links.sent == {}


def test_without_a_bandwidth_bytes_are_counted_and_never_held() -> None:
    clock = Clock()
    links = Traffic(None, clock=clock, sleep=clock.sleep)
    links.wait(links.charge((0, 1), 10**12))
    assert (clock.slept, links.sent) == ([], {(0, 1): 10**12})


def test_the_bandwidth_setting_is_an_amount_per_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LINK_BANDWIDTH, raising=False)
    assert read_link_bandwidth() is None
    for raw, rate in (("100MB", 10**8), ("1GiB", 2**30), ("12345", 12345)):
        monkeypatch.setenv(LINK_BANDWIDTH, raw)
        assert read_link_bandwidth() == rate
    for raw in ("0", "fast", "10Gb"):
        monkeypatch.setenv(LINK_BANDWIDTH, raw)
        with pytest.raises(hwplace.ConfigError, match=LINK_BANDWIDTH):
            read_link_bandwidth()
