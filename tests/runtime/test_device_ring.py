"""The ring of device buckets of a weight sync (no Ray), on CPU through torch's file-system shared memory standing
in for CUDA IPC: memory bounded by the ring over many versions (bytes held, counted), a model larger than the ring
intact (its rest in host buckets), load_into across buckets, torn and corrupted reads, concurrent targets in
threads and in other processes, and a reader killed while it holds a version (tests/config/test_weight_sync_section.py
refuses bucket sizes out of bounds)."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import pickle
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import pytest
from slot_reading import ask, raw, reading_process

import hwplace
from hwplace.planning.sync_plan import SyncPlan, SyncTarget, source_ring_bytes
from hwplace.runtime.weight_sync import device_share
from hwplace.runtime.weight_sync.device_ring import RingReader, RingWriter, pieces
from hwplace.runtime.weight_sync.device_share import CPU, ShareKind, SlotOpenError, TornRead

torch = pytest.importorskip("torch")
nn: Any = torch.nn


def state(version: float, extra: int = 0) -> dict[str, Any]:
    """About 6 KiB in tensors of many kinds, each value saying ``version``: a parameter that wants gradients, a
    non-contiguous view, a 0-dim step, empty and odd-length ones; ``extra`` more float32 values."""
    v = float(version)
    return {"w": torch.nn.Parameter(torch.full((1000,), v)), "bf16": torch.full((33,), v, dtype=torch.bfloat16),
            "t": (torch.arange(6, dtype=torch.int16).reshape(2, 3) * int(v)).t(), "step": torch.tensor(int(v)),
            "empty": torch.zeros(0, 3), "z": torch.full((3,), complex(v, -v), dtype=torch.complex64),
            "mask": torch.tensor([True, False, v > 1]), "tail": torch.full((300 + extra,), v)}


def assert_same(got: dict[Any, Any], expected: dict[Any, Any]) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        assert (got[name].dtype, tuple(got[name].shape)) == (value.dtype, tuple(value.shape)), name
        assert torch.equal(got[name], value.detach()), name
    if isinstance(expected.get("w"), torch.nn.Parameter):
        assert isinstance(got["w"], torch.nn.Parameter)
        assert got["w"].requires_grad


def shm_files(writer: RingWriter) -> set[str]:
    return {"/dev/shm" + b.handle[1].decode() for b in writer._buckets.values()}


@pytest.mark.parametrize(("bucket_bytes", "ring"), [(64 * 2**20, 8), (1024, 16), (1024, 3), (1000, 1), (256, 2)])
def test_a_version_round_trips_whatever_the_ring(bucket_bytes: int, ring: int) -> None:
    writer, reader = RingWriter(bucket_bytes=bucket_bytes, device_buckets=ring), RingReader()
    for version in (1, 2, 3):
        descriptor = writer.write(version, state(version))
        assert_same(reader.read(descriptor), state(version))
        assert sum(b.nbytes for b in descriptor.buckets) == descriptor.nbytes
    assert writer.device_bytes <= ring * writer.bucket_bytes


def test_tensors_across_several_buckets_arrive_whole_contiguous_or_not() -> None:
    tensors = {"head": torch.ones(3), "t": torch.arange(2000.0).reshape(40, 50).t(), "mid": torch.arange(7.0),
               "u": torch.arange(900, dtype=torch.int16).reshape(30, 30)[:, ::2], "tail": torch.full((5,), 2.0)}
    writer, reader = RingWriter(bucket_bytes=1024, device_buckets=3), RingReader()
    descriptor = writer.write(1, tensors)
    assert len(descriptor.buckets) > 8
    assert_same(reader.read(descriptor), tensors)


def test_memory_stays_bounded_by_the_ring_over_many_versions() -> None:
    """Bytes held, counted at every version, whatever the sizes that come and go: the ring (device) never past
    its buckets, the host buckets never past a bucket for each the version needs beyond the ring; for a model of
    one size, exactly what sync_plan.source_ring_bytes says. A reader maps at most every bucket."""
    writer, reader = RingWriter(bucket_bytes=1024, device_buckets=4), RingReader()
    for version in range(1, 201):
        tensors = state(version, extra=(version * 397) % 3000)  # 7 to 19 KiB: from twice the ring to 5x it
        descriptor = writer.write(version, tensors)
        if version % 20 == 0:
            assert_same(reader.read(descriptor), tensors)
        beyond = max(0, len(descriptor.buckets) - 4)
        assert writer.device_bytes <= 4 * 1024, version
        assert writer.host_bytes <= beyond * 1024, version
        assert len(writer._locks) == len(writer._buckets) <= 4 + beyond
        assert reader.mapped <= 4 + 20
    fresh = RingWriter(bucket_bytes=1024, device_buckets=4)
    for version in range(1, 5):
        descriptor = fresh.write(version, state(version))
        assert (fresh.device_bytes, fresh.host_bytes) == source_ring_bytes(descriptor.nbytes, 1024, 4)
    small = writer.write(203, {"a": torch.ones(16)})  # a small model: both ends of the ring, no host bucket
    writer.write(204, {"a": torch.ones(16)})
    assert writer.device_bytes <= 2 * 1024
    assert writer.host_bytes == 0
    assert source_ring_bytes(small.nbytes, 1024, 4) == (2 * small.nbytes, 0)  # what a fresh ring takes


def test_what_the_plan_states_is_what_the_ring_holds() -> None:
    plan = SyncPlan((SyncTarget("rollout", 0, 0, "same-device"), SyncTarget("rollout", 1, 0, "same-node")),
                    ("trainer", 0), 0, (0,), bucket_bytes=1024, device_buckets=4)
    for extra in (0, 100, 1000, 5000, 20000):
        writer = RingWriter(bucket_bytes=1024, device_buckets=4)
        descriptor = writer.write(1, state(1, extra))
        writer.write(2, state(2, extra))
        assert plan.device_bytes(descriptor.nbytes) == {"source": writer.device_bytes, "rollout 0": descriptor.nbytes}
        sync = hwplace.WeightSync("policy", "trainer", 0, plan, "uid")
        assert sync.device_bytes(state(2, extra)) == plan.device_bytes(descriptor.nbytes)  # from the state dict
        assert device_share.layout_bytes(state(2, extra)) == descriptor.nbytes
        assert sum(t.nbytes for t in state(2, extra).values()) < descriptor.nbytes  # the sum would understate it
        writer.close()
    text = str(plan)
    assert "ring of 4 buckets of 1 KiB" in text
    assert "at most 4 KiB" in text
    assert "rollout 0 (node 0, the source's device): M with latest(), 0 with load_into" in text
    assert "rollout 1" not in text.split("\n", 1)[1]  # a same-node target holds no device memory


def test_a_model_larger_than_the_ring_puts_its_rest_in_host_buckets_and_arrives_intact() -> None:
    writer, reader = RingWriter(bucket_bytes=512, device_buckets=2), RingReader()
    descriptor = writer.write(1, state(1))
    assert [b.index for b in descriptor.buckets] == list(range(len(descriptor.buckets)))
    assert len(descriptor.buckets) > 2
    assert [b.digest.split(":")[0] for b in descriptor.buckets[:3]] == ["wsum", "wsum", "xxh3t"]
    assert (writer.device_bytes, writer.host_bytes) == (1024, descriptor.nbytes - 1024)
    assert_same(reader.read(descriptor), state(1))


class Net(nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1000))
        self.tail = torch.nn.Parameter(torch.zeros(300))
        self.register_buffer("bf16", torch.zeros(33, dtype=torch.bfloat16))
        self.register_buffer("t", torch.zeros(3, 2, dtype=torch.int16))
        self.register_buffer("step", torch.tensor(0))
        self.register_buffer("empty", torch.zeros(0, 3))
        self.register_buffer("z", torch.zeros(3, dtype=torch.complex64))
        self.register_buffer("mask", torch.zeros(3, dtype=torch.bool))


def test_load_copies_across_buckets_straight_into_the_modules_tensors() -> None:
    writer, reader, net = RingWriter(bucket_bytes=512, device_buckets=2), RingReader(), Net()
    w = net.w.data_ptr()
    descriptor = writer.write(1, state(3))
    assert any(e.offset // 512 != (e.offset + e.nbytes - 1) // 512 for e in descriptor.entries if e.nbytes)
    reader.load(descriptor, net)
    assert net.w.data_ptr() == w  # written in place, no tensor of the target's own
    for name, value in state(3).items():
        assert torch.equal(net.state_dict()[name], value.detach()), name


def test_load_into_a_module_that_does_not_match_is_load_state_dicts_own_error() -> None:
    writer, reader, net = RingWriter(bucket_bytes=512, device_buckets=2), RingReader(), Net()
    del net.mask
    with pytest.raises(RuntimeError, match="Unexpected key\\(s\\) in state_dict: \"mask\""):
        reader.load(writer.write(1, state(3)), net)


def test_two_versions_in_half_the_ring_each_stay_whole_while_the_next_is_written() -> None:
    writer, reader = RingWriter(bucket_bytes=4096, device_buckets=4), RingReader()
    d1 = writer.write(1, state(1))
    d2 = writer.write(2, state(2))
    assert {b.index for b in d1.buckets}.isdisjoint(b.index for b in d2.buckets)
    assert_same(reader.read(d1), state(1))  # still whole
    writer.write(3, state(3))
    with pytest.raises(TornRead, match=r"version 1: bucket 0 was overwritten \(it holds version 3"):
        reader.read(d1)
    assert_same(reader.read(d2), state(2))


def test_a_single_buffered_version_is_torn_once_the_next_is_written() -> None:
    writer, reader = RingWriter(bucket_bytes=1024, device_buckets=3), RingReader()
    d1 = writer.write(1, state(1))
    writer.write(2, state(2))
    with pytest.raises(TornRead, match="version 1: bucket 0 was overwritten"):
        reader.read(d1)


@pytest.mark.parametrize("index", [0, 1, 4])
def test_a_corrupted_bucket_is_named_and_nothing_is_copied(index: int) -> None:
    writer, reader = RingWriter(bucket_bytes=1024, device_buckets=2), RingReader()
    descriptor = writer.write(1, state(1))
    writer._buckets[index].buffer[5] ^= 0xFF  # after its digest was taken
    into = torch.zeros(descriptor.nbytes, dtype=torch.uint8)
    with pytest.raises(hwplace.WeightSyncError, match=f"version 1: bucket {index} does not match its digest"):
        reader.read(descriptor, into=into)
    assert not into.any()
    bad = replace(descriptor, buckets=tuple(replace(b, nbytes=b.nbytes + 10**6) if b.index == index else b
                                            for b in descriptor.buckets))
    with pytest.raises(TornRead, match=f"bucket {index} holds .* fewer than"):
        reader.read(bad)


def test_targets_in_threads_read_while_versions_are_written_and_never_see_a_mix() -> None:
    writer = RingWriter(bucket_bytes=1024, device_buckets=3)
    descriptors = [writer.write(1, state(1))]
    seen: list[tuple[int, bool]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        reader = RingReader()
        while not done.is_set():
            descriptor = descriptors[-1]
            try:
                got = reader.read(descriptor)
            except TornRead:
                continue
            except BaseException as exc:  # pragma: no cover - what the test reports
                errors.append(exc)
                return
            want = state(descriptor.version)
            seen.append((descriptor.version, all(torch.equal(got[k], v.detach()) for k, v in want.items())))

    threads = [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for version in range(2, 60):
        descriptors.append(writer.write(version, state(version)))
    done.set()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert seen
    assert all(whole for _, whole in seen)
    assert writer.device_bytes <= 3 * 1024


@pytest.fixture
def other_process() -> Iterator[Connection]:
    with reading_process() as connection:
        yield connection


def expected(tensors: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v.dtype), tuple(v.shape), v.device.type, raw(v)) for k, v in tensors.items()}


@pytest.mark.time_limit(120)
def test_two_targets_in_other_processes_read_the_ring_and_its_host_buckets() -> None:
    writer = RingWriter(bucket_bytes=1024, device_buckets=2)
    with reading_process() as first, reading_process() as second:
        for version in (1, 2, 3):
            descriptor = writer.write(version, state(version))
            assert ask(first, descriptor) == ask(second, descriptor) == expected(state(version))
        stale = descriptor
        writer.write(4, state(4))
        error = ask(second, stale)
        assert isinstance(error, TornRead)
        assert "version 3: bucket 0 was overwritten" in str(error)
        files = shm_files(writer)
        writer.close()
        assert writer.device_bytes == writer.host_bytes == 0
    assert not any(os.path.exists(f) for f in files)  # freed once the readers let go too


def _hold(descriptor: Any, connection: Connection) -> None:
    reader = RingReader()
    with reader.held(descriptor):
        connection.send("holding")
        connection.recv()  # never comes: the test kills this process while it holds the version


@pytest.mark.time_limit(120)
def test_a_reader_killed_while_it_holds_a_version_lets_go_of_it() -> None:
    writer = RingWriter(bucket_bytes=1024, device_buckets=2)
    descriptor = writer.write(1, state(1))
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    process = context.Process(target=_hold, args=(descriptor, theirs), daemon=True)
    process.start()
    try:
        assert mine.poll(60)
        assert mine.recv() == "holding"
        lock = writer._locks[0]
        with pytest.raises(BlockingIOError, match="Resource temporarily unavailable"):  # no rewriting bucket 0 now
            fcntl.flock(lock.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        process.kill()
        process.join(60)
    finally:
        if process.is_alive():  # pragma: no cover
            process.kill()
    fcntl.flock(lock.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its hold went with it
    fcntl.flock(lock.fd, fcntl.LOCK_UN)
    assert_same(RingReader().read(writer.write(2, state(2))), state(2))


def test_closing_frees_every_bucket_and_a_reader_its_mappings() -> None:
    writer, reader = RingWriter(bucket_bytes=1024, device_buckets=2), RingReader()
    descriptor = writer.write(1, state(1))
    reader.read(descriptor)
    files = shm_files(writer)
    assert files
    assert all(os.path.exists(f) for f in files)
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(TornRead, match="cannot be opened"):
        reader.read(descriptor)
    reader.close()
    assert reader.mapped == 0
    assert not any(os.path.exists(f) for f in files)
    with pytest.raises(hwplace.WeightSyncError, match="version 2: the device buckets are closed"):
        writer.write(2, state(2))


def test_a_version_of_more_buckets_than_a_target_can_hold_is_refused_naming_bucket_bytes() -> None:
    writer = RingWriter(bucket_bytes=256, device_buckets=2)
    with pytest.raises(hwplace.WeightSyncError, match=r"version 1: 1048832 bytes make 4097 buckets of bucket_bytes "
                       r"256, more than the 4096 a target can hold at once; give the sync a bucket_bytes of at least "
                       r"257"):
        writer.write(1, {"a": torch.zeros(2**18 + 64)})
    assert writer.device_bytes == writer.host_bytes == 0  # nothing written
    writer.write(1, {"a": torch.zeros(2**18 - 256)})  # 4096 buckets: still whole


def test_pieces_cut_a_range_at_bucket_boundaries() -> None:
    assert list(pieces(1000, 3000, 1024)) == [(0, 1000, 0, 24), (1, 0, 24, 1024), (2, 0, 1048, 1024),
                                              (3, 0, 2072, 928)]
    assert list(pieces(0, 0, 1024)) == []


def test_a_descriptor_pickles_and_what_is_read_is_a_copy_of_its_own() -> None:
    writer, reader = RingWriter(), RingReader()
    descriptor = writer.write(1, state(1))
    assert [b.kind for b in descriptor.buckets] == ["cpu"]
    assert (descriptor.version, descriptor.device, descriptor.uuid) == (1, -1, "")
    assert pickle.loads(pickle.dumps(descriptor)) == descriptor
    got = reader.read(descriptor)
    writer.write(2, state(2))
    writer.write(3, state(3))  # overwrites the bucket version 1 was read from
    assert_same(got, state(1))


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The handles readers open, in order."""
    handles: list[Any] = []

    def counting_open(handle: Any, index: int) -> Any:
        handles.append(handle)
        return CPU.open(handle, index)

    monkeypatch.setitem(device_share.KINDS, "cpu", ShareKind("cpu", CPU.share, counting_open))
    return handles


def test_buckets_keep_their_allocation_until_a_version_outgrows_one_and_are_mapped_once_each(
        opened: list[Any]) -> None:
    writer, reader = RingWriter(bucket_bytes=4096, device_buckets=4), RingReader()
    small, large = {"a": torch.ones(100)}, {"a": torch.ones(100), "b": torch.arange(500.0)}
    d1, d2, d3 = (writer.write(v, {"a": torch.full((100,), float(v))}) for v in (1, 2, 3))
    assert [d.buckets[0].index for d in (d1, d2, d3)] == [0, 3, 0]  # the ring's two ends in turn
    assert d3.buckets[0].handle == d1.buckets[0].handle != d2.buckets[0].handle
    for d in (d2, d3):
        assert torch.equal(reader.read(d)["a"], torch.full((100,), float(d.version)))
    assert opened == [d2.buckets[0].handle, d1.buckets[0].handle]
    d4 = writer.write(4, large)  # bucket 3 is too small now: a new allocation, a new handle
    assert d4.buckets[0].index == 3
    assert d4.buckets[0].generation not in (d1.buckets[0].generation, d2.buckets[0].generation)
    d5 = writer.write(5, small)  # bucket 0 still fits
    assert (d5.buckets[0].index, d5.buckets[0].handle) == (0, d1.buckets[0].handle)
    assert_same(reader.read(d4), large)
    assert_same(reader.read(d5), small)
    assert_same(reader.read(d4), large)
    assert opened == [d2.buckets[0].handle, d1.buckets[0].handle, d4.buckets[0].handle]  # once per allocation


def test_a_reader_lets_go_of_a_buckets_old_allocation_even_when_the_new_one_is_gone() -> None:
    writer, reader = RingWriter(bucket_bytes=8192, device_buckets=1), RingReader()
    d1 = writer.write(1, {"a": torch.ones(10)})
    reader.read(d1)
    path = "/dev/shm" + d1.buckets[0].handle[1].decode()
    grown = writer.write(2, {"a": torch.ones(10), "b": torch.ones(1000)})  # bucket 0's second allocation
    assert os.path.exists(path)  # the reader still maps the first
    del writer  # and the second is gone before the reader gets to it
    with pytest.raises(TornRead, match="version 2: bucket 0 generation 2 cannot be opened"):
        reader.read(grown)
    assert not os.path.exists(path)


@pytest.mark.parametrize(("tensors", "message"), [
    ({"x": "text"}, "entry 'x' is 'text'; a slot holds torch tensors"),
    ({"a": torch.ones(1), "b": torch.ones(1, device="meta")}, "entry 'b' is on meta, the entries before it on cpu"),
    ({"m": torch.ones(1, device="meta")}, "entry 'm' is on meta; .* one of cuda, cpu"),
    ({"s": torch.ones(2).to_sparse()},
     r"entry 's' is a torch.sparse_coo tensor of torch.float32; a slot holds torch tensors \(dense, strided\)"),
    ({}, "a non-empty mapping of names to torch tensors"),
    ([1, 2], r"^a slot holds a non-empty mapping of names to torch tensors, got \[1, 2\]$"),
])
def test_what_the_ring_cannot_hold_is_named_and_nothing_is_written(tensors: Any, message: str) -> None:
    writer = RingWriter()
    with pytest.raises(hwplace.WeightSyncError, match=message):
        writer.write(1, tensors)
    assert writer.device_bytes == 0


def test_empty_tensors_keep_their_dtype_and_shape_and_an_empty_version_travels() -> None:
    tensors = {"a": torch.ones(3), "e16": torch.zeros(0, 3, dtype=torch.int16),
               "eb": torch.zeros(0, dtype=torch.bool), "ez": torch.zeros(2, 0, dtype=torch.complex64)}
    writer, reader = RingWriter(bucket_bytes=256, device_buckets=2), RingReader()
    assert_same(reader.read(writer.write(1, tensors)), tensors)
    nothing = {"e": torch.zeros(0, 4)}
    assert_same(reader.read(writer.write(2, nothing)), nothing)


def test_each_process_keeps_the_devices_it_sees_and_cpu_buckets_need_none_of_them() -> None:
    writer, reader = RingWriter(visible=[3, 1]), RingReader(visible=[2, 5])
    assert (writer.visible, reader.visible) == ((3, 1), (2, 5))
    tensors = {"a": torch.arange(5.0)}
    assert_same(reader.read(writer.write(1, tensors)), tensors)  # a CPU bucket is no GPU's: no device to map


def test_one_reader_tells_two_writers_buckets_apart() -> None:
    first, second, reader = RingWriter(), RingWriter(), RingReader()
    a = first.write(1, {"a": torch.full((8,), 1.0)})
    b = second.write(1, {"a": torch.full((8,), 2.0)})  # bucket 0, generation 1 too, of another writer
    assert (a.buckets[0].index, a.buckets[0].generation) == (b.buckets[0].index, b.buckets[0].generation)
    assert torch.equal(reader.read(a)["a"], torch.full((8,), 1.0))
    assert torch.equal(reader.read(b)["a"], torch.full((8,), 2.0))
    assert torch.equal(reader.read(a)["a"], torch.full((8,), 1.0))


def test_a_torn_read_names_what_the_bucket_holds_and_corruption_both_digests() -> None:
    writer = RingWriter(bucket_bytes=1024, device_buckets=1)
    d1 = writer.write(1, {"a": torch.ones(64)})
    writer.write(3, {"a": torch.full((64,), 3.0)})
    with pytest.raises(TornRead, match=(r"^weight sync version 1: bucket 0 was overwritten \(it holds version 3 of "
                                        r"generation 1 now\); read a newer version$")) as info:
        RingReader().read(d1)
    assert (info.value.version, info.value.reason) == (1, "bucket 0 was overwritten (it holds version 3 of "
                                                          "generation 1 now); read a newer version")
    digest = d1.buckets[0].digest
    with pytest.raises(hwplace.WeightSyncError, match=(
            rf"^weight sync version 3: bucket 0 does not match its digest \(digest wsum:[0-9a-f]{{16}}:"
            rf"[0-9a-f]{{16}}:256, expected {re.escape(digest)}\): corrupted; the previous version stays the "
            r"latest$")):
        RingReader().read(replace(d1, version=3))


def test_a_bucket_of_an_unknown_kind_is_named() -> None:
    writer = RingWriter()
    descriptor = writer.write(7, {"a": torch.ones(4)})
    bad = replace(descriptor, buckets=(replace(descriptor.buckets[0], kind="tpu"),))
    with pytest.raises(hwplace.WeightSyncError,
                       match=r"^weight sync version 7: bucket kind 'tpu' is unknown here \(cuda, cpu\)$"):
        RingReader().read(bad)


def test_a_bucket_whose_allocation_failed_is_allocated_again(monkeypatch: pytest.MonkeyPatch) -> None:
    failures = [RuntimeError("no room in /dev/shm")]

    def flaky_share(storage: Any) -> Any:
        if failures:
            raise failures.pop()
        return CPU.share(storage)

    monkeypatch.setitem(device_share.KINDS, "cpu", ShareKind("cpu", flaky_share, CPU.open))
    writer = RingWriter()
    with pytest.raises(RuntimeError, match="no room in /dev/shm"):
        writer.write(1, {"a": torch.ones(4)})
    descriptor = writer.write(2, {"a": torch.full((4,), 2.0)})
    assert torch.equal(RingReader().read(descriptor)["a"], torch.full((4,), 2.0))


def test_a_bucket_being_written_is_skipped_and_the_writer_waits_for_a_reader_copying_it() -> None:
    writer, reader = RingWriter(bucket_bytes=1024, device_buckets=1), RingReader()
    d1 = writer.write(1, {"a": torch.full((64,), 1.0)})
    with writer._locks[0].exclusive():  # as while the writer rewrites bucket 0
        with pytest.raises(TornRead, match="version 1: bucket 0 is being written") as info:
            reader.read(d1)
        writer._locks[0].stamp(d1.buckets[0].generation, 1)  # it wrote version 1 again
    assert info.value.version == 1
    written = threading.Event()
    with reader.held(d1) as parts:  # a reader copying version 1: its bucket is the next one written
        def write() -> None:
            writer.write(2, {"a": torch.full((64,), 2.0)})
            written.set()

        thread = threading.Thread(target=write)
        thread.start()
        assert not written.wait(0.3)  # the writer waits for the reader, however long it takes
        assert torch.equal(parts[0].view(torch.float32), torch.full((64,), 1.0))  # never torn
    thread.join(60)
    assert written.is_set()


def test_a_bucket_that_cannot_be_mapped_is_an_error_naming_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(handle: Any, index: int) -> Any:
        raise RuntimeError("pidfd_getfd: Operation not permitted")

    writer = RingWriter()
    descriptor = writer.write(1, {"a": torch.ones(4)})
    monkeypatch.setitem(device_share.KINDS, "cpu", ShareKind("cpu", CPU.share, refused))
    with pytest.raises(SlotOpenError, match=r"^weight sync version 1: cannot map bucket 0 of the source \(process "
                                            rf"{os.getpid()}, cpu device -1\) in this process: pidfd_getfd: "
                                            r"Operation not permitted\. .*expandable_segments") as info:
        RingReader().read(descriptor)
    assert not isinstance(info.value, TornRead)  # no race to skip: every version fails so


def test_a_reader_copies_into_a_buffer_it_hands_in_when_it_fits() -> None:
    writer, reader = RingWriter(), RingReader()
    buffer = torch.zeros(4096, dtype=torch.uint8)
    got = reader.read(writer.write(1, {"a": torch.full((8,), 1.0)}), into=buffer)
    assert got["a"].untyped_storage().data_ptr() == buffer.data_ptr()
    assert torch.equal(buffer[:32].view(torch.float32), torch.full((8,), 1.0))
    small = torch.zeros(4, dtype=torch.uint8)
    got = reader.read(writer.write(2, {"a": torch.full((8,), 2.0)}), into=small)
    assert got["a"].untyped_storage().data_ptr() != small.data_ptr()
    assert torch.equal(got["a"], torch.full((8,), 2.0))
