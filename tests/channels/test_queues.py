"""Tests of hwplace.queues: the transport-free model of a channel (named weighted FIFO queues with waiters).

The first part checks each rule of the contract on small examples. The second runs random sequences of
requests against an independent reference model (items in plain lists, every waiting request in one
arrival-ordered list, and the outcome of each step recomputed from scratch) and compares every reply, every
queue's contents, and the conservation of items after each step.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from hwplace.channels.queues import QueueStats, Status, Ticket, WeightedQueues

# -- helpers ------------------------------------------------------------------------------------------


class Replies:
    """Hands out reply callbacks and records every call they get, in order, under the request's label."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Status, Any]] = []

    def __call__(self, label: str) -> Callable[[Status, Any], None]:
        def reply(status: Status, value: Any) -> None:
            self.log.append((label, status, value))

        return reply

    def of(self, label: str) -> list[tuple[Status, Any]]:
        return [(status, value) for name, status, value in self.log if name == label]

    def labels(self) -> list[str]:
        return [name for name, _, _ in self.log]


def fill(queues: WeightedQueues, replies: Replies, name: str, items: Iterable[tuple[str, float]]) -> None:
    for item, weight in items:
        assert queues.put(name, item, weight, replies(f"put {item}"), block=False) is None
        assert replies.of(f"put {item}") == [(Status.OK, None)]


# -- FIFO, maxsize, names ------------------------------------------------------------------------------


def test_items_leave_a_queue_in_the_order_they_were_put() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1), ("c", 1)])
    assert queues.qsize("q") == 3
    for label in ("g1", "g2", "g3"):
        assert queues.get("q", replies(label)) is None
    assert [replies.of(label) for label in ("g1", "g2", "g3")] == [[(Status.OK, "a")], [(Status.OK, "b")],
                                                                 [(Status.OK, "c")]]
    assert queues.qsize("q") == 0


def test_queues_with_different_names_are_independent() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    fill(queues, replies, "a", [("a1", 1)])
    assert queues.full("a")
    assert not queues.full("b")
    assert queues.qsize("b") == 0
    # a full "a" does not block "b"; an empty "b" does not see the item of "a"
    assert queues.put("b", "b1", 1, replies("put b1"), block=False) is None
    assert replies.of("put b1") == [(Status.OK, None)]
    queues.get("c", replies("get c"), block=False)
    assert replies.of("get c") == [(Status.EMPTY, None)]
    # a getter waiting on "c" is not served by puts to other queues
    ticket = queues.get("c", replies("wait c"))
    assert isinstance(ticket, Ticket)
    queues.put("b", "b2", 1, replies("put b2"))  # "b" is full: this put waits
    assert replies.of("wait c") == []
    queues.get("a", replies("get a"))
    queues.get("b", replies("get b"))
    assert replies.of("get a") == [(Status.OK, "a1")]
    assert replies.of("get b") == [(Status.OK, "b1")]
    assert replies.of("put b2") == [(Status.OK, None)]
    assert (queues.qsize("a"), queues.qsize("b"), queues.qsize("c")) == (0, 1, 0)
    queues.put("c", "c1", 1, replies("put c1"))
    assert replies.of("wait c") == [(Status.OK, "c1")]


def test_maxsize_zero_means_unbounded() -> None:
    queues, replies = WeightedQueues(maxsize=0), Replies()
    fill(queues, replies, "q", [(f"i{n}", 1) for n in range(1000)])
    assert queues.qsize("q") == 1000
    assert not queues.full("q")


def test_put_waits_while_the_queue_is_full_and_enters_once_there_is_room() -> None:
    queues, replies = WeightedQueues(maxsize=2), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    assert queues.full("q")
    ticket = queues.put("q", "c", 1, replies("put c"))
    assert isinstance(ticket, Ticket)
    assert replies.of("put c") == []
    assert queues.qsize("q") == 2  # a waiting put is not in the queue
    queues.get("q", replies("g1"))
    assert replies.of("g1") == [(Status.OK, "a")]
    assert replies.of("put c") == [(Status.OK, None)]
    assert ticket.done
    assert queues.qsize("q") == 2
    assert queues.full("q")
    queues.get("q", replies("g2"))
    queues.get("q", replies("g3"))
    assert [replies.of("g2"), replies.of("g3")] == [[(Status.OK, "b")], [(Status.OK, "c")]]
    assert not queues.full("q")


def test_blocked_getters_are_served_in_arrival_order() -> None:
    queues, replies = WeightedQueues(), Replies()
    tickets = [queues.get("q", replies(f"g{n}")) for n in range(4)]
    assert all(isinstance(ticket, Ticket) for ticket in tickets)
    fill(queues, replies, "q", [("a", 1), ("b", 1), ("c", 1)])
    assert [replies.of(f"g{n}") for n in range(4)] == [[(Status.OK, "a")], [(Status.OK, "b")], [(Status.OK, "c")],
                                                       []]
    assert queues.qsize("q") == 0
    fill(queues, replies, "q", [("d", 1)])
    assert replies.of("g3") == [(Status.OK, "d")]


def test_blocked_putters_enter_in_arrival_order() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    fill(queues, replies, "q", [("a", 1)])
    tickets = [queues.put("q", item, 1, replies(f"put {item}")) for item in ("b", "c", "d")]
    assert all(isinstance(ticket, Ticket) for ticket in tickets)
    got = []
    for n in range(4):
        queues.get("q", replies(f"g{n}"))
        got.append(replies.of(f"g{n}")[0][1])
    assert got == ["a", "b", "c", "d"]
    entered = [label for label in replies.labels() if label in ("put b", "put c", "put d")]
    assert entered == ["put b", "put c", "put d"]
    assert queues.qsize("q") == 0


def test_a_blocking_get_returns_a_ticket_only_when_it_has_to_wait() -> None:
    queues, replies = WeightedQueues(), Replies()
    assert queues.get("q", replies("g1")) is not None
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    assert queues.get("q", replies("g2")) is None
    assert replies.of("g2") == [(Status.OK, "b")]


# -- nowait --------------------------------------------------------------------------------------------


def test_get_nowait_on_an_empty_queue_replies_empty() -> None:
    queues, replies = WeightedQueues(), Replies()
    assert queues.get("q", replies("g"), block=False) is None
    assert replies.of("g") == [(Status.EMPTY, None)]
    # it does not wait: a later put stays in the queue
    fill(queues, replies, "q", [("a", 1)])
    assert queues.qsize("q") == 1
    assert replies.of("g") == [(Status.EMPTY, None)]


def test_get_nowait_takes_the_head_item_when_there_is_one() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    assert queues.get("q", replies("g"), block=False) is None
    assert replies.of("g") == [(Status.OK, "a")]
    assert queues.qsize("q") == 1


def test_get_nowait_does_not_take_items_held_by_a_waiting_get_batch() -> None:
    queues, replies = WeightedQueues(), Replies()
    ticket = queues.get_batch("q", 5, replies("batch"))
    fill(queues, replies, "q", [("a", 1)])
    assert isinstance(ticket, Ticket)
    assert [item for item, *_ in ticket.taken] == ["a"]
    queues.get("q", replies("g"), block=False)
    assert replies.of("g") == [(Status.EMPTY, None)]


def test_put_nowait_on_a_full_queue_replies_full_and_leaves_the_queue_alone() -> None:
    queues, replies = WeightedQueues(maxsize=2), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    assert queues.put("q", "c", 1, replies("put c"), block=False) is None
    assert replies.of("put c") == [(Status.FULL, None)]
    assert queues.qsize("q") == 2
    # "c" never enters, even when room frees up
    for label in ("g1", "g2"):
        queues.get("q", replies(label))
    queues.get("q", replies("g3"), block=False)
    assert [replies.of(label) for label in ("g1", "g2", "g3")] == [[(Status.OK, "a")], [(Status.OK, "b")],
                                                                 [(Status.EMPTY, None)]]


# -- get_batch -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected", "left"),
    [
        (3, ["w1", "w2"], ["w3"]),  # 1 + 2 reaches 3
        (4, ["w1", "w2", "w3"], []),  # 1 + 2 < 4, 1 + 2 + 3 exceeds it
        (6, ["w1", "w2", "w3"], []),  # exactly the sum of all
        (1, ["w1"], ["w2", "w3"]),  # the first item alone reaches it
        (2.5, ["w1", "w2"], ["w3"]),
        (0, ["w1"], ["w2", "w3"]),  # at least one item, even for target 0
        (0.5, ["w1"], ["w2", "w3"]),
    ],
)
def test_get_batch_takes_items_in_order_until_their_weight_reaches_the_target(
    target: float, expected: list[str], left: list[str]
) -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("w1", 1), ("w2", 2), ("w3", 3)])
    assert queues.get_batch("q", target, replies("batch")) is None
    assert replies.of("batch") == [(Status.OK, expected)]
    assert queues.qsize("q") == len(left)
    rest = []
    for n in range(len(left)):
        queues.get("q", replies(f"g{n}"), block=False)
        rest.append(replies.of(f"g{n}")[0][1])
    assert rest == left


def test_get_batch_with_target_zero_takes_exactly_one_item_even_of_weight_zero() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 0), ("b", 0)])
    queues.get_batch("q", 0, replies("batch"))
    assert replies.of("batch") == [(Status.OK, ["a"])]
    assert queues.qsize("q") == 1


def test_get_batch_with_target_zero_on_an_empty_queue_waits_for_one_item() -> None:
    queues, replies = WeightedQueues(), Replies()
    ticket = queues.get_batch("q", 0, replies("batch"))
    assert isinstance(ticket, Ticket)
    assert replies.of("batch") == []
    fill(queues, replies, "q", [("a", 5), ("b", 1)])
    assert replies.of("batch") == [(Status.OK, ["a"])]
    assert queues.qsize("q") == 1


def test_items_of_weight_zero_count_towards_the_batch_but_add_nothing() -> None:
    queues, replies = WeightedQueues(), Replies()
    fill(queues, replies, "q", [("a", 0), ("b", 0), ("c", 1), ("d", 0)])
    queues.get_batch("q", 1, replies("batch"))
    assert replies.of("batch") == [(Status.OK, ["a", "b", "c"])]
    assert queues.qsize("q") == 1


def test_waiting_get_batch_holds_its_items_outside_the_queue() -> None:
    queues, replies = WeightedQueues(maxsize=5), Replies()
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    ticket = queues.get_batch("q", 4, replies("batch"))
    assert isinstance(ticket, Ticket)
    assert replies.of("batch") == []
    assert queues.qsize("q") == 0
    assert [item for item, *_ in ticket.taken] == ["a", "b"]
    fill(queues, replies, "q", [("c", 1)])
    assert queues.qsize("q") == 0
    assert replies.of("batch") == []
    fill(queues, replies, "q", [("d", 5), ("e", 1)])  # 1 + 1 + 1 + 5 exceeds 4; "e" stays
    assert replies.of("batch") == [(Status.OK, ["a", "b", "c", "d"])]
    assert ticket.done
    assert queues.qsize("q") == 1


def test_get_batch_larger_than_maxsize_completes_while_producers_keep_putting() -> None:
    queues, replies = WeightedQueues(maxsize=2), Replies()
    ticket = queues.get_batch("q", 10, replies("batch"))
    assert isinstance(ticket, Ticket)
    for n in range(10):
        # never FULL: the batch takes each item out of the queue as it comes
        assert queues.put("q", n, 1, replies(f"put {n}"), block=False) is None
        assert replies.of(f"put {n}") == [(Status.OK, None)]
        assert queues.qsize("q") == 0
        assert not queues.full("q")
    assert replies.of("batch") == [(Status.OK, list(range(10)))]


def test_get_batch_lets_blocked_putters_in_as_it_takes_from_a_full_queue() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    fill(queues, replies, "q", [("a", 1)])
    putters = [queues.put("q", item, 1, replies(f"put {item}")) for item in ("b", "c", "d")]
    assert all(isinstance(ticket, Ticket) for ticket in putters)
    queues.get_batch("q", 3, replies("batch"))
    assert replies.of("batch") == [(Status.OK, ["a", "b", "c"])]
    assert [replies.of(f"put {item}") for item in ("b", "c", "d")] == [[(Status.OK, None)]] * 3
    assert queues.qsize("q") == 1
    queues.get("q", replies("g"))
    assert replies.of("g") == [(Status.OK, "d")]


def test_blocked_get_batches_are_served_in_arrival_order() -> None:
    queues, replies = WeightedQueues(), Replies()
    first = queues.get_batch("q", 2, replies("first"))
    second = queues.get_batch("q", 1, replies("second"))
    assert isinstance(first, Ticket)
    assert isinstance(second, Ticket)
    fill(queues, replies, "q", [("a", 1)])
    assert [item for item, *_ in first.taken] == ["a"]
    assert second.taken == []
    fill(queues, replies, "q", [("b", 1), ("c", 1)])
    assert replies.of("first") == [(Status.OK, ["a", "b"])]
    assert replies.of("second") == [(Status.OK, ["c"])]
    assert replies.labels().index("first") < replies.labels().index("second")


# -- cancel (a timeout) ---------------------------------------------------------------------------------


def test_cancelled_get_replies_timeout_and_takes_nothing() -> None:
    queues, replies = WeightedQueues(), Replies()
    ticket = queues.get("q", replies("g"))
    assert isinstance(ticket, Ticket)
    queues.cancel(ticket)
    assert replies.of("g") == [(Status.TIMEOUT, None)]
    assert ticket.done
    fill(queues, replies, "q", [("a", 1)])
    assert queues.qsize("q") == 1
    assert replies.of("g") == [(Status.TIMEOUT, None)]


def test_items_put_back_go_to_the_head_in_order_past_maxsize_and_serve_a_waiting_getter() -> None:
    queues, replies = WeightedQueues(maxsize=2), Replies()
    queues.put("q", "a", 2.0, replies("put a"), version=5)
    fill(queues, replies, "q", [("b", 1)])
    queues.get_batch("q", 3, replies("interrupted"))  # its caller never takes them
    fill(queues, replies, "q", [("c", 1), ("d", 1)])
    assert queues.put_back("q", [("a", 2.0, 5), ("b", 1.0, None)])
    assert queues.qsize("q") == 4
    assert queues.stats("q") == QueueStats(puts=4, gets=0, stale=0, size=4)  # handed out, then taken back
    queues.get_batch("q", 3, replies("batch"), min_version=6)  # "a" is stale for it: its version came back too
    assert replies.of("batch") == [(Status.OK, ["b", "c", "d"])]
    queues.close()
    assert not queues.put_back("q", [("e", 0.0, None)])


def test_cancelled_getter_is_skipped_and_the_next_one_is_served() -> None:
    queues, replies = WeightedQueues(), Replies()
    tickets = [queues.get("q", replies(f"g{n}")) for n in range(3)]
    assert isinstance(tickets[1], Ticket)
    queues.cancel(tickets[1])
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    assert replies.of("g0") == [(Status.OK, "a")]
    assert replies.of("g1") == [(Status.TIMEOUT, None)]
    assert replies.of("g2") == [(Status.OK, "b")]


def test_cancelled_get_batch_puts_its_items_back_at_the_head_in_order() -> None:
    queues, replies = WeightedQueues(), Replies()
    ticket = queues.get_batch("q", 10, replies("batch"))
    assert isinstance(ticket, Ticket)
    fill(queues, replies, "q", [("a", 1), ("b", 2), ("c", 3)])
    assert queues.qsize("q") == 0
    queues.cancel(ticket)
    assert replies.of("batch") == [(Status.TIMEOUT, None)]
    assert queues.qsize("q") == 3
    fill(queues, replies, "q", [("d", 1)])
    got = []
    for n in range(4):
        queues.get("q", replies(f"g{n}"), block=False)
        got.append(replies.of(f"g{n}")[0][1])
    assert got == ["a", "b", "c", "d"]


def test_items_of_a_cancelled_get_batch_keep_their_weights() -> None:
    queues, replies = WeightedQueues(), Replies()
    ticket = queues.get_batch("q", 10, replies("batch"))
    assert isinstance(ticket, Ticket)
    fill(queues, replies, "q", [("a", 1), ("b", 2), ("c", 3)])
    queues.cancel(ticket)
    queues.get_batch("q", 3, replies("again"))
    assert replies.of("again") == [(Status.OK, ["a", "b"])]


def test_cancelled_get_batch_items_serve_the_next_waiting_getters() -> None:
    queues, replies = WeightedQueues(), Replies()
    first = queues.get_batch("q", 10, replies("first"))
    plain = queues.get("q", replies("plain"))
    second = queues.get_batch("q", 3, replies("second"))
    assert isinstance(first, Ticket)
    assert isinstance(plain, Ticket)
    assert isinstance(second, Ticket)
    fill(queues, replies, "q", [("a", 1), ("b", 1), ("c", 1)])
    assert [item for item, *_ in first.taken] == ["a", "b", "c"]
    queues.cancel(first)
    assert replies.of("first") == [(Status.TIMEOUT, None)]
    assert replies.of("plain") == [(Status.OK, "a")]
    # "second" now holds b and c (weight 2 of 3) and keeps waiting
    assert replies.of("second") == []
    assert [item for item, *_ in second.taken] == ["b", "c"]
    assert queues.qsize("q") == 0
    fill(queues, replies, "q", [("d", 1)])
    assert replies.of("second") == [(Status.OK, ["b", "c", "d"])]


def test_cancelled_get_batch_can_leave_the_queue_above_maxsize() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    ticket = queues.get_batch("q", 10, replies("batch"))
    assert isinstance(ticket, Ticket)
    fill(queues, replies, "q", [("a", 1), ("b", 1), ("c", 1)])
    queues.cancel(ticket)
    assert queues.qsize("q") == 3
    assert queues.full("q")
    queues.put("q", "d", 1, replies("put d"), block=False)
    assert replies.of("put d") == [(Status.FULL, None)]
    blocked = queues.put("q", "e", 1, replies("put e"))
    assert isinstance(blocked, Ticket)
    for n in range(2):
        queues.get("q", replies(f"g{n}"))
    assert replies.of("put e") == []  # one item left: still at maxsize
    queues.get("q", replies("g2"))
    assert replies.of("put e") == [(Status.OK, None)]
    queues.get("q", replies("g3"))
    assert [replies.of(f"g{n}")[0][1] for n in range(4)] == ["a", "b", "c", "e"]


def test_cancelled_put_replies_timeout_and_never_enters() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    fill(queues, replies, "q", [("a", 1)])
    ticket = queues.put("q", "b", 1, replies("put b"))
    assert isinstance(ticket, Ticket)
    queues.cancel(ticket)
    assert replies.of("put b") == [(Status.TIMEOUT, None)]
    queues.get("q", replies("g1"))
    queues.get("q", replies("g2"), block=False)
    assert replies.of("g1") == [(Status.OK, "a")]
    assert replies.of("g2") == [(Status.EMPTY, None)]
    assert queues.qsize("q") == 0
    assert replies.of("put b") == [(Status.TIMEOUT, None)]


def test_cancelled_putter_is_skipped_and_the_next_one_enters() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    fill(queues, replies, "q", [("a", 1)])
    tickets = [queues.put("q", item, 1, replies(f"put {item}")) for item in ("b", "c", "d")]
    assert isinstance(tickets[1], Ticket)
    queues.cancel(tickets[1])
    got = []
    for n in range(3):
        queues.get("q", replies(f"g{n}"))
        got.append(replies.of(f"g{n}")[0][1])
    assert got == ["a", "b", "d"]
    assert replies.of("put c") == [(Status.TIMEOUT, None)]


def test_cancel_of_a_finished_ticket_does_nothing() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    getter = queues.get("q", replies("g"))
    batch = queues.get_batch("q", 5, replies("batch"))
    assert isinstance(getter, Ticket)
    assert isinstance(batch, Ticket)
    fill(queues, replies, "q", [("a", 1), ("b", 1)])
    assert replies.of("g") == [(Status.OK, "a")]
    queues.cancel(getter)  # already answered
    assert replies.of("g") == [(Status.OK, "a")]
    assert [item for item, *_ in batch.taken] == ["b"]  # the batch still waits, holding "b"
    queues.cancel(batch)
    queues.cancel(batch)  # cancelled twice: the second does nothing
    assert replies.of("batch") == [(Status.TIMEOUT, None)]
    assert queues.qsize("q") == 1  # "b" went back once, not twice
    putter = queues.put("q", "c", 1, replies("put c"))
    assert isinstance(putter, Ticket)
    queues.get("q", replies("g2"))
    assert replies.of("put c") == [(Status.OK, None)]
    queues.cancel(putter)  # a put that entered stays in
    assert replies.of("put c") == [(Status.OK, None)]
    assert queues.qsize("q") == 1
    queues.get("q", replies("g3"))
    assert replies.of("g3") == [(Status.OK, "c")]


# -- close ---------------------------------------------------------------------------------------------


def test_close_answers_every_waiter_closed_and_returns_every_dropped_item() -> None:
    queues, replies = WeightedQueues(maxsize=2), Replies()
    fill(queues, replies, "full", [("f1", 1), ("f2", 1)])
    putter = queues.put("full", "carried", 1, replies("putter"))
    batch = queues.get_batch("batch", 10, replies("batch"))
    fill(queues, replies, "batch", [("held1", 1), ("held2", 1)])
    getter = queues.get("empty", replies("getter"))
    assert isinstance(putter, Ticket)
    assert isinstance(batch, Ticket)
    assert isinstance(getter, Ticket)
    waiters = {"putter": putter, "batch": batch, "getter": getter}
    dropped = queues.close()
    assert sorted(dropped) == sorted(["f1", "f2", "carried", "held1", "held2"])
    for label in waiters:
        assert replies.of(label) == [(Status.CLOSED, None)]
    assert all(ticket.done for ticket in waiters.values())
    for name in ("full", "batch", "empty"):
        assert queues.qsize(name) == 0
        assert not queues.full(name)


def test_every_request_after_close_replies_closed() -> None:
    queues, replies = WeightedQueues(maxsize=1), Replies()
    fill(queues, replies, "q", [("a", 1)])
    assert queues.close() == ["a"]
    assert queues.put("q", "b", 1, replies("put")) is None
    assert queues.put("q", "c", 1, replies("put nowait"), block=False) is None
    assert queues.get("q", replies("get")) is None
    assert queues.get("q", replies("get nowait"), block=False) is None
    assert queues.get_batch("q", 1, replies("get_batch")) is None
    assert queues.get("new", replies("new queue")) is None
    for label in ("put", "put nowait", "get", "get nowait", "get_batch", "new queue"):
        assert replies.of(label) == [(Status.CLOSED, None)]
    assert queues.qsize("q") == 0
    assert queues.close() == []


def test_cancel_after_close_does_not_answer_again() -> None:
    queues, replies = WeightedQueues(), Replies()
    ticket = queues.get("q", replies("g"))
    assert isinstance(ticket, Ticket)
    queues.close()
    queues.cancel(ticket)
    assert replies.of("g") == [(Status.CLOSED, None)]


def test_close_with_nothing_in_it_returns_an_empty_list() -> None:
    queues = WeightedQueues()
    assert queues.close() == []
    assert queues.closed


# -- against a reference model ----------------------------------------------------------------------------

NAMES = ("a", "b")
WEIGHTS = (0.0, 0.5, 1.0, 2.0, 3.0)
TARGETS = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 7.5, 10.0)


@dataclass
class Waiting:
    """A request of the reference model that has not been answered yet."""

    rid: int  # arrival order, over all queues
    kind: str  # "put", "get" or "get_batch"
    queue: str
    item: int = 0  # put: the item it carries
    weight: float = 0.0
    target: float = 0.0
    version: int | None = None  # put: the item's version; get and get_batch: the least version taken
    held: list[tuple[int, float, int | None]] = field(default_factory=list)  # get_batch: what it has gathered


Outcome = tuple[Status, Any]


class Reference:
    """The contract, restated: per queue a plain list of items; every waiting request in one list.

    After each step it recomputes, from scratch, which waiting requests complete. It sees each queue as one
    stream of items in the order they will leave: what waiting getters hold, then the queued items, then the
    items carried by waiting puts. Waiting getters, in arrival order, take from the front of that stream
    (a get one item, a get_batch items until their weight reaches its target, else all that is left). A put
    whose item a getter took has entered; of the rest, a put enters when fewer than ``maxsize`` items are
    ahead of it in what remains. A getter with a ``min_version`` discards, as stale, every item of an older
    version that comes to it from that stream; untagged items always pass.
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.closed = False
        self.queued: dict[str, list[tuple[int, float, int | None]]] = {name: [] for name in NAMES}
        self.waiting: list[Waiting] = []
        self.stale: dict[str, list[int]] = {name: [] for name in NAMES}  # the items discarded as stale

    def request(self, request: Waiting, block: bool) -> dict[int, Outcome]:
        if self.closed:
            return {request.rid: (Status.CLOSED, None)}
        self.waiting.append(request)
        outcomes = self._recompute()
        if request.rid not in outcomes and not block:
            self.waiting.remove(request)
            outcomes[request.rid] = (Status.FULL if request.kind == "put" else Status.EMPTY, None)
        return outcomes

    def cancel(self, rid: int) -> dict[int, Outcome]:
        found = [request for request in self.waiting if request.rid == rid]
        if not found:
            return {}
        request = found[0]
        self.waiting.remove(request)
        self.queued[request.queue][:0] = request.held
        return {rid: (Status.TIMEOUT, None), **self._recompute()}

    def close(self) -> tuple[dict[int, Outcome], list[int]]:
        self.closed = True
        dropped = [item for items in self.queued.values() for item, _, _ in items]
        dropped += [item for request in self.waiting for item, _, _ in request.held]
        dropped += [request.item for request in self.waiting if request.kind == "put"]
        outcomes = {request.rid: (Status.CLOSED, None) for request in self.waiting}
        self.waiting = []
        self.queued = {name: [] for name in NAMES}
        return outcomes, dropped

    def _recompute(self) -> dict[int, Outcome]:
        outcomes: dict[int, Outcome] = {}
        for name in NAMES:
            getters = [request for request in self.waiting if request.queue == name and request.kind != "put"]
            putters = [request for request in self.waiting if request.queue == name and request.kind == "put"]
            stream: list[tuple[int, float, int | None, Waiting | None]] = [
                (item, weight, version, None) for getter in getters for item, weight, version in getter.held
            ]
            stream += [(item, weight, version, None) for item, weight, version in self.queued[name]]
            stream += [(putter.item, putter.weight, putter.version, putter) for putter in putters]
            front = 0
            for getter in getters:
                getter.held = []
                taken, total = [], 0.0
                while front < len(stream):
                    entry = stream[front]
                    front += 1
                    if entry[2] is not None and getter.version is not None and entry[2] < getter.version:
                        self.stale[name].append(entry[0])
                        continue
                    taken.append(entry)
                    total += entry[1]
                    if getter.kind == "get" or total >= getter.target:
                        break
                if getter.kind == "get":
                    if taken:
                        outcomes[getter.rid] = (Status.OK, taken[0][0])
                elif taken and total >= getter.target:
                    outcomes[getter.rid] = (Status.OK, [entry[0] for entry in taken])
                else:
                    getter.held = [(item, weight, version) for item, weight, version, _ in taken]
            for _, _, _, origin in stream[:front]:
                if origin is not None:
                    outcomes[origin.rid] = (Status.OK, None)
            self.queued[name] = []
            for ahead, (item, weight, version, origin) in enumerate(stream[front:]):
                if origin is not None:
                    if self.maxsize and ahead >= self.maxsize:
                        break
                    outcomes[origin.rid] = (Status.OK, None)
                self.queued[name].append((item, weight, version))
        self.waiting = [request for request in self.waiting if request.rid not in outcomes]
        return outcomes


@dataclass(frozen=True)
class Op:
    """One step of a random run; each kind reads only the fields it needs."""

    kind: str  # put, get, get_batch, cancel (a waiting request), cancel_any (any ticket ever returned), close
    queue: str = "a"
    weight: float = 1.0
    target: float = 1.0
    block: bool = True
    pick: int = 0
    version: int | None = None  # put: the item's version; get and get_batch: min_version


# close is rare (every run ends with one anyway): everything after it only replies CLOSED
KINDS = ["put"] * 16 + ["get"] * 6 + ["get_batch"] * 6 + ["cancel"] * 6 + ["cancel_any"] * 2 + ["close"]
operations = st.builds(
    Op,
    kind=st.sampled_from(KINDS),
    queue=st.sampled_from(NAMES),
    weight=st.sampled_from(WEIGHTS),
    target=st.sampled_from(TARGETS),
    block=st.booleans(),
    pick=st.integers(min_value=0, max_value=15),
    version=st.sampled_from([None, None, 1, 2, 3]),
)


def queued_items(queues: WeightedQueues, name: str) -> list[tuple[Any, float, int | None]]:
    """What queue ``name`` holds, read from WeightedQueues' internals (no public API lists the items)."""
    queue = queues._queues.get(name)
    return list(queue.items) if queue is not None else []


def run_against_reference(maxsize: int, ops: list[Op]) -> None:
    queues = WeightedQueues(maxsize)
    reference = Reference(maxsize)
    log: list[tuple[int, Status, Any]] = []
    tickets: dict[int, Ticket] = {}  # every ticket the implementation handed out, by request id
    requests: dict[int, Waiting] = {}  # every request made, by id
    rids, items = itertools.count(), itertools.count(1000)
    put_in: Counter[int] = Counter()  # items of puts answered OK, plus those of waiting puts dropped by close
    got: Counter[int] = Counter()
    dropped_by_close: Counter[int] = Counter()
    entered = Counter[str]()  # per queue: puts answered OK (before any close)
    handed = Counter[str]()  # per queue: items got

    def reply_for(rid: int) -> Callable[[Status, Any], None]:
        def reply(status: Status, value: Any) -> None:
            log.append((rid, status, value))

        return reply

    for op in [*ops, Op("close")]:  # a final close answers whatever still waits
        start = len(log)
        rid: int | None = None
        returned: Ticket | None = None
        dropped: list[Any] | None = None
        if op.kind in ("put", "get", "get_batch"):
            rid = next(rids)
            request = Waiting(rid, op.kind, op.queue, version=op.version)
            if op.kind == "put":
                request.item, request.weight = next(items), op.weight
                returned = queues.put(op.queue, request.item, op.weight, reply_for(rid), block=op.block,
                                      version=op.version)
            elif op.kind == "get":
                returned = queues.get(op.queue, reply_for(rid), block=op.block, min_version=op.version)
            else:
                request.target = op.target
                returned = queues.get_batch(op.queue, op.target, reply_for(rid), min_version=op.version)
            requests[rid] = request
            if returned is not None:
                tickets[rid] = returned
            expected = reference.request(request, op.block or op.kind == "get_batch")
        elif op.kind == "cancel":
            if not reference.waiting:
                continue
            chosen = reference.waiting[op.pick % len(reference.waiting)].rid
            assert chosen in tickets, f"request {chosen} waits in the reference but got no ticket"
            queues.cancel(tickets[chosen])
            expected = reference.cancel(chosen)
        elif op.kind == "cancel_any":
            if not tickets:
                continue
            chosen = sorted(tickets)[op.pick % len(tickets)]
            queues.cancel(tickets[chosen])
            expected = reference.cancel(chosen)
        else:
            dropped = queues.close()
            expected, expected_dropped = reference.close()
            assert Counter(dropped) == Counter(expected_dropped)

        step = log[start:]
        answered_now = [answered for answered, _, _ in step]
        # every reply is the one the contract gives, and nothing else replies
        assert len(answered_now) == len(set(answered_now)), f"a request answered twice in one step: {step}"
        assert {answered: (status, value) for answered, status, value in step} == expected
        # within a step, the gets of a queue complete in arrival order, and so do its puts
        for name, kind in itertools.product(NAMES, ("put", "get")):
            order = [
                answered
                for answered, status, _ in step
                if status is Status.OK
                and requests[answered].queue == name
                and (requests[answered].kind == "put") == (kind == "put")
            ]
            assert order == sorted(order)
        # a request returns a ticket exactly when it has to wait
        if rid is not None:
            assert (returned is None) == (rid in answered_now)
        for answered, status, value in step:
            request = requests[answered]
            if status is Status.OK:
                if request.kind == "put":
                    put_in[request.item] += 1
                    entered[request.queue] += 1
                elif request.kind == "get":
                    got[value] += 1
                    handed[request.queue] += 1
                else:
                    got.update(value)
                    handed[request.queue] += len(value)
            elif status is Status.CLOSED and request.kind == "put" and dropped is not None:
                put_in[request.item] += 1
        if dropped is not None:
            dropped_by_close.update(dropped)

        # the state matches: each queue's contents, qsize and full, and what each waiting get_batch holds
        for name in NAMES:
            assert queued_items(queues, name) == reference.queued[name]
            assert queues.qsize(name) == len(reference.queued[name])
            assert queues.full(name) == bool(maxsize and len(reference.queued[name]) >= maxsize)
        waiting_now = {request.rid for request in reference.waiting}
        assert {answered for answered, ticket in tickets.items() if not ticket.done} == waiting_now
        for request in reference.waiting:
            assert tickets[request.rid].taken == request.held
            # stats: what entered, what was handed out, what was discarded as stale, the size now
            assert queues.stats(name) == QueueStats(entered[name], handed[name], len(reference.stale[name]),
                                                    len(reference.queued[name]))
        # conservation: nothing is lost or made up; stale items are discarded, counted, never handed out
        queued = Counter(item for name in NAMES for item, _, _ in queued_items(queues, name))
        held = Counter(item for ticket in tickets.values() if not ticket.done for item, _, _ in ticket.taken)
        stale = Counter(item for name in NAMES for item in reference.stale[name])
        assert put_in == got + queued + held + dropped_by_close + stale

    # every request was answered exactly once
    answered_ids = [answered for answered, _, _ in log]
    assert sorted(answered_ids) == sorted(requests)
    assert not reference.waiting


@settings(deadline=None, max_examples=400, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(maxsize=st.sampled_from([0, 1, 2, 3]), ops=st.lists(operations, min_size=8, max_size=60))
def test_random_sequences_of_requests_match_the_reference_model(maxsize: int, ops: list[Op]) -> None:
    run_against_reference(maxsize, ops)


@pytest.mark.parametrize(
    ("maxsize", "ops"),
    [
        # a batch bigger than maxsize, filled by puts that never block, then cancelled: its items go back
        (1, [Op("get_batch", target=7.5), *[Op("put", weight=1.0, block=False)] * 5, Op("cancel"),
             Op("get"), Op("get_batch", target=2.0), Op("put", block=False)]),
        # puts blocked on a full queue let in one by one as a batch drains it
        (2, [*[Op("put", weight=1.0)] * 5, Op("get_batch", target=4.0), Op("get", block=False)]),
        # a cancelled batch's items serve a plain get and another batch waiting behind it
        (0, [Op("get_batch", target=7.5), Op("get"), Op("get_batch", target=2.0), *[Op("put", weight=1.0)] * 3,
             Op("cancel", pick=0), Op("put", weight=3.0)]),
        # close in the middle: every waiter answered CLOSED, then every request too
        (1, [Op("put"), Op("put"), Op("get", queue="b"), Op("get_batch", queue="b", target=3.0),
             Op("put", queue="b"), Op("close"), Op("put"), Op("get", block=False), Op("cancel_any")]),
    ],
)
def test_known_sequences_match_the_reference_model(maxsize: int, ops: list[Op]) -> None:
    run_against_reference(maxsize, ops)


def test_the_reference_model_follows_the_contract_examples() -> None:
    """Guards the oracle itself: the 1,2,3 batch examples and a cancelled batch, answered by hand."""
    reference = Reference(maxsize=0)
    for rid, weight in enumerate((1.0, 2.0, 3.0)):
        assert reference.request(Waiting(rid, "put", "a", item=rid, weight=weight), block=True) == {
            rid: (Status.OK, None)
        }
    assert reference.request(Waiting(10, "get_batch", "a", target=3.0), block=True) == {10: (Status.OK, [0, 1])}
    assert reference.request(Waiting(11, "get_batch", "a", target=4.0), block=True) == {}
    assert reference.waiting[0].held == [(2, 3.0, None)]
    assert reference.cancel(11) == {11: (Status.TIMEOUT, None)}
    assert reference.queued["a"] == [(2, 3.0, None)]
    assert reference.request(Waiting(12, "get", "a"), block=False) == {12: (Status.OK, 2)}
    assert reference.request(Waiting(13, "get", "a"), block=False) == {13: (Status.EMPTY, None)}


# -- memory per queue name -----------------------------------------------------------------------------


def test_a_queue_is_forgotten_once_empty_and_unused() -> None:
    queues = WeightedQueues(maxsize=1)
    replies: list[tuple[Status, Any]] = []

    def reply(status: Status, value: Any) -> None:
        replies.append((status, value))

    for n in range(1000):  # a get_nowait that finds nothing leaves nothing behind
        queues.get(f"probe{n}", reply, block=False)
    assert queues.queue_names() == []
    queues.put("a", 1, 1.0, reply)
    waiting_put = queues.put("a", 2, 1.0, reply)
    waiting_get = queues.get("b", reply)
    batch = queues.get_batch("c", 5.0, reply)
    assert sorted(queues.queue_names()) == ["a", "b", "c"]  # in use: items or waiters
    assert waiting_put is not None
    assert waiting_get is not None
    assert batch is not None
    queues.get("a", reply)
    queues.get("a", reply)
    queues.cancel(waiting_get)
    assert sorted(queues.queue_names()) == ["c"]
    queues.put("c", 3, 1.0, reply)  # held by the waiting batch, outside the queue: still in use
    assert queues.queue_names() == ["c"]
    queues.cancel(batch)  # what it held goes back: the queue holds an item
    assert queues.queue_names() == ["c"]
    queues.get("c", reply)
    assert queues.queue_names() == []
    assert [s for s, _ in replies].count(Status.EMPTY) == 1000


# -- versions and stats ------------------------------------------------------------------------------------


def test_a_get_with_min_version_discards_older_items_and_counts_them() -> None:
    queues, replies = WeightedQueues(), Replies()
    for item, version in (("v4", 4), ("v5", 5), ("v6", 6), ("v7", 7)):
        queues.put("q", item, 1, replies(f"put {item}"), version=version)
    queues.get("q", replies("g"), min_version=6)
    assert replies.of("g") == [(Status.OK, "v6")]
    assert queues.stats("q") == QueueStats(puts=4, gets=1, stale=2, size=1)


def test_items_without_a_version_are_never_skipped() -> None:
    queues, replies = WeightedQueues(), Replies()
    queues.put("q", "old", 1, replies("p1"), version=1)
    queues.put("q", "untagged", 1, replies("p2"))
    queues.put("q", "new", 1, replies("p3"), version=9)
    queues.get_batch("q", 2, replies("batch"), min_version=5)
    assert replies.of("batch") == [(Status.OK, ["untagged", "new"])]
    assert queues.stats("q") == QueueStats(puts=3, gets=2, stale=1, size=0)


def test_a_waiting_get_batch_discards_stale_items_as_they_come() -> None:
    discarded: list[Any] = []
    queues, replies = WeightedQueues(on_gone=discarded.append), Replies()
    ticket = queues.get_batch("q", 3, replies("batch"), min_version=2)
    assert isinstance(ticket, Ticket)
    for item, version in (("a", 2), ("b", 1), ("c", 3), ("d", 1), ("e", 2)):
        queues.put("q", item, 1, replies(f"put {item}"), version=version)
    assert replies.of("batch") == [(Status.OK, ["a", "c", "e"])]
    assert discarded == ["b", "d"]
    assert queues.stats("q").stale == 2


def test_get_nowait_discards_stale_items_and_takes_what_a_waiting_put_brings() -> None:
    discarded: list[Any] = []
    queues, replies = WeightedQueues(maxsize=1, on_gone=discarded.append), Replies()
    queues.put("q", "old", 1, replies("p1"), version=1)
    blocked = queues.put("q", "next", 1, replies("p2"), version=3)
    assert isinstance(blocked, Ticket)
    queues.get("q", replies("g"), block=False, min_version=2)
    # "old" is discarded, which lets the waiting put in, and its item is what the get takes
    assert discarded == ["old"]
    assert replies.of("p2") == [(Status.OK, None)]
    assert replies.of("g") == [(Status.OK, "next")]
    queues.get("q", replies("g2"), block=False, min_version=2)
    assert replies.of("g2") == [(Status.EMPTY, None)]


def test_a_getter_without_min_version_takes_old_items() -> None:
    queues, replies = WeightedQueues(), Replies()
    queues.put("q", "old", 1, replies("p"), version=1)
    queues.get("q", replies("g"))
    assert replies.of("g") == [(Status.OK, "old")]
    assert queues.stats("q") == QueueStats(puts=1, gets=1, stale=0, size=0)
    assert queues.stats("never used") == QueueStats()
