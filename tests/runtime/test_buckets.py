"""Buckets and digests of a weight sync (no Ray): layout, a round trip, a flipped byte caught."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hwplace
from hwplace.runtime.messaging.communicator import byte_view
from hwplace.runtime.weight_sync import buckets as buckets_module
from hwplace.runtime.weight_sync.buckets import Entry, Hasher, check, digest, layout, pack, pack_raw, unpack
from hwplace.runtime.weight_sync.buckets import sizes as bucket_sizes

torch = pytest.importorskip("torch")


@given(st.lists(st.integers(0, 100), max_size=30), st.integers(1, 120))
def test_layout_fills_buckets_in_order_without_overflow(sizes: list[int], bucket_bytes: int) -> None:
    places, buckets = layout(sizes, bucket_bytes)
    assert len(places) == len(sizes)
    assert sum(buckets) == sum(sizes)
    assert [b for b, _ in places] == sorted(b for b, _ in places)  # in order
    for bucket, total in enumerate(buckets):
        members = [s for s, (b, _) in zip(sizes, places, strict=True) if b == bucket]
        assert total <= bucket_bytes or len([m for m in members if m]) == 1  # only a big tensor overflows, alone
    for size, (bucket, offset) in zip(sizes, places, strict=True):
        assert offset + size <= buckets[bucket]


def test_a_state_dict_round_trips_with_dtypes_and_shapes() -> None:
    state = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(5, dtype=torch.bfloat16),
             "c": np.arange(7, dtype=np.int16), "d": torch.tensor(3), "e": torch.zeros(0, 2)}
    entries, buckets = pack(state, bucket_bytes=32)
    pairs = list(buckets)
    assert len(pairs) == 2  # a: 48 bytes alone; b, c, d: 10 + 14 + 8
    check([b for b, _ in pairs], [d for _, d in pairs], "test")
    out = unpack(entries, [b for b, _ in pairs])
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            assert out[name].dtype == value.dtype
            assert (out[name] == value).all()
        else:
            assert (out[name].dtype, out[name].shape) == (value.dtype, value.shape)
            assert torch.equal(out[name], value)


def test_a_flipped_byte_or_a_missing_bucket_is_a_weight_sync_error() -> None:
    _, buckets = pack({str(i): torch.ones(16) for i in range(4)}, bucket_bytes=64)
    pairs = list(buckets)
    corrupted = pairs[1][0].copy()
    corrupted[0] ^= 1
    with pytest.raises(hwplace.WeightSyncError, match="bucket 1 of 4 does not match its digest"):
        check([pairs[0][0], corrupted, pairs[2][0], pairs[3][0]], [d for _, d in pairs], "v")
    with pytest.raises(hwplace.WeightSyncError, match="3 of 4 buckets arrived"):
        check([b for b, _ in pairs[:3]], [d for _, d in pairs], "v")


def test_what_a_sync_cannot_carry_is_named() -> None:
    with pytest.raises(hwplace.WeightSyncError, match="entry 'x' is 'text'"):
        pack({"x": "text"}, 64)


def test_a_large_tensor_is_a_bucket_of_its_own_without_a_copy() -> None:
    big = torch.arange(2**20, dtype=torch.float32)  # 4 MiB: at least ALONE_BYTES
    state = {"small": torch.ones(3), "big": big, "empty": torch.zeros(0), "after": torch.full((2,), 7.0)}
    entries, buckets = pack(state, bucket_bytes=64 * 2**20)
    pairs = list(buckets)
    assert [e.bucket for e in entries] == [0, 1, 2, 2]  # big alone, then a new bucket
    assert np.shares_memory(pairs[1][0], big.numpy())  # the tensor's own memory, not a packed copy
    check([b for b, _ in pairs], [d for _, d in pairs], "test")
    out = unpack(entries, [b for b, _ in pairs])
    assert torch.equal(out["big"], big)
    assert torch.equal(out["after"], state["after"])
    assert out["empty"].numel() == 0


def test_digests_are_xxh3t_by_default_and_xxh128_crc32_and_sha256_ones_are_still_checked() -> None:
    bucket = np.arange(100, dtype=np.uint8)
    assert digest(bucket).startswith("xxh3t:")
    assert len(digest(bucket)) == len("xxh3t:") + 32
    assert digest(bucket, "xxh128").startswith("xxh128:")
    check([bucket], [digest(bucket, "xxh128")], "v")
    assert digest(bucket, "crc32").startswith("crc32:")
    assert digest(bucket, "sha256").startswith("sha256:")
    check([bucket], [digest(bucket, "crc32")], "v")
    check([bucket], [digest(bucket, "sha256")], "v")
    check([bucket], [digest(bucket, "sha256").removeprefix("sha256:")], "v")  # a bare hex digest is SHA-256
    flipped = bucket.copy()
    flipped[50] ^= 4
    for algorithm in ("xxh3t", "xxh128", "crc32", "sha256"):
        with pytest.raises(hwplace.WeightSyncError, match="bucket 0 of 1 does not match its digest"):
            check([flipped], [digest(bucket, algorithm)], "v")
    with pytest.raises(hwplace.WeightSyncError, match="unknown digest algorithm 'md4'; xxh3t, xxh128, crc32, sha256"):
        digest(bucket, "md4")


def test_every_bucket_of_a_many_bucket_state_has_its_own_digest_in_order() -> None:
    state = {f"t{i}": torch.full((2**20 + i,), float(i)) for i in range(5)}  # 4 MiB each: five buckets
    entries, buckets = pack(state, bucket_bytes=64 * 2**20)
    pairs = list(buckets)
    assert len(pairs) == 5
    assert [d for _, d in pairs] == [digest(b) for b, _ in pairs]
    out = unpack(entries, [b for b, _ in pairs])
    assert all(torch.equal(out[name], value) for name, value in state.items())


@pytest.mark.parametrize(("sizes", "bucket_bytes", "alone_bytes", "places", "buckets"), [
    ([2, 0], 2, None, [(0, 0), (0, 2)], [2]),  # a size of exactly bucket_bytes is no bucket of its own
    ([0, 20, 3], 10, None, [(0, 0), (0, 0), (1, 0)], [20, 3]),  # an empty bucket takes a large size
    ([0, 0], 10, None, [(0, 0), (0, 0)], [0]),
    ([1, 10], 10, None, [(0, 0), (1, 0)], [1, 10]),  # one byte in a bucket is enough to open another
    ([3, 4, 3], 10, None, [(0, 0), (0, 3), (0, 7)], [10]),
    ([1, 1, 1], 10, 1, [(0, 0), (1, 0), (2, 0)], [1, 1, 1]),  # at least alone_bytes: each alone
    ([1, 2, 1], 10, 2, [(0, 0), (1, 0), (2, 0)], [1, 2, 1]),  # and what follows one starts a new bucket
    ([0, 1, 0, 1], 10, 0, [(0, 0), (0, 0), (1, 0), (1, 0)], [1, 1]),  # alone_bytes 0 counts as 1
])
def test_the_layout_is_exactly_in_order_and_alone_where_it_must(
        sizes: list[int], bucket_bytes: int, alone_bytes: int | None, places: list[tuple[int, int]],
        buckets: list[int]) -> None:
    assert layout(sizes, bucket_bytes, alone_bytes) == (places, buckets)


@pytest.mark.parametrize("bucket_bytes", [0, -1])
def test_buckets_of_no_bytes_are_refused(bucket_bytes: int) -> None:
    with pytest.raises(hwplace.WeightSyncError, match=rf"^bucket_bytes must be above 0, got {bucket_bytes}$"):
        layout([1], bucket_bytes)


def test_each_buckets_size_comes_back_from_its_entries() -> None:
    entries = [Entry("a", "torch", "float32", (2,), 0, 0, 8), Entry("b", "torch", "int8", (4,), 0, 8, 4),
               Entry("c", "numpy", "<i2", (0,), 0, 12, 0), Entry("d", "torch", "float32", (1,), 2, 0, 4),
               Entry("e", "torch", "uint8", (5,), 2, 4, 5)]
    assert bucket_sizes(entries) == [12, 0, 9]  # bucket 1 holds nothing
    assert bucket_sizes([]) == []
    state = {"x": torch.ones(3), "big": torch.ones(2**20), "y": np.ones(2, dtype=np.int8)}
    packed, buckets = pack(state, bucket_bytes=64 * 2**20)
    assert bucket_sizes(packed) == [b.nbytes for b, _ in buckets] == [12, 4 * 2**20, 2]


def test_entries_name_their_kind_and_numpy_arrays_of_any_shape_round_trip() -> None:
    state = {"t": torch.ones(2, 3), "grid": np.arange(12, dtype=np.int16).reshape(3, 4).T,
             "cube": np.arange(8, dtype=np.float32).reshape(2, 2, 2)}
    entries, buckets = pack(state, bucket_bytes=1024)
    assert [(e.kind, e.dtype, e.shape) for e in entries] == [
        ("torch", "float32", (2, 3)), ("numpy", "<i2", (4, 3)), ("numpy", "<f4", (2, 2, 2))]
    out = unpack(entries, [b for b, _ in buckets])
    for name in ("grid", "cube"):
        assert out[name].shape == state[name].shape
        assert (out[name] == state[name]).all()
    big = {"grid": np.arange(2**20, dtype=np.int32).reshape(2**10, 2**10)}  # 4 MiB: its own bucket, no packing
    entries, buckets = pack(big, bucket_bytes=64 * 2**20)
    out = unpack(entries, [b for b, _ in buckets])
    assert out["grid"].shape == (2**10, 2**10)
    assert (out["grid"] == big["grid"]).all()


def test_a_state_dict_of_empty_tensors_round_trips() -> None:
    state = {"e": torch.zeros(0), "f": torch.zeros(3, 0, dtype=torch.int16), "g": torch.zeros(0, dtype=torch.bool)}
    entries, buckets = pack(state, bucket_bytes=64)
    pairs = list(buckets)
    assert [b.nbytes for b, _ in pairs] == [0]
    check([b for b, _ in pairs], [d for _, d in pairs], "v")
    out = unpack(entries, [b for b, _ in pairs])
    for name, value in state.items():
        assert (out[name].dtype, out[name].shape) == (value.dtype, value.shape)


def test_tensors_are_rebuilt_from_read_only_buckets() -> None:  # as an object store hands them out
    state = {"a": torch.arange(6, dtype=torch.float32), "b": torch.ones(2, dtype=torch.int64)}
    entries, buckets = pack(state, bucket_bytes=64)
    frozen = []
    for bucket, _ in buckets:
        copy = bucket.copy()
        copy.flags.writeable = False
        frozen.append(copy)
    out = unpack(entries, frozen)
    assert torch.equal(out["a"], state["a"])
    assert torch.equal(out["b"], state["b"])


class Detachable:
    """Not a tensor, though it has a ``detach``."""

    def detach(self) -> Detachable:
        return self

    def __repr__(self) -> str:
        return "Detachable()"


@pytest.mark.parametrize(("state", "message"), [
    ({"x": Detachable()}, "state dict entry 'x' is Detachable(); a weight sync carries torch tensors and numpy "
                          "arrays"),
    ([1, 2], "publish takes a mapping of names to tensors, got [1, 2]"),
])
def test_what_a_sync_cannot_carry_is_named_in_full(state: object, message: str) -> None:
    with pytest.raises(hwplace.WeightSyncError, match=f"^{re.escape(message)}$"):
        pack(state, 64)  # type: ignore[arg-type]


def test_a_mismatch_is_named_in_full_and_a_malformed_digest_is_a_mismatch() -> None:
    bucket = np.arange(10, dtype=np.uint8)
    message = ("v3: bucket 0 of 1 does not match its digest (corrupted or partial); the previous version stays "
               "the latest")
    good = digest(bucket, "crc32")
    for wrong in (digest(bucket[:-1], "crc32"), good + ":00", "crc32:" + good):
        with pytest.raises(hwplace.WeightSyncError, match=f"^{re.escape(message)}$"):
            check([bucket], [wrong], "v3")


def test_without_xxhash_xxh3t_and_xxh128_digests_are_refused_and_the_others_still_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buckets_module, "HAVE_XXHASH", False)
    bucket = np.arange(10, dtype=np.uint8)
    for algorithm in ("xxh3t", "xxh128"):
        with pytest.raises(hwplace.WeightSyncError, match=re.escape(
                f"an {algorithm} digest needs the xxhash package: pip install xxhash (the ray and torch extras bring "
                "it)")):
            digest(bucket, algorithm)
        with pytest.raises(hwplace.WeightSyncError, match=f"an {algorithm} digest needs the xxhash package"):
            Hasher(algorithm)
    assert digest(bucket, "crc32").startswith("crc32:")


def round_trip(state: dict[Any, Any]) -> dict[Any, Any]:
    entries, packed = pack(state, bucket_bytes=64)
    return unpack(entries, [bucket.copy() for bucket, _ in packed])


def test_numpy_arrays_arrive_as_they_left_0_dim_and_structured_ones_included() -> None:
    record = np.dtype([("id", "<i4"), ("score", "<f8")])
    state = {"scalar": np.array(2.5), "records": np.array([(1, 0.5), (2, 1.5)], dtype=record),
             "big_endian": np.arange(3, dtype=">f4"), "strided": np.arange(12.0).reshape(3, 4)[:, ::2]}
    out = round_trip(state)
    for name, value in state.items():
        assert out[name].shape == value.shape, name
        assert out[name].dtype == value.dtype, name
        assert np.array_equal(out[name], value), name
    assert out["scalar"].ndim == 0
    assert out["records"]["score"].tolist() == [0.5, 1.5]


def test_parameters_ints_keys_and_conjugate_views_arrive_as_they_left() -> None:
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    state = {"w": torch.nn.Parameter(torch.arange(4.0)), "frozen": frozen, 1: torch.ones(1), "1": torch.zeros(1),
             "conj": torch.tensor([1 + 2j, 3 - 1j]).conj(), "neg": torch.tensor([1 + 2j]).conj().imag}
    out = round_trip(state)
    assert set(out) == {"w", "frozen", 1, "1", "conj", "neg"}  # 1 and "1" stay two keys
    assert isinstance(out["w"], torch.nn.Parameter)
    assert out["w"].requires_grad
    assert isinstance(out["frozen"], torch.nn.Parameter)
    assert not out["frozen"].requires_grad
    assert not isinstance(out[1], torch.nn.Parameter)
    assert (float(out[1]), float(out["1"])) == (1.0, 0.0)
    assert out["conj"].tolist() == [1 - 2j, 3 + 1j]
    assert out["neg"].tolist() == [-2.0]


@pytest.mark.parametrize(("value", "why"), [
    (lambda: torch.empty(3, device="meta"), "is a meta tensor, which holds no data"),
    (lambda: torch.eye(3).to_sparse(), "is a torch.sparse_coo tensor; a weight sync carries dense tensors"),
    (lambda: torch.eye(3).to_sparse_csr(), "is a torch.sparse_csr tensor"),
    (lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8),
     r"is a quantized tensor \(torch.qint8\), whose scale and zero point would be lost"),
    (lambda: np.array([object()], dtype=object), r"is a numpy array of Python objects \(object\)"),
    (lambda: np.array([(1, None)], dtype=[("a", "i4"), ("b", "O")]), "is a numpy array of Python objects"),
    (lambda: np.ma.masked_array([1.0, 2.0], mask=[False, True]), "is a masked numpy array, whose mask would be lost"),
    (lambda: [1.0], r"is \[1.0\]; a weight sync carries torch tensors and numpy arrays"),
], ids=["meta", "sparse", "csr", "quantized", "objects", "object-field", "masked", "list"])
def test_what_would_not_arrive_as_it_left_is_refused_by_key(value: Any, why: str) -> None:
    with pytest.raises(hwplace.WeightSyncError, match=f"^state dict entry 'layer.w' {why}"):
        buckets_module.check_state_dict({"ok": torch.ones(1), "layer.w": value()})
    with pytest.raises(hwplace.WeightSyncError, match=r"^state dict key \(1, 2\) is a tuple; a weight sync's keys"):
        buckets_module.check_state_dict({(1, 2): torch.ones(1)})


@pytest.mark.parametrize("algorithm", ["xxh3t", "xxh128", "crc32", "sha256"])
def test_a_digest_made_piece_by_piece_is_the_digest_of_the_whole(algorithm: str) -> None:
    data = np.random.default_rng(3).integers(0, 256, 5_000_003, dtype=np.uint8)
    hasher = Hasher(algorithm)
    for start in range(0, len(data), 1 << 20):
        hasher.update(data[start : start + (1 << 20)])
    assert hasher.hexdigest() == digest(data, algorithm)
    with pytest.raises(hwplace.WeightSyncError, match="unknown digest algorithm 'md5'"):
        Hasher("md5")


def test_raw_buckets_are_the_digested_ones_without_their_digests() -> None:
    state = {"a": np.arange(10, dtype=np.float32), "b": np.ones(2_000_000, dtype=np.float64)}
    entries, pairs = pack(state, 1 << 20)
    raw_entries, raw = pack_raw(state, 1 << 20)
    assert raw_entries == entries
    assert [(b.tobytes(), digest(b)) for b in raw] == [(b.tobytes(), d) for b, d in pairs]


def test_tensors_off_host_memory_are_brought_there_a_bucket_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state dict on an accelerator is copied to host memory only as each bucket is filled, never whole. Here
    every tensor is treated as off host memory (the copy to it is then a no-op), so the path runs on a CPU."""
    state = {"big": torch.arange(600_000, dtype=torch.float32),  # 2.4 MB: a bucket of its own
             "small": torch.arange(10, dtype=torch.int64), "t": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
             "arr": np.arange(5, dtype=np.int16), "param": torch.nn.Parameter(torch.ones(4)),
             "last": torch.full((400_000,), 7.0)}  # 1.6 MB: a bucket of its own
    host_entries, host_buckets = pack_raw(state, 1 << 20)
    expected = [bytes(b) for b in host_buckets]
    brought: list[int] = []
    def recorded(tensor: Any) -> Any:
        brought.append(tensor.numel())
        return byte_view(tensor)

    monkeypatch.setattr(buckets_module, "in_host_memory", lambda tensor: False)
    monkeypatch.setattr(buckets_module, "byte_view", recorded)
    entries, raw = pack_raw(state, 1 << 20)
    assert entries == host_entries
    assert brought == []  # nothing copied before the first bucket is asked for
    got = []
    for bucket in raw:
        got.append(bytes(bucket))
        assert isinstance(bucket, np.ndarray)
        if len(got) == 1:
            assert brought == [600_000]  # only the first bucket's tensor
    assert sorted(brought) == sorted([600_000, 10, 12, 4, 400_000])  # each tensor once; the numpy array is host's
    assert got == expected
    rebuilt = unpack(entries, [np.frombuffer(b, dtype=np.uint8) for b in got])
    assert torch.equal(rebuilt["t"], state["t"])
    assert isinstance(rebuilt["param"], torch.nn.Parameter)
