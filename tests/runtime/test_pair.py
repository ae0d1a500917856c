"""Two pairs of one process talking over gloo (hwplace.runtime.messaging.pair), with placements of a fake cluster:
the path a pair's device tensors take, cancelled recvs, messages the receiver cannot read, float8 tensors."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from message_pairs import placements, two_pairs

import hwplace
from hwplace.planning.sharing import HOST, NCCL
from hwplace.runtime.messaging import pair as pair_module
from hwplace.runtime.messaging.pair import MessageHandle, Pair

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.time_limit(60)

@pytest.fixture
def pairs() -> tuple[Pair, Pair]:
    trainer, rollout = placements()
    return two_pairs(trainer[0], rollout[0])


def test_a_pair_on_one_gpu_builds_no_nccl_group_and_its_tensors_go_through_the_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The colocated layout: both ends say they can use NCCL, on one GPU (the placements say so); no NCCL group."""
    built: list[str] = []
    monkeypatch.setattr(pair_module, "collective_backend", lambda placement: NCCL)
    monkeypatch.setattr(pair_module, "physical_id", lambda torch, device: "")
    monkeypatch.setattr(pair_module, "add_devices", lambda comm, key: built.append(key))
    trainer, rollout = placements()
    a, b = two_pairs(trainer[0], rollout[0])  # GPU 0 both
    b.send(torch.arange(3), async_op=False)
    assert torch.equal(a.claim().result(30), torch.arange(3))
    assert (a.path, b.path, a.hosted, b.hosted, built) == (HOST, HOST, True, True, [])
    # two GPUs by the placements, but one physical GPU (MIG slices of it): the devices' ids say so
    monkeypatch.setattr(pair_module, "physical_id", lambda torch, device: "node/pci 0000:17:00")
    a, b = two_pairs(trainer[0], rollout[1])
    b.send("hello", async_op=False)
    assert a.claim().result(30) == "hello"
    assert (a.path, b.path, built) == (HOST, HOST, [])
    # two GPUs: NCCL, both ends agree
    monkeypatch.setattr(pair_module, "physical_id", lambda torch, device: f"node/{threading.get_ident()}")
    a, b = two_pairs(trainer[0], rollout[1])
    b.send("hello", async_op=False)
    assert a.claim().result(30) == "hello"
    assert (a.path, b.path, len(built)) == (NCCL, NCCL, 2)


def test_a_cancelled_async_recv_gives_its_message_to_the_next_recv(pairs: tuple[Pair, Pair]) -> None:
    a, b = pairs

    async def give_up() -> None:
        with pytest.raises(asyncio.TimeoutError):  # noqa: PT011 (the wait_for's own, with no message)
            await asyncio.wait_for(MessageHandle(a.claim(), "recv from b"), 0.05)

    asyncio.run(give_up())
    cancelled = a.claim()
    assert cancelled.cancel()
    b.send("first", async_op=False)
    b.send("second", async_op=False)
    assert a.claim().result(30) == "first"
    assert a.claim().result(30) == "second"
    assert a.error is None


class Unreadable:
    def __reduce__(self) -> tuple[Any, ...]:
        return int, ("not a number",)  # pickles; loading it raises ValueError


def test_a_message_the_receiver_cannot_read_fails_that_recv_only(pairs: tuple[Pair, Pair]) -> None:
    a, b = pairs
    b.send(Unreadable(), async_op=False)
    b.send([Unreadable()] * 1000, async_op=False)  # large: its payload travels after the frame
    b.send("after", async_op=False)
    for _ in range(2):
        with pytest.raises(hwplace.WorkerError, match=r"group 'b' rank 0.*cannot read.*ValueError"):
            a.claim().result(30)
    assert a.claim().result(30) == "after"
    a.send("back", async_op=False)
    assert b.claim().result(30) == "back"


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_tensors_arrive_as_they_were_sent(pairs: tuple[Pair, Pair], dtype: str) -> None:
    a, b = pairs
    small = torch.linspace(-4, 4, 12).to(getattr(torch, dtype)).reshape(3, 4)
    large = torch.linspace(-4, 4, 10000).to(getattr(torch, dtype))
    for tensor in (small, large):
        b.send(tensor, async_op=False)
        got = a.claim().result(30)
        assert (got.dtype, got.shape) == (tensor.dtype, tensor.shape)
        assert torch.equal(got.view(torch.uint8), tensor.view(torch.uint8))
