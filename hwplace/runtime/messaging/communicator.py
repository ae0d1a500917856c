"""Communicators between a few workers, built from hwplace's own group entries, and the frames messages travel in.

A communicator is a torch.distributed process group of just its members, made without
``init_process_group``: the first member hosts a ``TCPStore`` (on a free port of its node) and publishes its
address through the executor's key-value store; the others connect and all build a ``ProcessGroupGloo`` on a
``PrefixStore`` over it. A communicator that moves tensors device to device also gets one ``nccl`` process
group per sending member (:func:`hwplace.runtime.messaging.devices.nccl_groups`).

A frame is a fixed header (an int64 tensor: kind, byte count, dtype, shape) followed by the payload: a tensor's
own bytes, or a pickle as a uint8 tensor. Imports the layers below and
:mod:`hwplace.runtime.messaging.devices`; torch is imported on first use.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hwplace.contracts.capabilities import Rendezvous
from hwplace.contracts.executor import Executor, GroupEntry
from hwplace.foundation.errors import ConfigError
from hwplace.runtime.messaging.devices import nccl_groups

CONNECT_TIMEOUT = 300.0  # seconds the members of a new communicator have to meet (a weight sync's: per round)
NOTICE = 5.0  # seconds an executor may take to report a peer's death before messaging takes it as none
POLL = 0.05  # seconds between looks at a group entry while waiting for it to say a death
HEADER = 16  # int64 slots of a frame's header: kind, byte count, dtype code, ndim, up to 12 dims
MAX_DIMS = HEADER - 4
PICKLED, TENSOR, DEVICE_TENSOR, HOSTED = 0, 1, 2, 3  # HOSTED: a device tensor that travels through host memory
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool",
          "complex64", "complex128", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
          "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")  # by code: append only

Member = tuple[str, int]  # (group, rank)


def torch_module() -> Any:
    try:
        import torch  # noqa: PLC0415 (optional: torch)
    except ImportError as exc:
        raise ConfigError("torch", f"messaging and weight sync need torch ({exc})",
                          allowed="pip install 'hwplace[torch]'") from None
    return torch


def find_entry(executor: Executor, group: str) -> GroupEntry:
    """The running group ``group``; ``ConfigError`` when there is none."""
    entry = executor.find_group(group)
    if entry is None:
        raise ConfigError("group", f"there is no running worker group named {group!r}",
                          allowed="the name a group of this cluster was launched under")
    return entry


def check_member(entry: GroupEntry, rank: object, what: str) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(entry.placements):
        raise ConfigError(what, f"group {entry.name!r} has ranks 0-{len(entry.placements) - 1}", value=rank)
    return rank


@dataclass
class Communicator:
    """A process group of ``members`` (in their order); ``index`` is this process's place among them."""

    members: tuple[Member, ...]
    index: int
    gloo: Any
    devices: tuple[Any, ...] = ()  # nccl process groups by sending member, when tensors go device to device
    keep: list[Any] = field(default_factory=list)  # the stores: alive as long as the groups


def connect(rendezvous: Rendezvous, key: str, members: Sequence[Member], index: int, address: str,
            device_backend: str | None, timeout: float | None = None,
            waiting: Callable[[], bool] | None = None, rounds: float | None = None) -> Communicator:
    """Build the communicator ``key`` of ``members`` (blocks until every member has joined, up to ``timeout``,
    default :data:`CONNECT_TIMEOUT`). With ``waiting``, members wait for each other without bound, in rounds of
    ``timeout``, for as long as ``waiting()`` says (then ``TimeoutError``): a weight sync's target may ask for
    weights long before its source publishes, and the other way round. ``rounds``: seconds of a round of waiting
    for the first member's address in the rendezvous (default ``timeout``; the store's waits keep ``timeout``:
    c10d logs a warning at the end of each)."""
    torch = torch_module()
    dist = torch.distributed
    timeout = CONNECT_TIMEOUT if timeout is None else timeout
    delta = datetime.timedelta(seconds=timeout)
    step = timeout if rounds is None else rounds
    if index == 0:
        store = dist.TCPStore(address, 0, None, True, timeout=delta, wait_for_workers=False)
        rendezvous.kv_put(key, f"{address}:{store.port}".encode())
    else:
        found = _rounds(lambda: rendezvous.kv_wait(key, step), TimeoutError, waiting)
        host, _, port = found.decode().rpartition(":")
        store = dist.TCPStore(host, int(port), None, False, timeout=delta)
    if waiting is not None:  # every member is here before the groups are built (which wait up to ``timeout``)
        store.set(f"here/{index}", b"1")
        others = [f"here/{i}" for i in range(len(members)) if i != index]
        _rounds(lambda: store.wait(others, delta), dist.DistStoreError, waiting)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    # no deadline on a message: a dead peer fails the pending receives at once (the one being read into is
    # left waiting for this timeout: hwplace.runtime.messaging.pair watches the connection for it)
    options._timeout = datetime.timedelta(days=1)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore(f"{key}/gloo/", store), index, len(members), options)
    comm = Communicator(tuple(members), index, gloo, (), [store])
    if device_backend == "nccl":
        add_devices(comm, key)
    return comm


def _rounds(step: Callable[[], Any], timed_out: type[BaseException], waiting: Callable[[], bool] | None) -> Any:
    """``step()``, again after each ``timed_out`` for as long as ``waiting()`` (once without ``waiting``)."""
    while True:
        try:
            return step()
        except timed_out:
            if waiting is None or not waiting():
                raise


def add_devices(comm: Communicator, key: str) -> None:
    """Give ``comm`` its nccl process groups, one per sending member (every member calls this)."""
    comm.devices = nccl_groups(torch_module().distributed, comm.keep[0], key, comm.index, len(comm.members),
                               CONNECT_TIMEOUT)


def exchange(comm: Communicator, text: str) -> list[str]:
    """Every member's ``text`` (up to 256 bytes of UTF-8), in member order; every member calls this."""
    torch = torch_module()
    mine = torch.zeros(256, dtype=torch.uint8)
    data = text.encode()[:256]
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else mine[:0]
    found = [torch.zeros(256, dtype=torch.uint8) for _ in comm.members]
    comm.gloo.allgather([found], [mine]).wait()
    return [bytes(t.numpy()).rstrip(b"\0").decode(errors="replace") for t in found]


def encode(obj: Any, device_ok: bool, hosted: bool = False) -> tuple[Any, Any]:
    """The header and payload of ``obj``: a dense tensor's bytes (on its device where ``device_ok``; else copied
    to host memory, and marked to go back to the receiver's device where ``hosted``), or a pickle (anything
    else: sparse, nested, meta and quantized tensors too, which arrive as they left)."""
    torch = torch_module()
    dtype = str(obj.dtype).removeprefix("torch.") if isinstance(obj, torch.Tensor) else ""
    if dtype and (obj.is_conj() or obj.is_neg()):  # a lazy view: its values, which its bytes are not
        obj = obj.resolve_conj().resolve_neg()
    if dtype in DTYPES and obj.dim() <= MAX_DIMS and obj.layout == torch.strided and not (obj.is_meta or obj.is_nested):
        on_device = obj.device.type != "cpu"
        tensor = obj.detach() if (on_device and device_ok) else obj.detach().cpu()
        payload = byte_view(tensor)
        kind = (DEVICE_TENSOR if device_ok else HOSTED if hosted and obj.device.type == "cuda" else TENSOR) \
            if on_device else TENSOR
        fields = [kind, payload.numel(), DTYPES.index(dtype), obj.dim(), *obj.shape]
    else:
        data = pickle.dumps(obj, protocol=5)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
        fields = [PICKLED, payload.numel()]
    header = torch.tensor(fields + [0] * (HEADER - len(fields)), dtype=torch.int64)  # one op, not one per field
    return header, payload


def byte_view(tensor: Any) -> Any:
    """A tensor's bytes as a flat uint8 tensor (a contiguous copy when it is not contiguous)."""
    torch = torch_module()
    flat = tensor.contiguous().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # one element at an odd stride (``.imag``): torch calls it contiguous
        flat = flat.as_strided((flat.numel(),), (1,))
    return flat.view(torch.uint8)


def empty_payload(header: Any, device: Any = None) -> Any:
    """A buffer for the payload a header announces."""
    torch = torch_module()
    return torch.empty(int(header[1]), dtype=torch.uint8, device=device)


def decode(header: Any, payload: Any) -> Any:
    """The object a frame carries, from its header (an int64 tensor) and payload."""
    return decode_fields(header.tolist(), payload)  # one op, not one per field


def decode_fields(fields: list[int], payload: Any) -> Any:
    """The object a frame carries, from its header's fields (ints) and its payload (a uint8 tensor)."""
    torch = torch_module()
    if fields[0] == PICKLED:
        return pickle.loads(payload.numpy().tobytes())
    return payload.view(getattr(torch, DTYPES[fields[2]])).reshape(fields[4 : 4 + fields[3]])
