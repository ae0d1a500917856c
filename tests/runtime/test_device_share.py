"""Device slots of a weight sync (no Ray), on CPU through torch's file-system shared memory: the digest, the
layout, round trips in one process and across two, double buffering, torn and corrupted reads, the mapping of
device indices, and no shared memory left behind."""

from __future__ import annotations

import os
import pickle
import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from slot_reading import ask, raw, reading_process

import hwplace
from hwplace.runtime.weight_sync import device_share
from hwplace.runtime.weight_sync.device_share import (
    ALIGN,
    CPU,
    ShareKind,
    SlotOpenError,
    SlotReader,
    SlotWriter,
    TornRead,
    device_digest,
    device_index,
    physical_device,
    slot_layout,
)

torch = pytest.importorskip("torch")
MASK = 2**64 - 1


def reference_digest(data: bytes) -> str:
    """The digest by its definition, in plain Python."""
    padded = data + b"\0" * (-len(data) % 4)
    words = struct.unpack(f"<{len(padded) // 4}i", padded)
    s1 = sum(words) & MASK
    s2 = sum(w * (i + 1) for i, w in enumerate(words)) & MASK
    return f"wsum:{s1:016x}:{s2:016x}:{len(data)}"


def as_tensor(data: bytes) -> Any:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def state(scale: float = 1.0) -> dict[str, Any]:
    """Several dtypes and shapes: 0-dim, empty, non-contiguous, a parameter that wants gradients."""
    return {"w": torch.nn.Parameter(torch.arange(12, dtype=torch.float32).reshape(3, 4) * scale),
            "half": torch.full((5,), 0.5 * scale, dtype=torch.bfloat16),
            "mask": torch.tensor([True, False, True]), "step": torch.tensor(int(7 * scale)),
            "empty": torch.zeros(0, 2), "t": (torch.arange(6, dtype=torch.int16).reshape(2, 3) * int(scale)).t(),
            "z": torch.tensor([1 + 2j], dtype=torch.complex64) * scale, "big": torch.arange(1000, dtype=torch.int64)}


def assert_same(got: dict[Any, Any], expected: dict[Any, Any]) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        assert (got[name].dtype, tuple(got[name].shape)) == (value.dtype, tuple(value.shape)), name
        assert torch.equal(got[name], value.detach()), name


@given(st.binary(max_size=200), st.integers(1, 9))
def test_the_digest_is_its_definition_in_any_chunk_size(data: bytes, chunk_words: int) -> None:
    assert device_digest(as_tensor(data), chunk_words) == reference_digest(data)


def test_the_digest_wraps_like_int64_and_reads_misaligned_bytes() -> None:
    data = struct.pack("<i", 2**31 - 1) * 2**17  # s2 passes 2**64
    assert device_digest(as_tensor(data), chunk_words=2**15) == reference_digest(data)
    assert int(reference_digest(data).split(":")[2], 16) != sum((2**31 - 1) * (i + 1) for i in range(2**17))
    shifted = as_tensor(b"x" + data[:4001])[1:]  # a view starting at an odd offset
    assert device_digest(shifted) == reference_digest(data[:4001])


def test_the_digest_catches_flipped_bits_swapped_words_truncation_and_other_contents() -> None:
    data = bytes(range(256)) * 4
    digest = device_digest(as_tensor(data))
    for position in (0, 1, 511, 1023):
        for bit in (0, 7):
            flipped = bytearray(data)
            flipped[position] ^= 1 << bit
            assert device_digest(as_tensor(bytes(flipped))) != digest, (position, bit)
    swapped = data[4:8] + data[0:4] + data[8:]
    assert device_digest(as_tensor(swapped)) != digest
    assert device_digest(as_tensor(data[:-1])) != digest
    assert device_digest(as_tensor(data[:-4])) != digest
    assert device_digest(as_tensor(data + b"\0")) != digest  # zero padding is not the same length
    assert device_digest(as_tensor(bytes(reversed(data)))) != digest


@given(st.lists(st.integers(0, 5000), max_size=20))
def test_the_layout_aligns_every_tensor_back_to_back(sizes: list[int]) -> None:
    offsets, used = slot_layout(sizes)
    assert all(offset % ALIGN == 0 for offset in offsets)
    ends = [offset + size for offset, size in zip(offsets, sizes, strict=True)]
    for before, offset in zip([0, *ends], offsets, strict=False):
        assert before <= offset < before + ALIGN  # no overlap, no more padding than alignment needs
    assert used == (ends[-1] if sizes else 0)


def test_a_state_dict_round_trips_in_one_process_into_a_private_copy() -> None:
    writer, reader = SlotWriter(), SlotReader()
    descriptor = writer.write(1, state())
    assert descriptor.kind == "cpu"
    assert (descriptor.version, descriptor.device, descriptor.uuid) == (1, -1, "")
    assert pickle.loads(pickle.dumps(descriptor)) == descriptor
    got = reader.read(descriptor)
    assert_same(got, state())
    writer.write(2, state(2.0))
    writer.write(3, state(3.0))  # overwrites the slot version 1 was read from
    assert_same(got, state())  # the tensors read are a copy of their own


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The handles readers open, in order."""
    handles: list[Any] = []

    def counting_open(handle: Any, index: int) -> Any:
        handles.append(handle)
        return CPU.open(handle, index)

    monkeypatch.setitem(device_share.KINDS, "cpu", ShareKind("cpu", CPU.share, counting_open))
    return handles


def test_two_slots_alternate_and_keep_their_handle_until_a_state_dict_outgrows_one(opened: list[Any]) -> None:
    writer, reader = SlotWriter(), SlotReader()
    small, large = {"a": torch.ones(100)}, {"a": torch.ones(100), "b": torch.arange(500.0)}
    d1, d2, d3 = (writer.write(v, {"a": torch.full((100,), float(v))}) for v in (1, 2, 3))
    assert [d.slot for d in (d1, d2, d3)] == [0, 1, 0]
    assert (d3.generation, d3.handle) == (d1.generation, d1.handle) != (d2.generation, d2.handle)
    for d in (d2, d3):
        assert torch.equal(reader.read(d)["a"], torch.full((100,), float(d.version)))
    assert opened == [d2.handle, d1.handle]
    d4 = writer.write(4, large)  # slot 1 is too small now: a new allocation, a new handle
    assert d4.slot == 1
    assert d4.generation not in (d1.generation, d2.generation)
    assert d4.handle != d2.handle
    d5 = writer.write(5, small)  # slot 0 still fits
    assert (d5.slot, d5.generation, d5.handle) == (0, d1.generation, d1.handle)
    assert_same(reader.read(d4), large)
    assert_same(reader.read(d5), small)
    assert_same(reader.read(d4), large)
    assert opened == [d2.handle, d1.handle, d4.handle]  # once per allocation


def test_a_freed_slot_leaves_no_shared_memory_once_its_reader_moved_on() -> None:
    writer, reader = SlotWriter(), SlotReader()
    writer.write(1, {"a": torch.ones(10)})
    d2 = writer.write(2, {"a": torch.ones(10)})
    reader.read(d2)
    path = "/dev/shm" + d2.handle[1].decode()
    assert os.path.exists(path)
    writer.write(3, {"a": torch.ones(10)})
    grown = writer.write(4, {"a": torch.ones(10), "b": torch.ones(1000)})
    assert (grown.slot, grown.generation) == (d2.slot, 3)
    assert os.path.exists(path)  # the writer let go of it, the reader still maps it
    reader.read(grown)
    assert not os.path.exists(path)


def test_a_reader_behind_two_versions_gets_a_torn_read() -> None:
    writer, reader = SlotWriter(), SlotReader()
    d1 = writer.write(1, {"a": torch.ones(64)})
    d2 = writer.write(2, {"a": torch.full((64,), 2.0)})
    d3 = writer.write(3, {"a": torch.full((64,), 3.0)})
    with pytest.raises(TornRead, match=r"version 1: slot 0 was overwritten \(it holds version 3 of generation 1 now\)"
                       ) as info:
        reader.read(d1)
    assert isinstance(info.value, hwplace.WeightSyncError)
    assert info.value.version == 1
    assert float(reader.read(d2)["a"][0]) == 2.0
    assert float(reader.read(d3)["a"][0]) == 3.0


def test_a_corrupted_byte_in_a_slot_is_a_weight_sync_error_not_a_torn_read() -> None:
    writer = SlotWriter()
    descriptor = writer.write(1, {"a": torch.arange(64.0)})
    mapped = torch.empty(0, dtype=torch.uint8).set_(CPU.open(descriptor.handle, -1))
    mapped[37] ^= 16
    with pytest.raises(hwplace.WeightSyncError, match="version 1: slot 0 does not match its digest") as info:
        SlotReader().read(descriptor)
    assert not isinstance(info.value, TornRead)  # not skipped as stale: reported
    mapped[37] ^= 16
    assert torch.equal(SlotReader().read(descriptor)["a"], torch.arange(64.0))


def test_a_torn_read_crosses_processes_with_its_fields() -> None:
    error = pickle.loads(pickle.dumps(TornRead(4, "slot 1 was overwritten")))
    assert isinstance(error, TornRead)
    assert (error.version, str(error)) == (4, "weight sync version 4: slot 1 was overwritten")


def test_a_slot_that_is_gone_is_a_torn_read() -> None:
    writer = SlotWriter()
    descriptor = writer.write(1, {"a": torch.ones(4)})
    del writer  # the slot's only holder
    with pytest.raises(TornRead, match=r"version 1: slot 0 generation 1 cannot be opened .*freed it or ended"):
        SlotReader().read(descriptor)


def test_device_indices_map_through_what_each_process_sees() -> None:
    assert physical_device(1, (4, 6)) == 6
    assert physical_device(3, None) == 3
    assert device_index(6, (4, 6)) == 1
    assert device_index(2, None) == 2
    assert device_index(physical_device(0, (5, 2)), (2, 5)) == 1  # the same GPU under two masks
    with pytest.raises(hwplace.WeightSyncError, match=r"GPU 3 of its node, which this process does not see "
                                                      r"\(its devices are GPUs \[0, 1\]\)"):
        device_index(3, (0, 1))
    with pytest.raises(hwplace.WeightSyncError, match=r"device index 2 is not among this process's devices"):
        physical_device(2, (0, 1))


@pytest.mark.parametrize(("tensors", "message"), [
    ({"x": "text"}, "entry 'x' is 'text'; a slot holds torch tensors"),
    ({"a": torch.ones(1), "b": torch.ones(1, device="meta")}, "entry 'b' is on meta, the entries before it on cpu"),
    ({"m": torch.ones(1, device="meta")}, "entry 'm' is on meta; .* one of cuda, cpu"),
    ({"s": torch.ones(2).to_sparse()},
     r"entry 's' is a torch.sparse_coo tensor of torch.float32; a slot holds torch tensors \(dense, strided\)"),
    ({}, "a non-empty mapping of names to torch tensors"),
])
def test_what_a_slot_cannot_hold_is_named(tensors: dict[str, Any], message: str) -> None:
    with pytest.raises(hwplace.WeightSyncError, match=message):
        SlotWriter().write(1, tensors)


def expected(tensors: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v.dtype), tuple(v.shape), v.device.type, raw(v.cpu())) for k, v in tensors.items()}


@pytest.fixture
def other_process() -> Iterator[Connection]:
    with reading_process() as connection:
        yield connection


@pytest.mark.time_limit(120)
def test_slots_are_read_in_another_process_torn_reads_included(other_process: Connection) -> None:
    writer = SlotWriter()
    d1 = writer.write(1, state())
    assert ask(other_process, d1) == expected(state())
    d2 = writer.write(2, state(2.0))
    writer.write(3, state(3.0))
    error = ask(other_process, d1)
    assert isinstance(error, TornRead)
    assert "version 1: slot 0 was overwritten" in str(error)
    assert ask(other_process, d2) == expected(state(2.0))
    path = "/dev/shm" + d2.handle[1].decode()
    grown = writer.write(4, {**state(4.0), "more": torch.ones(4096)})
    assert grown.slot == d2.slot
    assert os.path.exists(path)  # the other process still maps the slot's first allocation
    assert ask(other_process, grown) == expected({**state(4.0), "more": torch.ones(4096)})
    assert not os.path.exists(path)  # it moved on, and nobody holds the first allocation any more


@pytest.mark.parametrize("offset", range(8))
def test_the_digest_reads_a_view_at_any_offset(offset: int) -> None:
    data = bytes(range(7, 250))
    view = as_tensor(b"\1" * offset + data)[offset:]
    assert view.storage_offset() == offset
    assert device_digest(view) == reference_digest(data)


def test_empty_tensors_keep_their_dtype_and_shape() -> None:
    tensors = {"a": torch.ones(3), "e16": torch.zeros(0, 3, dtype=torch.int16),
               "eb": torch.zeros(0, dtype=torch.bool), "ez": torch.zeros(2, 0, dtype=torch.complex64)}
    writer = SlotWriter()
    assert_same(SlotReader().read(writer.write(1, tensors)), tensors)


def test_each_process_keeps_the_devices_it_sees_and_cpu_slots_need_none_of_them() -> None:
    writer, reader = SlotWriter(visible=[3, 1]), SlotReader(visible=[2, 5])
    assert (writer.visible, reader.visible) == ((3, 1), (2, 5))
    assert (SlotWriter().visible, SlotReader().visible) == (None, None)
    tensors = {"a": torch.arange(5.0)}
    assert_same(reader.read(writer.write(1, tensors)), tensors)  # a CPU slot is no GPU's: no device to map


def test_one_reader_tells_two_writers_slots_apart() -> None:
    first, second, reader = SlotWriter(), SlotWriter(), SlotReader()
    assert first.writer != second.writer
    a = first.write(1, {"a": torch.full((8,), 1.0)})
    b = second.write(1, {"a": torch.full((8,), 2.0)})  # slot 0, generation 1 too, of another writer
    assert (a.writer, b.writer) == (first.writer, second.writer)
    assert (a.slot, a.generation) == (b.slot, b.generation)
    assert torch.equal(reader.read(a)["a"], torch.full((8,), 1.0))
    assert torch.equal(reader.read(b)["a"], torch.full((8,), 2.0))


def test_a_descriptor_naming_more_bytes_than_its_slot_is_a_torn_read() -> None:
    writer = SlotWriter()
    descriptor = writer.write(1, {"a": torch.ones(4)})  # 16 bytes in a slot of ALIGN bytes
    with pytest.raises(TornRead, match=re.escape(
            f"weight sync version 1: slot 0 holds {ALIGN} bytes, fewer than the 5000 its descriptor names "
            "(corrupted)")) as info:
        SlotReader().read(replace(descriptor, nbytes=5000))
    assert (info.value.version, info.value.reason) == (1, f"slot 0 holds {ALIGN} bytes, fewer than the 5000 its "
                                                          "descriptor names (corrupted)")


def test_a_torn_read_names_what_the_slot_holds_and_what_to_do_and_corruption_both_digests() -> None:
    writer = SlotWriter()
    d1 = writer.write(1, {"a": torch.ones(64)})
    writer.write(2, {"a": torch.ones(64)})
    writer.write(3, {"a": torch.full((64,), 3.0)})
    with pytest.raises(TornRead, match=(r"^weight sync version 1: slot 0 was overwritten \(it holds version 3 of "
                                        r"generation 1 now\); read a newer version$")):
        SlotReader().read(d1)
    with pytest.raises(hwplace.WeightSyncError, match=(
            rf"^weight sync version 3: slot 0 does not match its digest \(digest wsum:[0-9a-f]{{16}}:[0-9a-f]{{16}}:"
            rf"256, expected {re.escape(d1.digest)}\): corrupted; the previous version stays the latest$")):
        SlotReader().read(replace(d1, version=3, digest=d1.digest))


def test_a_slot_of_an_unknown_kind_is_named() -> None:
    writer = SlotWriter()
    descriptor = writer.write(7, {"a": torch.ones(4)})
    with pytest.raises(hwplace.WeightSyncError,
                       match=r"^weight sync version 7: slot kind 'tpu' is unknown here \(cuda, cpu\)$"):
        SlotReader().read(replace(descriptor, kind="tpu"))


def test_a_slot_whose_allocation_failed_is_allocated_again(monkeypatch: pytest.MonkeyPatch) -> None:
    failures = [RuntimeError("no room in /dev/shm")]

    def flaky_share(storage: Any) -> Any:
        if failures:
            raise failures.pop()
        return CPU.share(storage)

    monkeypatch.setitem(device_share.KINDS, "cpu", ShareKind("cpu", flaky_share, CPU.open))
    writer = SlotWriter()
    with pytest.raises(RuntimeError, match="no room in /dev/shm"):
        writer.write(1, {"a": torch.ones(4)})
    descriptor = writer.write(2, {"a": torch.full((4,), 2.0)})
    assert (descriptor.slot, descriptor.generation) == (0, 1)
    assert torch.equal(SlotReader().read(descriptor)["a"], torch.full((4,), 2.0))


def test_a_reader_lets_go_of_a_slots_old_allocation_even_when_the_new_one_is_gone() -> None:
    writer, reader = SlotWriter(), SlotReader()
    writer.write(1, {"a": torch.ones(10)})
    d2 = writer.write(2, {"a": torch.ones(10)})
    reader.read(d2)
    path = "/dev/shm" + d2.handle[1].decode()
    writer.write(3, {"a": torch.ones(10)})
    grown = writer.write(4, {"a": torch.ones(10), "b": torch.ones(1000)})  # slot 1's second allocation
    assert os.path.exists(path)  # the reader still maps the first
    del writer  # and the second is gone before the reader gets to it
    with pytest.raises(TornRead, match="version 4: slot 1 generation 3 cannot be opened"):
        reader.read(grown)
    assert not os.path.exists(path)


def test_a_slot_that_is_no_mapping_is_named_in_full() -> None:
    with pytest.raises(hwplace.WeightSyncError,
                       match=r"^a slot holds a non-empty mapping of names to torch tensors, got \[1, 2\]$"):
        SlotWriter().write(1, [1, 2])  # type: ignore[arg-type]


def test_a_slot_being_written_is_skipped_and_the_writer_waits_for_a_reader_copying_it() -> None:
    writer, reader = SlotWriter(), SlotReader()
    d1 = writer.write(1, {"a": torch.full((64,), 1.0)})
    with writer._locks[0].exclusive():  # as while the writer rewrites slot 0
        with pytest.raises(TornRead, match="version 1: slot 0 is being written") as info:
            reader.read(d1)
        writer._locks[0].stamp(d1.generation, 1)  # it wrote version 1 again
    assert info.value.version == 1
    writer.write(2, {"a": torch.full((64,), 2.0)})
    written = threading.Event()
    with reader.held(d1) as data:  # a reader copying version 1: its slot is the next one written
        def write() -> None:
            writer.write(3, {"a": torch.full((64,), 3.0)})
            written.set()

        thread = threading.Thread(target=write)
        thread.start()
        assert not written.wait(0.3)  # the writer waits for the reader, however long it takes
        assert torch.equal(data.view(torch.float32), torch.full((64,), 1.0))  # never torn
    thread.join(60)
    assert written.is_set()


def test_a_slot_that_cannot_be_mapped_is_an_error_naming_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(handle: Any, index: int) -> Any:
        raise RuntimeError("pidfd_getfd: Operation not permitted")

    writer = SlotWriter()
    descriptor = writer.write(1, {"a": torch.ones(4)})
    monkeypatch.setitem(device_share.KINDS, "cpu", ShareKind("cpu", CPU.share, refused))
    with pytest.raises(SlotOpenError, match=r"^weight sync version 1: cannot map slot 0 of the source \(process "
                                            rf"{os.getpid()}, cpu device -1\) in this process: pidfd_getfd: "
                                            r"Operation not permitted\. .*expandable_segments") as info:
        SlotReader().read(descriptor)
    assert not isinstance(info.value, TornRead)  # no race to skip: every version fails so


def test_closing_frees_the_slots_and_their_locks_and_a_reader_lets_go_of_its_mappings() -> None:
    writer, reader = SlotWriter(), SlotReader()
    d1 = writer.write(1, {"a": torch.ones(100)})
    d2 = writer.write(2, {"a": torch.ones(100)})
    reader.read(d1), reader.read(d2)
    paths = ["/dev/shm" + d.handle[1].decode() for d in (d1, d2)]
    assert writer.device_bytes == 2 * 400
    assert all(os.path.exists(p) for p in paths)
    writer.close()
    writer.close()  # idempotent
    assert writer.device_bytes == 0
    with pytest.raises(TornRead, match="cannot be opened"):
        reader.read(d2)
    reader.close()
    assert not any(os.path.exists(p) for p in paths)
    with pytest.raises(hwplace.WeightSyncError, match="version 3: the device slots are closed"):
        writer.write(3, {"a": torch.ones(100)})


def test_a_reader_copies_into_a_buffer_it_hands_in_when_it_fits() -> None:
    writer, reader = SlotWriter(), SlotReader()
    buffer = torch.zeros(4096, dtype=torch.uint8)
    got = reader.read(writer.write(1, {"a": torch.full((8,), 1.0)}), into=buffer)
    assert got["a"].untyped_storage().data_ptr() == buffer.data_ptr()
    assert torch.equal(buffer[:32].view(torch.float32), torch.full((8,), 1.0))
    small = torch.zeros(4, dtype=torch.uint8)
    got = reader.read(writer.write(2, {"a": torch.full((8,), 2.0)}), into=small)
    assert got["a"].untyped_storage().data_ptr() != small.data_ptr()
    assert torch.equal(got["a"], torch.full((8,), 2.0))


def test_the_digest_of_any_length_copies_at_most_one_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

        def zeros(self, *shape: Any, **kwargs: Any) -> Any:
            made.append(int(torch.Size(shape[0] if shape and isinstance(shape[0], tuple) else shape).numel()))
            return torch.zeros(*shape, **kwargs)

    monkeypatch.setattr(device_share, "torch_module", Counting)
    data = bytes(range(256)) * 40 + b"xyz"  # not a multiple of 4
    assert device_digest(as_tensor(b"?" + data)[1:], chunk_words=16) == reference_digest(data)  # misaligned too
    assert max(made) <= 64
