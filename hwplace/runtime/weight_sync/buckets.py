"""Weights in buckets: the layout of a state dict's tensors in buckets of bounded size, and a digest per bucket.

A state dict travels as buckets (flat byte buffers of at most ``bucket_bytes``, or one tensor alone when it is
larger), so sending a large model never needs a second full copy of it in flight. A tensor of at least
``ALONE_BYTES`` gets a bucket of its own, which is the tensor's own memory: packing copies only small tensors.
A tensor on an accelerator is copied to host memory as its bucket is filled, so a state dict on a GPU is in host
memory a bucket at a time, never whole.
Each bucket carries a digest that the receiver checks before a version becomes visible: XXH3-128 (the
``xxhash`` package, which the ray and torch extras bring: 35 GB/s on this project's 2-core machine, against
zlib's CRC-32 at 6 GB/s and SHA-256's 1.2 to 1.8 GB/s, which made hashing most of a 100 MB sync's time) of the
XXH3-128 digests of the bucket's 1 MiB pieces (``xxh3t:``, :mod:`hwplace.runtime.weight_sync.pieces`: hashed on
several threads where the node has the cores), or CRC-32 where ``xxhash`` is not installed. Either catches
corrupted and partial transfers (all but one in 2**128, resp. 2**32, of random corruptions); neither is a
defence against tampering. A receiver checks whichever algorithm the digest names (``xxh3t:``, ``xxh128:``,
``crc32:``, ``sha256:``). :func:`layout` and :func:`digest` are pure; packing needs numpy (always there with
torch or Ray). Imports the foundation, the communicator's ``byte_view`` and the pieces module.
"""

from __future__ import annotations

import hashlib
import warnings
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.foundation.errors import WeightSyncError
from hwplace.foundation.wording import safe_repr
from hwplace.runtime.messaging.communicator import byte_view
from hwplace.runtime.weight_sync.pieces import ALGORITHM as TREE
from hwplace.runtime.weight_sync.pieces import TreeHasher, threads, tree_digest

try:  # optional: xxhash, which the ray and torch extras bring
    import xxhash

    HAVE_XXHASH = True
except ImportError:  # pragma: no cover - the suite installs the extras
    HAVE_XXHASH = False

DIGESTS = (TREE, "xxh128", "crc32", "sha256")
DEFAULT_DIGEST = TREE if HAVE_XXHASH else "crc32"

ALONE_BYTES = 4 * 2**20  # a tensor at least this large travels in a bucket of its own, without packing
INLINE_BYTES = 4 * 2**20  # a version up to this size is packed whole before it is sent: its digests go first


@dataclass(frozen=True)
class Entry:
    """Where one tensor of a state dict lies: its bucket, offset and size in bytes, and how to rebuild it."""

    name: str | int
    kind: str  # "torch", "parameter" (an nn.Parameter) or "numpy"
    dtype: Any  # torch: the dtype's name ("float32"); numpy: the dtype string, or the dtype itself when it has fields
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int
    requires_grad: bool = False


@dataclass(frozen=True)
class Weights:
    """One version of the source's weights, as a target got them: ``version`` and read-only ``tensors``."""

    version: int
    tensors: Mapping[str | int, Any]


def layout(sizes: Sequence[int], bucket_bytes: int,
           alone_bytes: int | None = None) -> tuple[list[tuple[int, int]], list[int]]:
    """Each size's ``(bucket, offset)`` and each bucket's size, filling buckets in order up to ``bucket_bytes``.

    A size above ``bucket_bytes`` (or at least ``alone_bytes``) gets a bucket of its own; no bucket is empty
    unless every size is 0.
    """
    if bucket_bytes <= 0:
        raise WeightSyncError(f"bucket_bytes must be above 0, got {bucket_bytes}")
    alone = bucket_bytes + 1 if alone_bytes is None else max(1, alone_bytes)
    places: list[tuple[int, int]] = []
    buckets: list[int] = []
    after_alone = False
    for size in sizes:
        if not buckets or (buckets[-1] > 0 and (buckets[-1] + size > bucket_bytes or size >= alone or after_alone)):
            buckets.append(0)
        after_alone = size >= alone
        places.append((len(buckets) - 1, buckets[-1]))
        buckets[-1] += size
    return places, buckets


def aligned(sizes: Sequence[int], align: int) -> tuple[list[int], int]:
    """Each size's offset when laid back to back, each starting at a multiple of ``align``, and the end of the
    last one (not rounded up)."""
    offsets, end = [], 0
    for size in sizes:
        start = -(-end // align) * align
        offsets.append(start)
        end = start + size
    return offsets, end


def state_bytes(state_dict: Mapping[Any, Any]) -> int:
    """The bytes of a state dict's tensors and arrays (what a publish span notes, for profiles)."""
    return sum(int(getattr(value, "nbytes", 0)) for value in state_dict.values())


def sizes(entries: Sequence[Entry]) -> list[int]:
    """Each bucket's size in bytes, from the entries that lie in it."""
    out: list[int] = []
    for entry in entries:
        out.extend([0] * (entry.bucket + 1 - len(out)))
        out[entry.bucket] = max(out[entry.bucket], entry.offset + entry.nbytes)
    return out


def digest(buffer: Any, algorithm: str = DEFAULT_DIGEST) -> str:
    """The digest of one bucket's bytes (anything with the buffer protocol), read in place: ``xxh3t:<hex>``
    (the default where ``xxhash`` is installed: its pieces hashed on :func:`~hwplace.runtime.weight_sync.pieces.threads`
    threads), ``xxh128:<hex>``, ``crc32:<hex>`` or ``sha256:<hex>``."""
    view = memoryview(buffer).cast("B")
    if algorithm in (TREE, "xxh128") and not HAVE_XXHASH:
        raise WeightSyncError(f"an {algorithm} digest needs the xxhash package: pip install xxhash (the ray and "
                              "torch extras bring it)")
    if algorithm == TREE:
        return tree_digest(view, threads())
    if algorithm == "xxh128":
        return f"xxh128:{xxhash.xxh3_128_hexdigest(view)}"
    if algorithm == "crc32":
        return f"crc32:{zlib.crc32(view):08x}"
    if algorithm == "sha256":
        return f"sha256:{hashlib.sha256(view).hexdigest()}"
    raise WeightSyncError(f"unknown digest algorithm {algorithm!r}; {', '.join(DIGESTS)}")


class Hasher:
    """A digest computed piece by piece (:meth:`update` each part in order): :meth:`hexdigest` is what :func:`digest`
    gives for the parts joined. A segment's writer hashes each chunk just after copying it, while it is in cache."""

    def __init__(self, algorithm: str = DEFAULT_DIGEST) -> None:
        digest(b"", algorithm)  # refuses an unknown or unavailable algorithm, as digest() does
        self.algorithm = algorithm
        self._state: Any = TreeHasher(threads()) if algorithm == TREE else xxhash.xxh3_128() \
            if algorithm == "xxh128" else hashlib.sha256() if algorithm == "sha256" else 0

    def update(self, buffer: Any) -> None:
        view = memoryview(buffer).cast("B")
        if self.algorithm == "crc32":
            self._state = zlib.crc32(view, self._state)
        else:
            self._state.update(view)

    def hexdigest(self) -> str:
        if self.algorithm == "crc32":
            return f"crc32:{self._state:08x}"
        if self.algorithm == TREE:
            return str(self._state.hexdigest())
        return f"{self.algorithm}:{self._state.hexdigest()}"


def check_state_dict(state_dict: Mapping[Any, Any]) -> None:
    """Refuse, by key, what a weight sync cannot carry exactly: a key that is neither a string nor an int, and a
    value :func:`carried` refuses. ``publish`` calls it before it lays anything down."""
    if not isinstance(state_dict, Mapping):
        raise WeightSyncError(f"publish takes a mapping of names to tensors, got {safe_repr(state_dict)}")
    for name, value in state_dict.items():
        if not isinstance(name, (str, int)):
            raise WeightSyncError(f"state dict key {safe_repr(name)} is a {type(name).__name__}; a weight sync's keys "
                                  "are strings (or ints), kept as they are")
        carried(name, value)


def carried(name: Any, value: Any) -> Any:
    """``value`` as it travels: a numpy array, or a dense torch tensor with its conjugate and negative bits
    resolved (the same values); ``WeightSyncError`` naming ``name`` for what would not arrive as it left."""
    import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

    what = f"state dict entry {name!r}"
    if isinstance(value, np.ndarray):
        if isinstance(value, np.ma.MaskedArray):
            raise WeightSyncError(f"{what} is a masked numpy array, whose mask would be lost; send value.filled() "
                                  "or its data and mask as two entries")
        if value.dtype.hasobject:
            raise WeightSyncError(f"{what} is a numpy array of Python objects ({value.dtype}); a weight sync carries "
                                  "numbers: send it with hwplace's send/recv, which pickle")
        return value
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        import torch  # noqa: PLC0415 (optional: torch)

        if not isinstance(value, torch.Tensor):
            raise WeightSyncError(f"{what} is {safe_repr(value)}; a weight sync carries torch tensors and numpy "
                                  "arrays")
        if value.is_meta:
            raise WeightSyncError(f"{what} is a meta tensor, which holds no data; publish materialized weights")
        if value.is_quantized:
            raise WeightSyncError(f"{what} is a quantized tensor ({value.dtype}), whose scale and zero point would "
                                  "be lost; send value.dequantize(), or value.int_repr() and its scale as entries")
        if value.layout != torch.strided or value.is_nested:
            raise WeightSyncError(f"{what} is a {'nested' if value.is_nested else value.layout} tensor; a weight "
                                  "sync carries dense tensors: send value.to_dense() (or its parts as entries)")
        return value.resolve_conj().resolve_neg() if value.is_conj() or value.is_neg() else value
    raise WeightSyncError(f"{what} is {safe_repr(value)}; a weight sync carries torch tensors and numpy arrays")


def flat_bytes(name: Any, value: Any) -> tuple[str, Any, tuple[int, ...], Any, bool]:
    """``(kind, dtype, shape, flat, requires_grad)`` of a tensor or a numpy array. ``flat``: its bytes as a uint8
    numpy array where they are in host memory (without a copy where they are contiguous), else the tensor as it is
    (on an accelerator), brought to host memory only when its bucket is filled (:func:`host_bytes`,
    :func:`copy_bytes`): a state dict on a GPU is in host memory a bucket at a time, not whole. ``kind`` is
    ``"numpy"`` (``dtype``: numpy's dtype string, or the dtype itself when it has fields), ``"torch"`` or
    ``"parameter"`` (an ``nn.Parameter``)."""
    import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

    value = carried(name, value)
    if isinstance(value, np.ndarray):
        array = value if value.flags.c_contiguous else np.ascontiguousarray(value)  # keeps a 0-dim array's shape
        dtype = array.dtype if array.dtype.fields else array.dtype.str
        return "numpy", dtype, tuple(value.shape), array.reshape(-1).view(np.uint8), False
    import torch  # noqa: PLC0415 (optional: torch)

    kind = "parameter" if isinstance(value, torch.nn.Parameter) else "torch"
    tensor = value.detach()
    flat = byte_view(tensor).numpy() if in_host_memory(tensor) else tensor
    return kind, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), flat, value.requires_grad


def in_host_memory(tensor: Any) -> bool:
    """Whether a tensor's bytes are read where they lie (host memory), or copied there when their bucket is
    filled."""
    return bool(tensor.device.type == "cpu")


def host_bytes(flat: Any) -> Any:
    """A :func:`flat_bytes` ``flat`` as a uint8 numpy array in host memory (a tensor on an accelerator copied
    there)."""
    import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

    return flat if isinstance(flat, np.ndarray) else byte_view(flat.cpu()).numpy()


def copy_bytes(into: Any, flat: Any) -> None:
    """Copy a :func:`flat_bytes` ``flat`` into ``into`` (a uint8 numpy array of its size): a tensor on an
    accelerator straight from there."""
    import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

    if isinstance(flat, np.ndarray):
        into[:] = flat
        return
    import torch  # noqa: PLC0415 (optional: torch; a flat that is a tensor came with it)

    torch.from_numpy(into).copy_(byte_view(flat))


def rebuilt(tensor: Any, kind: str, requires_grad: bool) -> Any:
    """A received torch tensor as it left: an ``nn.Parameter`` when ``kind`` says so, with its ``requires_grad``."""
    if kind == "parameter":
        import torch  # noqa: PLC0415 (optional: torch)

        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(True) if requires_grad else tensor


class Packed:
    """A state dict's buckets, filled one at a time: iterated, each with its digest; :attr:`raw`, without (for a
    writer that hashes each bucket as it copies it, in one pass over memory)."""

    def __init__(self, raw: Iterator[Any]) -> None:
        self.raw = raw

    def __iter__(self) -> Iterator[tuple[Any, str]]:
        return digested(self.raw)


def pack(state_dict: Mapping[str, Any], bucket_bytes: int) -> tuple[list[Entry], Packed]:
    """The entries of ``state_dict`` and its buckets with their digests (:class:`Packed`), filled one at a time."""
    entries, raw = pack_raw(state_dict, bucket_bytes)
    return entries, Packed(raw)


def digested(buckets: Iterator[Any]) -> Iterator[tuple[Any, str]]:
    """Each bucket with its digest."""
    yield from ((bucket, digest(bucket)) for bucket in buckets)


def pack_raw(state_dict: Mapping[str, Any], bucket_bytes: int) -> tuple[list[Entry], Iterator[Any]]:
    """As :func:`pack`, the buckets without their digests (for a writer that hashes them as it copies them)."""
    import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

    check_state_dict(state_dict)
    flats = [(name, *flat_bytes(name, value)) for name, value in state_dict.items()]
    places, sizes = layout([f[4].nbytes for f in flats], bucket_bytes, min(ALONE_BYTES, bucket_bytes))
    entries = [Entry(name, kind, dtype, shape, b, off, flat.nbytes, grad)
               for (name, kind, dtype, shape, flat, grad), (b, off) in zip(flats, places, strict=True)]

    def filled() -> Iterator[Any]:
        start = 0
        for index, size in enumerate(sizes):
            end = start
            while end < len(entries) and entries[end].bucket == index:
                end += 1
            holding = [i for i in range(start, end) if entries[i].nbytes]
            if len(holding) == 1:  # one tensor holds every byte: the bucket is its own memory, no copy
                yield host_bytes(flats[holding[0]][4])
            else:
                bucket = np.empty(size, dtype=np.uint8)
                for i in holding:
                    copy_bytes(bucket[entries[i].offset : entries[i].offset + entries[i].nbytes], flats[i][4])
                yield bucket
            start = end

    return entries, filled()


def check(buckets: Sequence[Any], digests: Sequence[str], what: str) -> None:
    """Raise :class:`WeightSyncError` unless every bucket has its digest and its announced size."""
    if len(buckets) != len(digests):
        raise WeightSyncError(f"{what}: {len(buckets)} of {len(digests)} buckets arrived")
    for index, (bucket, expected) in enumerate(zip(buckets, digests, strict=True)):
        algorithm = expected.partition(":")[0] if ":" in expected else "sha256"
        if digest(bucket, algorithm).removeprefix("sha256:" if ":" not in expected else "") != expected:
            raise WeightSyncError(f"{what}: bucket {index} of {len(digests)} does not match its digest (corrupted "
                                  "or partial); the previous version stays the latest")


def unpack(entries: Sequence[Entry], buckets: Sequence[Any]) -> dict[str | int, Any]:
    """The state dict back from checked buckets: views into them (no copy), torch tensors or numpy arrays."""
    import numpy as np  # noqa: PLC0415 (optional: numpy, which the ray and torch extras bring)

    out: dict[str | int, Any] = {}
    torch: Any = None
    for entry in entries:
        raw = np.asarray(buckets[entry.bucket])[entry.offset : entry.offset + entry.nbytes]
        if entry.kind == "numpy":
            out[entry.name] = raw.view(np.dtype(entry.dtype)).reshape(entry.shape)
            continue
        if torch is None:
            import torch as torch_module  # noqa: PLC0415 (optional: torch)

            torch = torch_module
        with warnings.catch_warnings():  # object-store buffers are read-only; the tensors are only read
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(raw) if raw.size else torch.empty(0, dtype=torch.uint8)
        out[entry.name] = rebuilt(flat.view(getattr(torch, entry.dtype)).reshape(entry.shape), entry.kind,
                                  entry.requires_grad)
    return out
