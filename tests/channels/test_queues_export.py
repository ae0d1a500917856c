"""Tests of a channel's snapshot in hwplace.channels.queues: ``export`` copies every queue's items in one step,
held ones and what a waiting batch gathered counted as not taken, without changing anything; ``restore`` puts
such a copy at the head of a fresh channel's queues, with weights and versions."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_queues import Replies, fill
from test_queues_holds import B, take

from hwplace.channels.queues import QueueStats, Status, WeightedQueues


def test_export_counts_held_items_as_not_taken_ahead_of_the_queue_in_the_order_taken() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 2), ("c", 3), ("d", 4)])
    fill(queues, replies, "other", [("x", 1)])
    take(queues, replies, "first", 3)  # holds a, b (weights 1 + 2)
    take(queues, replies, "second", holder=B)  # holds c
    before = queues.stats("q")
    assert queues.export() == {"q": [("a", 1, None), ("b", 2, None), ("c", 3, None), ("d", 4, None)],
                               "other": [("x", 1, None)]}
    assert queues.stats("q") == before == QueueStats(puts=4, gets=3, stale=0, size=1, redelivered=0, held=3)
    assert queues.export() == queues.export()  # nothing moved


def test_export_keeps_versions_and_counts_what_a_waiting_batch_gathered_and_leaves_waiting_puts_out() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    assert queues.put("q", "v1", 1, replies("p1"), version=1) is None
    assert queues.get_batch("q", 5, replies("batch"), min_version=1) is not None  # gathers v1, waits for more
    assert queues.put("q", "v2", 2, replies("p2"), version=2) is None  # gathered too
    assert queues.put("full", "w1", 1, replies("w1")) is None
    assert queues.put("full", "w2", 1, replies("w2")) is not None  # waits for room: it has not happened
    assert queues.export() == {"q": [("v1", 1, 1), ("v2", 2, 2)], "full": [("w1", 1, None)]}
    assert queues.qsize("q") == 0  # still gathered by the waiting batch


def test_restore_puts_the_copy_at_the_head_counted_as_puts_and_serves_waiting_getters() -> None:
    source, replies = WeightedQueues(), Replies()
    fill(source, replies, "q", [("a", 1), ("b", 2)])
    take(source, replies, "held", 1)
    copy = source.export()
    fresh = WeightedQueues(maxsize=1)
    assert fresh.get("q", replies("waiting")) is not None
    assert fresh.put("q", "new", 5, replies("new"), block=False) is None  # the waiting get takes it
    for name, entries in copy.items():
        assert fresh.restore(name, entries)
    assert fresh.stats("q") == QueueStats(puts=3, gets=1, stale=0, size=2, redelivered=0, held=0)
    assert fresh.get_batch("q", 3, replies("all")) is None
    assert replies.of("all") == [(Status.OK, ["a", "b"])]  # past maxsize, in order
    fresh.close()
    assert not fresh.restore("q", [("late", 1, None)])


REQUEST = st.one_of(
    st.tuples(st.just("put"), st.integers(1, 3)),
    st.tuples(st.just("take"), st.sampled_from(["A", "B"]), st.integers(0, 3)),
    st.tuples(st.just("ack"), st.sampled_from(["A", "B"])),
    st.tuples(st.just("release"), st.sampled_from(["A", "B"])),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(REQUEST, max_size=40))
def test_export_holds_every_item_not_done_with_exactly_once(requests: list[tuple[Any, ...]]) -> None:
    """Whatever happened, the copy holds every item put that is not acknowledged (nor taken outright) once."""
    done: list[Any] = []
    queues, replies = WeightedQueues(on_gone=done.append), Replies()
    put = 0
    held: dict[str, list[int]] = {"A": [], "B": []}
    for n, request in enumerate(requests):
        if request[0] == "put":
            queues.put("q", put, request[1], replies(f"put{n}"), block=False)
            put += 1
        elif request[0] == "take":
            label = f"take{n}"
            ticket = queues.get_batch("q", request[2], replies(label), holder=request[1]) if request[2] else \
                queues.get("q", replies(label), block=False, holder=request[1])
            if ticket is not None:
                queues.cancel(ticket)
            for status, value in replies.of(label):
                if status is Status.OK:
                    held[request[1]] += value[0]
        elif request[0] == "ack":
            queues.ack(request[1], held[request[1]], replies(f"ack{n}"))
            held[request[1]] = []
        else:
            queues.release(request[1])
            held[request[1]] = []
        copy = queues.export()
        exported = [item for item, _, _ in copy.get("q", [])]
        assert Counter(exported) + Counter(done) == Counter(range(put))
