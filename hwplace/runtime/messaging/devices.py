"""A pair's tensors on GPUs: which device a worker receives them on, which GPU it holds, the NCCL groups of a
pair, and waiting on a device transfer while watching the peer.

- :func:`own_device` is the one place that says on which CUDA device a worker's received tensors land.
- :func:`physical_id` names the GPU behind a CUDA device (node and PCI address: two MIG slices of one GPU have
  one), so that :func:`hwplace.planning.sharing.message_path` can keep NCCL off a pair on one GPU.
- :func:`nccl_groups` builds one ``ProcessGroupNCCL`` per direction of a pair: each NCCL communicator is then
  used by one thread of each process (the sender's, under the pair's send lock, and the receiver's thread),
  never by two at once (NCCL forbids it), and two workers sending large tensors to each other at once never
  wait on each other's stream (NVIDIA/nccl#479). The groups take hwplace's timeout and clean up on an error
  (``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``) instead of ending the process.
- :func:`wait_work` waits for a device transfer from the host, polling it and the peer's health, so a peer that
  dies mid-transfer is the pair's ``WorkerError`` at once, not a stream stuck until NCCL's watchdog fires.

Imports the foundation and the contracts; torch comes in as an argument (imported by the caller on first use).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from hwplace.contracts.records import Placement

ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
CLEAN_UP_ONLY = "2"  # abort the communicator and fail its works; never end the process (torch's default: 3)
_constructing = threading.Lock()  # the variable is read by the constructor: set it around one at a time


def chosen_device(torch: Any) -> int | None:
    """The CUDA device the calling thread chose (``torch.cuda.set_device``, or its first CUDA use), or ``None``
    when this process has not used CUDA yet (asking would initialize it)."""
    try:
        return int(torch.cuda.current_device()) if torch.cuda.is_initialized() else None
    except Exception:
        return None


def own_device(placement: Placement, chosen: int | None) -> int:
    """The CUDA device (this process's numbering) a worker's received device tensors land on: the one its
    thread chose (``chosen``, see :func:`chosen_device`), else its placement's first own accelerator (its
    position among the accelerators the process sees: 0 when isolated), else 0."""
    if chosen is not None and chosen >= 0:
        return chosen
    if placement.local_accelerator_id in placement.visible_accelerators:
        return placement.visible_accelerators.index(placement.local_accelerator_id)
    return 0


def physical_id(torch: Any, device: int) -> str:
    """The GPU behind CUDA device ``device``: this node's name and the GPU's PCI address (shared by the MIG
    slices of one GPU), or its UUID where the PCI address is unknown; ``""`` when neither can be read."""
    try:
        props = torch.cuda.get_device_properties(device)
    except Exception:
        return ""
    pci = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if all(isinstance(part, int) for part in pci):
        return f"{socket.gethostname()}/pci {pci[0]:04x}:{pci[1]:02x}:{pci[2]:02x}"
    uuid = getattr(props, "uuid", None)
    return f"{socket.gethostname()}/{uuid}" if uuid else ""


def nccl_groups(dist: Any, store: Any, key: str, index: int, size: int, timeout: float) -> tuple[Any, ...]:
    """One ``ProcessGroupNCCL`` per sending member (``groups[i]`` carries what member ``i`` sends), with
    ``timeout`` and clean-up (not the end of the process) on an error."""
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = datetime.timedelta(seconds=timeout)
    groups = []
    with _constructing:
        before = os.environ.get(ERROR_HANDLING)
        os.environ[ERROR_HANDLING] = CLEAN_UP_ONLY
        try:
            for sender in range(size):
                prefixed = dist.PrefixStore(f"{key}/nccl{sender}/", store)
                groups.append(dist.ProcessGroupNCCL(prefixed, index, size, options))
        finally:
            if before is None:
                os.environ.pop(ERROR_HANDLING, None)
            else:
                os.environ[ERROR_HANDLING] = before
    return tuple(groups)


def abort(groups: tuple[Any, ...]) -> None:
    """End the NCCL communicators of ``groups``: their pending transfers fail instead of waiting for ever."""
    for group in groups:
        with contextlib.suppress(Exception):  # already aborted, or never used
            group.abort()


def wait_work(work: Any, broken: Callable[[], BaseException | None], groups: tuple[Any, ...]) -> None:
    """Wait until a device transfer finished on its GPU. ``broken()`` returns the pair's error once the peer is
    gone: then the groups are aborted and that error raised. A failed transfer raises its ``RuntimeError``."""
    pause = 20e-6
    while not work.is_completed():
        error = broken()
        if error is not None:
            abort(groups)
            raise error
        time.sleep(pause)
        pause = min(pause * 2, 5e-3)
    work.wait()  # raises the transfer's error (a timeout, an aborted communicator)
