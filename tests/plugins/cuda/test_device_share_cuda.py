"""The same-device ring through CUDA IPC between two processes on one GPU (``tox -e cuda``): CUDA tensors reach the
other process on the GPU, without host memory (or, for a model larger than the ring, its rest through host
buckets), torn reads included; skips, saying why, without a CUDA GPU."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import pytest
from slot_reading import ask, raw, reading_process

from hwplace.runtime.weight_sync.device_ring import RingWriter
from hwplace.runtime.weight_sync.device_share import SlotOpenError, TornRead, device_digest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install 'hwplace[torch]'")

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_a_gpu = pytest.mark.skipif(GPUS < 1, reason=f"needs a CUDA GPU for CUDA IPC; this machine has {GPUS} "
                                 "(torch.cuda.device_count())")


def state(scale: float, device: str = "cuda:0") -> dict[str, Any]:
    return {"w": torch.arange(4096, dtype=torch.float32, device=device).reshape(64, 64) * scale,
            "half": torch.full((33,), scale, dtype=torch.bfloat16, device=device),
            "step": torch.tensor(int(scale), device=device), "empty": torch.zeros(0, 3, device=device),
            "t": (torch.arange(6, dtype=torch.int16, device=device).reshape(2, 3) * int(scale)).t()}


def expected(tensors: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v.dtype), tuple(v.shape), "cuda", raw(v)) for k, v in tensors.items()}


@pytest.fixture
def other_process() -> Iterator[Connection]:
    with reading_process() as connection:
        yield connection


@needs_a_gpu
@pytest.mark.time_limit(300)
def test_cuda_buckets_are_read_on_the_gpu_in_another_process(other_process: Connection) -> None:
    writer = RingWriter()
    d1 = writer.write(1, state(1.0))
    assert ([b.kind for b in d1.buckets], d1.device) == (["cuda"], 0)
    assert d1.uuid == str(torch.cuda.get_device_properties(0).uuid)
    on_cpu = RingWriter().write(1, {k: v.cpu() for k, v in state(1.0).items()})
    assert d1.buckets[0].digest == on_cpu.buckets[0].digest  # same bytes, same digest
    assert ask(other_process, d1) == expected(state(1.0))
    d2 = writer.write(2, state(2.0))
    d3 = writer.write(3, state(3.0))
    assert (d3.buckets[0].index, d3.buckets[0].handle) == (d1.buckets[0].index, d1.buckets[0].handle)
    error = ask(other_process, d1)
    assert isinstance(error, TornRead)
    assert "version 1: bucket 0 was overwritten" in str(error)
    assert ask(other_process, d2) == expected(state(2.0))
    assert ask(other_process, d3) == expected(state(3.0))
    grown = {**state(4.0), "more": torch.ones(2**20, device="cuda:0")}
    d4 = writer.write(4, grown)
    assert (d4.buckets[0].index, d4.buckets[0].handle != d2.buckets[0].handle) == (7, True)
    assert ask(other_process, d4) == expected(grown)


@needs_a_gpu
@pytest.mark.time_limit(300)
def test_a_model_larger_than_the_ring_arrives_on_the_gpu_through_host_buckets(other_process: Connection) -> None:
    writer = RingWriter(bucket_bytes=2**20, device_buckets=2)  # 2 MiB on the GPU for a model of 4 MiB and more
    grown = {**state(5.0), "more": torch.full((2**20,), 5.0, device="cuda:0")}
    descriptor = writer.write(1, grown)
    assert [b.kind for b in descriptor.buckets][:3] == ["cuda", "cuda", "cpu"]
    assert writer.device_bytes == 2 * 2**20
    assert ask(other_process, descriptor) == expected(grown)  # every tensor on the reader's GPU


@needs_a_gpu
@pytest.mark.time_limit(300)
def test_a_cuda_bucket_that_cannot_be_mapped_is_an_error_naming_the_cause(other_process: Connection) -> None:
    writer = RingWriter()
    descriptor = writer.write(1, state(1.0))
    bucket = descriptor.buckets[0]
    handle = (bucket.handle[0], b"\0" * len(bucket.handle[1]), *bucket.handle[2:])
    broken = replace(descriptor, buckets=(replace(bucket, handle=handle),))
    error = ask(other_process, broken)
    assert isinstance(error, SlotOpenError), error
    assert "cannot map bucket 0 of the source" in str(error)
    assert ask(other_process, descriptor) == expected(state(1.0))  # the real one still reads


@needs_a_gpu
@pytest.mark.time_limit(300)
def test_closing_the_writer_gives_its_ring_back(other_process: Connection) -> None:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    writer = RingWriter()
    big = {"w": torch.ones(2**22, device="cuda:0")}  # 16 MiB
    ask(other_process, writer.write(1, big))
    ask(other_process, writer.write(2, big))
    assert writer.device_bytes == 2 * 2**24
    writer.close()
    writer.close()
    assert writer.device_bytes == 0
    assert torch.cuda.memory_allocated(0) - before == 2**24  # only the state dict itself is left


@needs_a_gpu
@pytest.mark.parametrize("length", [1, 5, 4097, 2**20 + 3])
def test_the_digest_on_the_gpu_is_the_one_on_the_cpu_at_any_length(length: int) -> None:
    data = torch.randint(0, 256, (length + 1,), dtype=torch.uint8)
    for view in (data[:length], data[1:]):
        assert device_digest(view.cuda(), chunk_words=1000) == device_digest(view, chunk_words=1000)
