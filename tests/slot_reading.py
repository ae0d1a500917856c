"""A device-ring reader in another interpreter, for the ring tests on CPU (tests/runtime) and on a GPU
(tests/plugins/cuda): :func:`reading_process` spawns it, :func:`ask` hands it a descriptor and returns what it
read (each tensor's dtype, shape, device type and bytes) or the ``WeightSyncError`` it raised."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import hwplace
from hwplace.runtime.weight_sync.device_ring import RingDescriptor, RingReader


def raw(tensor: Any) -> bytes:
    """A tensor's bytes, copied to host memory."""
    import torch

    return bytes(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def _serve(connection: Connection) -> None:
    reader = RingReader()
    while (descriptor := connection.recv()) is not None:
        try:
            got = reader.read(descriptor)
            connection.send({k: (str(v.dtype), tuple(v.shape), v.device.type, raw(v)) for k, v in got.items()})
        except hwplace.WeightSyncError as exc:
            connection.send(exc)


@contextlib.contextmanager
def reading_process() -> Iterator[Connection]:
    """A connection to a reader in a new interpreter (spawned: it inherits no memory of this one)."""
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    process = context.Process(target=_serve, args=(theirs,), daemon=True)
    process.start()
    try:
        yield mine
    finally:
        mine.send(None)
        process.join(60)
        if process.is_alive():
            process.kill()


def ask(connection: Connection, descriptor: RingDescriptor, timeout: float = 120) -> Any:
    """What the reader answers for ``descriptor``: the tensors it read, or the error it raised."""
    connection.send(descriptor)
    if not connection.poll(timeout):
        raise TimeoutError(f"the reading process did not answer in {timeout:g} s")
    return connection.recv()
