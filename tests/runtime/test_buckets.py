"""Buckets and digests of a weight sync (no Ray): layout, a round trip, a flipped byte caught."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hwplace
from hwplace.runtime.buckets import check, digest, layout, pack, unpack

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


def test_digests_are_xxh128_by_default_and_crc32_and_sha256_ones_are_still_checked() -> None:
    bucket = np.arange(100, dtype=np.uint8)
    assert digest(bucket).startswith("xxh128:")
    assert len(digest(bucket)) == len("xxh128:") + 32
    assert digest(bucket, "crc32").startswith("crc32:")
    assert digest(bucket, "sha256").startswith("sha256:")
    check([bucket], [digest(bucket, "crc32")], "v")
    check([bucket], [digest(bucket, "sha256")], "v")
    check([bucket], [digest(bucket, "sha256").removeprefix("sha256:")], "v")  # a bare hex digest is SHA-256
    flipped = bucket.copy()
    flipped[50] ^= 4
    for algorithm in ("xxh128", "crc32", "sha256"):
        with pytest.raises(hwplace.WeightSyncError, match="bucket 0 of 1 does not match its digest"):
            check([flipped], [digest(bucket, algorithm)], "v")
    with pytest.raises(hwplace.WeightSyncError, match="unknown digest algorithm 'md4'; xxh128, crc32, sha256"):
        digest(bucket, "md4")


def test_every_bucket_of_a_many_bucket_state_has_its_own_digest_in_order() -> None:
    state = {f"t{i}": torch.full((2**20 + i,), float(i)) for i in range(5)}  # 4 MiB each: five buckets
    entries, buckets = pack(state, bucket_bytes=64 * 2**20)
    pairs = list(buckets)
    assert len(pairs) == 5
    assert [d for _, d in pairs] == [digest(b) for b, _ in pairs]
    out = unpack(entries, [b for b, _ in pairs])
    assert all(torch.equal(out[name], value) for name, value in state.items())
