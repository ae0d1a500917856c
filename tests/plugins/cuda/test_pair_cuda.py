"""Messaging pairs with CUDA tensors, without Ray (``tox -e cuda``): two workers on one GPU (the colocated layout)
exchange large CUDA tensors both ways at once through the host and get them on their own device, and the
NCCL groups a pair would use take hwplace's settings. Skips, saying why, where there is no CUDA GPU."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from message_pairs import placements, two_pairs

from hwplace.planning.sharing import HOST, NCCL
from hwplace.runtime.messaging import devices
from hwplace.runtime.messaging import pair as pair_module

torch = pytest.importorskip("torch", reason="torch is not installed: pip install 'hwplace[torch]'")
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU; torch.cuda.device_count() is 0"),
              pytest.mark.time_limit(120)]


def test_two_workers_on_one_gpu_send_large_cuda_tensors_to_each_other_at_once_through_the_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The placements say two GPUs, but both workers hold cuda:0: their devices' ids keep NCCL off the pair
    (NCCL would refuse it: "Duplicate GPU detected"), and the tensors land on the GPU all the same."""
    monkeypatch.setattr(pair_module, "collective_backend", lambda placement: NCCL)  # the fake cluster's type
    trainer, rollout = placements()
    a, b = two_pairs(trainer[0], rollout[1])
    tensors = {"a": torch.arange(2**26, dtype=torch.float32, device="cuda"),
               "b": -torch.arange(2**26, dtype=torch.float32, device="cuda")}
    got: dict[str, Any] = {}

    def exchange(me: str, pair: Any) -> None:
        pair.send(tensors[me], async_op=False)
        got[me] = pair.claim().result(60)

    threads = [threading.Thread(target=exchange, args=args) for args in (("a", a), ("b", b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert (a.path, b.path, a.hosted, b.hosted) == (HOST, HOST, True, True)
    assert devices.physical_id(torch, 0)  # the id that showed they share the GPU
    for me, other in (("a", "b"), ("b", "a")):
        assert got[me].device == torch.device("cuda", 0)
        assert torch.equal(got[me], tensors[other])


def test_a_pairs_nccl_groups_run_wait_and_abort_on_a_gpu() -> None:
    """One member here (a pair needs two GPUs): the groups take the options and the settings; a transfer is
    waited for from the host; aborting them afterwards raises nothing."""
    dist = torch.distributed
    store = dist.TCPStore("127.0.0.1", 0, 1, True)
    os.environ[devices.ERROR_HANDLING] = "3"
    groups = devices.nccl_groups(dist, store, "msg/test", 0, 1, 30.0)
    assert os.environ[devices.ERROR_HANDLING] == "3"
    tensor = torch.ones(1024, device="cuda")
    devices.wait_work(groups[0].allreduce([tensor]), lambda: None, groups)
    assert float(tensor.sum()) == 1024.0
    devices.abort(groups)
