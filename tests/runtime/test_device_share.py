"""The device-share primitives of a weight sync (no Ray): the digest taken on the device (on CPU here), the layout
of a state dict's tensors and their views, a torn read crossing processes, and the mapping of device indices.
The ring built on them is tests/runtime/test_device_ring.py's."""

from __future__ import annotations

import pickle
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hwplace
from hwplace.runtime.weight_sync import device_share
from hwplace.runtime.weight_sync.device_share import (
    ALIGN,
    SlotEntry,
    TornRead,
    device_digest,
    device_index,
    entry_views,
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


def test_a_torn_read_crosses_processes_with_its_fields() -> None:
    error = pickle.loads(pickle.dumps(TornRead(4, "slot 1 was overwritten")))
    assert isinstance(error, TornRead)
    assert (error.version, str(error)) == (4, "weight sync version 4: slot 1 was overwritten")


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


@pytest.mark.parametrize("offset", range(8))
def test_the_digest_reads_a_view_at_any_offset(offset: int) -> None:
    data = bytes(range(7, 250))
    view = as_tensor(b"\1" * offset + data)[offset:]
    assert view.storage_offset() == offset
    assert device_digest(view) == reference_digest(data)


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


def test_entries_are_viewed_from_any_base_and_keep_what_they_were() -> None:
    tensors: dict[str | int, Any] = {"w": torch.nn.Parameter(torch.arange(6.0)), "e": torch.zeros(0, 2),
                                     3: torch.tensor([7], dtype=torch.int16)}
    offsets, used = slot_layout([t.numel() * t.element_size() for t in tensors.values()])
    data = torch.zeros(used, dtype=torch.uint8)
    entries = []
    for (name, value), offset in zip(tensors.items(), offsets, strict=True):
        size = value.numel() * value.element_size()
        data[offset : offset + size].view(value.dtype).copy_(value.detach().reshape(-1))
        kind = "parameter" if isinstance(value, torch.nn.Parameter) else "torch"
        entries.append(SlotEntry(name, str(value.dtype).removeprefix("torch."), tuple(value.shape), offset, size,
                                 kind, value.requires_grad))
    got = entry_views(entries, data)
    assert list(got) == ["w", "e", 3]
    assert isinstance(got["w"], torch.nn.Parameter)
    assert got["w"].requires_grad
    assert torch.equal(got[3], tensors[3])
    assert tuple(got["e"].shape) == (0, 2)
    shifted = entry_views(entries[2:], data[offsets[2]:], base=offsets[2])
    assert torch.equal(shifted[3], tensors[3])


class Storage:
    """A storage whose share fails as torch's does when its torch_shm_manager is slow to answer, ``misses`` times."""

    def __init__(self, misses: int, error: str = device_share.MANAGER_TIMEOUT) -> None:
        self.misses, self.error, self.calls = misses, error, 0

    def _share_filename_cpu_(self) -> tuple[str, str, int]:
        self.calls += 1
        if self.calls <= self.misses:
            raise RuntimeError(self.error)
        return "manager", "/torch_1", 1024


def test_a_slow_shared_memory_manager_is_asked_again_a_few_times_then_its_error_stands() -> None:
    slow = Storage(device_share.MANAGER_TRIES - 1)
    assert device_share.CPU.share(slow) == ("manager", "/torch_1", 1024)
    assert slow.calls == device_share.MANAGER_TRIES
    gone = Storage(device_share.MANAGER_TRIES)
    with pytest.raises(RuntimeError, match="timed out"):
        device_share.CPU.share(gone)
    assert gone.calls == device_share.MANAGER_TRIES
    other = Storage(1, "some other failure")
    with pytest.raises(RuntimeError, match="some other failure"):
        device_share.CPU.share(other)
    assert other.calls == 1


def test_a_slow_shared_memory_manager_is_asked_again_when_a_target_maps_a_bucket(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The target's side: mapping a shared bucket connects to the manager too (a SlotOpenError failed a weight
    sync on a loaded machine, where the source's share had been asked again)."""
    storage = torch.arange(256, dtype=torch.uint8).untyped_storage()
    handle = device_share.CPU.share(storage)
    real = torch.UntypedStorage._new_shared_filename_cpu
    calls = []

    def slow(misses: int, error: str = device_share.MANAGER_TIMEOUT) -> Any:
        def opening(*args: Any) -> Any:
            calls.append(args)
            if len(calls) <= misses:
                raise RuntimeError(error)
            return real(*args)
        return staticmethod(opening)

    monkeypatch.setattr(torch.UntypedStorage, "_new_shared_filename_cpu", slow(device_share.MANAGER_TRIES - 1))
    opened = device_share.CPU.open(handle, -1)
    assert bytes(opened) == bytes(range(256))
    assert len(calls) == device_share.MANAGER_TRIES
    assert all(args == handle for args in calls)
    for misses, error in ((device_share.MANAGER_TRIES, device_share.MANAGER_TIMEOUT), (1, "some other failure")):
        calls.clear()
        monkeypatch.setattr(torch.UntypedStorage, "_new_shared_filename_cpu", slow(misses, error))
        with pytest.raises(RuntimeError, match=error):
            device_share.CPU.open(handle, -1)
        assert len(calls) == min(misses, device_share.MANAGER_TRIES)
