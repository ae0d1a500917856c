"""Tests of the holds of hwplace.channels.queues: items taken for a holder stay its own until acknowledged
(alone, or by a put in the same step), and go back to the head of their queues, in order, with their weights
and versions, when the holder is gone.

The examples check each rule; the last test runs random sequences of requests from several holders and checks
after every step that each item put is in exactly one place: queued, held, gathered by a waiting batch, done
with (acknowledged or taken outright), or discarded as stale.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_queues import Replies, fill

from hwplace.channels.queues import QueueStats, Status, Ticket, WeightedQueues

A, B = "holder A", "holder B"  # holders are anything hashable: the host uses its connections


def held(replies: Replies, label: str) -> tuple[list[int], list[Any]]:
    """The hold ids and items a held get or get_batch replied with."""
    [(status, value)] = replies.of(label)
    assert status is Status.OK
    ids, items = value
    assert len(ids) == len(items)
    return ids, items


def take(queues: WeightedQueues, replies: Replies, label: str, target: float | None = None, *, holder: Any = A,
         name: str = "q") -> tuple[list[int], list[Any]]:
    if target is None:
        assert queues.get(name, replies(label), holder=holder) is None
    else:
        assert queues.get_batch(name, target, replies(label), holder=holder) is None
    return held(replies, label)


# -- taking and acknowledging ---------------------------------------------------------------------------


def test_a_held_get_hands_out_the_item_with_a_hold_id_and_counts_it_held_until_acknowledged() -> None:
    gone: list[Any] = []
    queues, replies = WeightedQueues(on_gone=gone.append), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    ids, items = take(queues, replies, "g")
    assert items == ["a"]
    assert queues.stats("q") == QueueStats(puts=2, gets=1, stale=0, size=1, redelivered=0, held=1)
    queues.ack(A, ids, replies("ack"))
    assert replies.of("ack") == [(Status.OK, None)]
    assert queues.stats("q") == QueueStats(puts=2, gets=1, stale=0, size=1, redelivered=0, held=0)
    assert gone == ["a"]  # an acknowledged item leaves for good: a by-reference payload is released


def test_a_held_get_batch_holds_each_item_under_its_own_id_in_order() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 2), ("c", 3)])
    ids, items = take(queues, replies, "batch", 3)
    assert items == ["a", "b"]
    assert ids == sorted(ids)
    assert len(set(ids)) == 2
    assert queues.stats("q").held == 2
    later, _ = take(queues, replies, "next")
    assert later[0] > ids[-1]  # ids grow: the order items were taken in


def test_a_waiting_held_get_batch_holds_its_items_once_complete() -> None:
    queues, replies = WeightedQueues(), Replies()
    ticket = queues.get_batch("q", 2, replies("batch"), holder=A)
    assert isinstance(ticket, Ticket)
    fill(queues, replies, "q", [("a", 1)])
    assert queues.stats("q").held == 0  # gathered, not handed out yet
    fill(queues, replies, "q", [("b", 1)])
    assert held(replies, "batch")[1] == ["a", "b"]
    assert queues.stats("q").held == 2


def test_acknowledging_what_is_not_held_acknowledges_nothing_and_counts_what_is_not() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    ids, _ = take(queues, replies, "g", 1)
    others, _ = take(queues, replies, "h", holder=B)
    queues.ack(A, [*ids, 999], replies("unknown"))
    queues.ack(A, others, replies("not mine"))
    queues.ack(A, [ids[0], ids[0]], replies("twice in one"))
    assert replies.of("unknown") == [(Status.NOT_HELD, 1)]
    assert replies.of("not mine") == [(Status.NOT_HELD, 1)]
    assert replies.of("twice in one") == [(Status.NOT_HELD, 1)]
    assert queues.stats("q").held == 2  # none of it happened
    queues.ack(A, ids, replies("ack"))
    queues.ack(A, ids, replies("again"))
    assert replies.of("again") == [(Status.NOT_HELD, 1)]
    assert queues.stats("q").held == 1


def test_a_put_with_acks_makes_its_item_visible_and_acknowledges_in_the_same_step() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "in", [("a", 1), ("b", 1)])
    ids, _ = take(queues, replies, "stage", 2, name="in")
    assert isinstance(queues.get("out", replies("downstream")), Ticket)

    def seen_at_reply(status: Status, value: Any) -> None:  # the put's own reply: both have happened already
        replies.log.append(("put", status, (queues.stats("in").held, queues.qsize("out"))))

    # One call on the host's one thread: no request of anyone else's can come between the two.
    assert queues.put("out", "result", 1.0, seen_at_reply, holder=A, acks=ids) is None
    assert replies.of("put") == [(Status.OK, (0, 1))]
    assert replies.of("downstream") == [(Status.OK, "result")]
    assert queues.stats("out") == QueueStats(puts=1, gets=1, stale=0, size=0, redelivered=0, held=0)


def test_a_put_with_acks_not_held_does_not_enter() -> None:
    gone: list[Any] = []
    queues, replies = WeightedQueues(on_gone=gone.append), Replies()
    fill(queues, replies, "in", [("a", 1)])
    ids, _ = take(queues, replies, "stage", name="in")
    queues.put("out", "result", 1.0, replies("put"), holder=B, acks=ids)
    assert replies.of("put") == [(Status.NOT_HELD, 1)]
    assert queues.stats("out").puts == 0
    assert queues.qsize("out") == 0
    assert queues.stats("in").held == 1
    assert gone == []


def test_a_put_with_acks_on_a_full_queue_keeps_the_holds_until_it_enters_then_does_both() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    fill(queues, replies, "in", [("a", 1)])
    fill(queues, replies, "out", [("x", 1)])
    ids, _ = take(queues, replies, "stage", name="in")
    assert queues.put("out", "full", 1.0, replies("nowait"), block=False, holder=A, acks=ids) is None
    assert replies.of("nowait") == [(Status.FULL, None)]
    ticket = queues.put("out", "result", 1.0, replies("put"), holder=A, acks=ids)
    assert isinstance(ticket, Ticket)
    assert queues.stats("in").held == 1  # still held while it waits
    queues.get("out", replies("make room"))
    assert replies.of("put") == [(Status.OK, None)]
    assert queues.stats("in").held == 0
    assert queues.stats("out").puts == 2


def test_a_waiting_put_whose_holds_were_acknowledged_meanwhile_does_not_enter() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    fill(queues, replies, "in", [("a", 1)])
    fill(queues, replies, "out", [("x", 1)])
    ids, _ = take(queues, replies, "stage", name="in")
    queues.put("out", "result", 1.0, replies("put"), holder=A, acks=ids)
    queues.ack(A, ids, replies("ack"))
    queues.get("out", replies("make room"))
    assert replies.of("put") == [(Status.NOT_HELD, 1)]
    assert queues.qsize("out") == 0
    assert queues.stats("out").puts == 1


def test_a_cancelled_put_with_acks_acknowledges_nothing() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    fill(queues, replies, "in", [("a", 1)])
    fill(queues, replies, "out", [("x", 1)])
    ids, _ = take(queues, replies, "stage", name="in")
    ticket = queues.put("out", "result", 1.0, replies("put"), holder=A, acks=ids)
    assert isinstance(ticket, Ticket)
    queues.cancel(ticket)
    assert replies.of("put") == [(Status.TIMEOUT, None)]
    assert queues.stats("in").held == 1


# -- the holder is gone -----------------------------------------------------------------------------------


def test_a_gone_holders_items_go_back_to_the_head_in_order_with_weights_and_versions() -> None:
    queues, replies = WeightedQueues(), Replies()
    for item, weight, version in [("a", 1.0, 1), ("b", 2.0, None), ("c", 1.0, 3), ("d", 1.0, 4)]:
        queues.put("q", item, weight, replies(f"put {item}"), version=version)
    take(queues, replies, "first")  # a
    take(queues, replies, "then", 2)  # b
    take(queues, replies, "B's", holder=B)  # c
    queues.release(A)
    assert queues.stats("q") == QueueStats(puts=4, gets=3, stale=0, size=3, redelivered=2, held=1)
    queues.get_batch("q", 3, replies("weights kept"))
    assert replies.of("weights kept") == [(Status.OK, ["a", "b"])]  # 1 + 2 reach 3: d stays
    queues.release(B)
    queues.get("q", replies("versions kept"), min_version=4)
    assert replies.of("versions kept") == [(Status.OK, "d")]  # c came back ahead of d, still of version 3
    assert queues.stats("q") == QueueStats(puts=4, gets=6, stale=1, size=0, redelivered=3, held=0)


def test_release_puts_holds_back_ahead_of_what_a_waiting_get_batch_of_the_holder_gathered() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1), ("c", 1)])
    take(queues, replies, "held")  # a
    ticket = queues.get_batch("q", 5, replies("gathering"), holder=A)  # gathers b, c and waits for more
    assert isinstance(ticket, Ticket)
    fill(queues, replies, "other", [("z", 1)])
    take(queues, replies, "elsewhere", name="other")  # z, in another queue
    queues.release(A, [ticket])
    assert replies.of("gathering") == [(Status.TIMEOUT, None)]  # to a connection that is gone: never sent
    queues.get_batch("q", 3, replies("next"))
    assert replies.of("next") == [(Status.OK, ["a", "b", "c"])]
    queues.get("other", replies("z back"))
    assert replies.of("z back") == [(Status.OK, "z")]
    assert queues.stats("q").redelivered == 1  # a; b and c were never handed out
    assert queues.stats("other").redelivered == 1


def test_release_drops_the_holders_waiting_put_and_gives_back_what_it_would_have_acknowledged() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    fill(queues, replies, "in", [("a", 1)])
    fill(queues, replies, "out", [("x", 1)])
    ids, _ = take(queues, replies, "stage", name="in")
    ticket = queues.put("out", "result", 1.0, replies("put"), holder=A, acks=ids)
    assert isinstance(ticket, Ticket)
    queues.release(A, [ticket])
    queues.get("out", replies("make room"))
    assert queues.qsize("out") == 0
    assert queues.stats("out").puts == 1
    assert queues.qsize("in") == 1
    assert queues.stats("in").redelivered == 1


def test_redelivered_items_go_past_maxsize_and_serve_a_waiting_getter_first() -> None:
    queues, replies = WeightedQueues(maxsize=2), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    take(queues, replies, "held", 1)  # a
    fill(queues, replies, "q", [("c", 1)])
    queues.release(A)
    assert queues.qsize("q") == 3  # past maxsize, as a cancelled get_batch's
    queues.get("q", replies("next"))
    assert replies.of("next") == [(Status.OK, "a")]


def test_puts_and_redeliveries_balance_gets_stale_and_size() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [(str(n), 1) for n in range(6)])
    take(queues, replies, "a", 2)
    take(queues, replies, "b", 1, holder=B)
    queues.release(A)
    take(queues, replies, "c", 0, holder=B)
    queues.release(B)
    stats = queues.stats("q")
    assert stats.redelivered == 4
    assert stats.puts + stats.redelivered == stats.gets + stats.stale + stats.size


def test_a_released_holder_holds_nothing_and_acknowledges_nothing() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 1)])
    ids, _ = take(queues, replies, "g")
    queues.release(A)
    queues.release(A)  # twice: nothing more goes back
    queues.ack(A, ids, replies("late"))
    assert replies.of("late") == [(Status.NOT_HELD, 1)]
    assert queues.qsize("q") == 1
    assert queues.stats("q").redelivered == 1


def test_unhold_gives_back_items_a_getter_never_had_as_never_taken() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    ids, _ = take(queues, replies, "interrupted", 2)
    assert queues.unhold(B, ids) is Status.NOT_HELD
    assert queues.unhold(A, ids) is Status.OK
    assert queues.stats("q") == QueueStats(puts=2, gets=0, stale=0, size=2, redelivered=0, held=0)
    assert queues.unhold(A, ids) is Status.NOT_HELD


def test_holds_need_no_queue_memory_and_a_release_brings_the_queue_back() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 1)])
    take(queues, replies, "g")
    assert queues.queue_names() == []
    queues.release(A)
    assert queues.queue_names() == ["q"]


def test_close_drops_held_items_and_refuses_later_acknowledgements() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    ids, _ = take(queues, replies, "g")
    assert sorted(queues.close()) == ["a", "b"]
    queues.ack(A, ids, replies("ack"))
    assert replies.of("ack") == [(Status.CLOSED, None)]
    assert queues.unhold(A, ids) is Status.CLOSED
    queues.release(A)  # nothing to give back


# -- conservation under random requests ------------------------------------------------------------------

HOLDERS = ("h0", "h1")
KINDS = ["put"] * 3 + ["put_ack"] * 3 + ["ack", "get", "nowait", "batch", "batch", "plain", "cancel", "release"]
steps = st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(HOLDERS), st.sampled_from(["q", "q", "r"]),
                           st.integers(0, 3)), max_size=60)


@settings(max_examples=500, deadline=None)
@given(maxsize=st.sampled_from([0, 1, 2]), ops=steps)
def test_every_item_is_in_exactly_one_place_after_every_step(maxsize: int, ops: list[tuple[str, str, str, int]]
                                                              ) -> None:
    gone: list[Any] = []
    queues = WeightedQueues(maxsize, on_gone=gone.append)
    put: Counter[Any] = Counter()
    refused: Counter[Any] = Counter()  # puts that did not enter
    done: Counter[Any] = Counter()  # acknowledged, or taken outright
    holds: dict[str, dict[int, Any]] = {holder: {} for holder in HOLDERS}  # what each holder was told it holds
    tickets: dict[str, list[Ticket]] = {holder: [] for holder in HOLDERS}

    def got(holder: str | None) -> Any:
        def reply(status: Status, value: Any) -> None:
            if status is Status.OK and holder is not None:
                holds[holder].update(zip(*value, strict=True))
            elif status is Status.OK:
                done.update(value)
        return reply

    def acknowledged(holder: str, ids: list[int], item: Any = None) -> Any:
        def reply(status: Status, value: Any) -> None:
            if status is Status.OK:
                done.update(holds[holder].pop(hold) for hold in ids)
            elif item is not None:
                refused[item] += 1
        return reply

    for step, (kind, holder, name, n) in enumerate(ops):
        mine = sorted(holds[holder])[:n]
        ticket = None
        if kind in ("put", "put_ack"):
            item = f"item {step}"
            put[item] += 1
            acks = mine if kind == "put_ack" else []
            ticket = queues.put(name, item, 1.0, acknowledged(holder, acks, item), holder=holder, acks=acks)
        elif kind == "ack":
            queues.ack(holder, mine, acknowledged(holder, mine))
        elif kind == "get":
            ticket = queues.get(name, got(holder), holder=holder)
        elif kind == "nowait":
            queues.get(name, got(holder), block=False, holder=holder)
        elif kind in ("batch", "plain"):
            ticket = queues.get_batch(name, float(n), got(holder if kind == "batch" else None),
                                      holder=holder if kind == "batch" else None)
        elif kind == "cancel" and tickets[holder]:
            queues.cancel(tickets[holder].pop(0))
        elif kind == "release":
            queues.release(holder, tickets[holder])
            tickets[holder] = []
            holds[holder].clear()
        if ticket is not None:
            tickets[holder].append(ticket)

        everywhere: Counter[Any] = Counter()
        for q in ("q", "r"):
            queue = queues._queues.get(q)
            if queue is not None:
                everywhere.update(item for item, _, _ in queue.items)
                everywhere.update(item for getter in queue.getters for item, _, _ in getter.taken)
                everywhere.update(putter.item for putter in queue.putters)
        for mine_now in holds.values():
            everywhere.update(mine_now.values())
        assert everywhere + done == put - refused, (step, kind)
        assert sum(queues.stats(q).held for q in ("q", "r")) == sum(len(h) for h in holds.values())
    assert Counter(gone) <= done  # every acknowledged item was let go (nothing is stale here)
