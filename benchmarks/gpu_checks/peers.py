"""What the checks' own processes share: spawning them, a key-value store over files in place of an executor's
``kv_put``/``kv_wait``, and hwplace's messaging :class:`~hwplace.runtime.messaging.messenger.Pair` between two such
processes without an executor or Ray (the pair needs only its messenger's group entry, rank, address and
key-value store).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from gpu_checks.harness import CheckHung, error_text, traceback_tail, watch_stacks

ADDRESS = "127.0.0.1"


def spawn() -> Any:
    """The spawn context: a peer inherits no CUDA state and no memory of the check's process."""
    return multiprocessing.get_context("spawn")


class FileKV:
    """An executor's key-value store (``kv_put``, ``kv_wait``) over files in one directory, for processes of one
    machine; plus a barrier."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / hashlib.sha1(key.encode()).hexdigest()

    def kv_put(self, key: str, value: bytes) -> None:
        path = self._path(key)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_bytes(value)
        os.replace(temporary, path)

    def kv_wait(self, key: str, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        path = self._path(key)
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"key {key!r} was not stored within {timeout:g} s")
            time.sleep(0.01)
        return path.read_bytes()

    def barrier(self, name: str, me: str, everyone: Sequence[str], timeout: float = 120) -> None:
        self.kv_put(f"barrier/{name}/{me}", b"1")
        for other in everyone:
            self.kv_wait(f"barrier/{name}/{other}", timeout)


def placement(gpu: bool) -> Any:
    """A one-process placement on GPU 0 of a node (or on no accelerator): what an executor would give."""
    from hwplace.contracts.records import Placement
    from hwplace.foundation.frozen import FrozenDict

    return Placement(rank=0, node_id="gpu-check-node", node_rank=0, local_accelerator_id=0 if gpu else -1,
                     local_rank=0, local_world_size=2, visible_accelerators=(0,) if gpu else (),
                     isolate_accelerator=False, local_hardware_ranks=(0,) if gpu else (),
                     hardware_type="cuda" if gpu else "node", node_group="gpu-check", env=FrozenDict())


def pair(kv_root: str, me: str, peer: str, gpu: bool) -> Any:
    """hwplace's messaging pair between group ``me`` rank 0 (this process) and group ``peer`` rank 0, both on GPU 0
    when ``gpu`` (then the pair asks the cuda backend for its collective backend, nccl), built as a Messenger
    would build it; the communicator connects through ``kv_root``."""
    from hwplace.contracts.executor import GroupEntry
    from hwplace.runtime.messaging.communicator import connect
    from hwplace.runtime.messaging.devices import chosen_device
    from hwplace.runtime.messaging.pair import Pair

    entries = {name: GroupEntry(name, f"launch-{name}", (placement(gpu),), (ADDRESS,)) for name in (me, peer)}
    kv = FileKV(kv_root)

    def connector(key: str, members: Any, index: int) -> Any:
        return connect(kv, key, members, index, ADDRESS, None)  # type: ignore[arg-type]

    def chosen() -> Any:
        import torch

        return chosen_device(torch)

    return Pair(connector, entries[me], 0, placement(gpu), chosen, entries[peer], 0)


def run_peer(function: Callable[..., dict[str, Any]], connection: Connection, *args: Any) -> None:
    """A peer process's body: ``function(connection, *args)``'s result, or its exception, as the last message."""
    watch_stacks()
    started = time.monotonic()
    try:
        found = {"ok": True, **function(connection, *args)}
    except BaseException as exc:
        found = {"ok": False, "error": error_text(exc), "traceback": traceback_tail(exc, 2000)}
    found["seconds"] = round(time.monotonic() - started, 3)
    connection.send(found)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: a process group (NCCL) left undestroyed can block it


def within(function: Callable[[], Any], cap: float) -> tuple[str, Any]:
    """``("ok", value)``, ``("timeout", text)`` or ``("error", text)`` of ``function()`` run in a thread of its own
    for at most ``cap`` s (a call blocked in C, a CUDA sync or a wait without a timeout, is left running)."""
    box: list[tuple[str, Any]] = []

    def run() -> None:
        try:
            box.append(("ok", function()))
        except BaseException as exc:
            box.append(("timeout" if isinstance(exc, TimeoutError) else "error", error_text(exc)))

    thread = threading.Thread(target=run, daemon=True, name="gpu-check-within")
    thread.start()
    thread.join(max(cap, 0.1))
    return box[0] if box else ("timeout", f"still waiting after {cap:g} s")


def start(function: Callable[..., dict[str, Any]], *args: Any,
          env: dict[str, str] | None = None) -> tuple[Any, Connection]:
    """A spawned peer running ``function(connection, *args)`` (with ``env`` added to its environment); the process
    and this side's connection."""
    mine, theirs = spawn().Pipe()
    process = spawn().Process(target=run_peer, args=(function, theirs, *args), daemon=True)
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        process.start()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return process, mine


def receive(connection: Connection, timeout: float, what: str, process: Any = None) -> Any:
    """The next message from a peer; :class:`CheckHung` after ``timeout`` s, an ``error`` message when it died."""
    deadline = time.monotonic() + timeout
    while not connection.poll(0.2):
        if process is not None and not process.is_alive() and not connection.poll(0):
            return {"ok": False, "error": f"{what}: the process ended with exit code {process.exitcode} "
                                          "without an answer", "exitcode": process.exitcode}
        if time.monotonic() > deadline:
            raise CheckHung(f"{what} did not answer within {timeout:g} s")
    try:
        return connection.recv()
    except EOFError:
        return {"ok": False, "error": f"{what}: its connection closed (exit code "
                                      f"{getattr(process, 'exitcode', None)})"}


def answer(connection: Connection, timeout: float, what: str, process: Any) -> dict[str, Any]:
    """Like :func:`receive`, but a peer that does not answer gives ``{"ok": False, "hung": True, ...}``."""
    try:
        found: dict[str, Any] = receive(connection, timeout, what, process)
    except CheckHung as exc:
        found = {"ok": False, "hung": True, "error": exc.message}
    return found


def finish(*processes: Any, timeout: float = 20) -> list[int | None]:
    """Wait for the peers to end (killing the ones that do not); their exit codes."""
    codes = []
    for process in processes:
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join(5)
        codes.append(process.exitcode)
    return codes


def memory(torch: Any, gpu: bool) -> dict[str, int]:
    """This process's view of GPU 0's memory (torch's allocator and the device as a whole), or its resident set
    size without a GPU."""
    if not gpu:
        with open("/proc/self/statm") as statm:
            return {"rss": int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")}
    free, total = torch.cuda.mem_get_info(0)
    return {"allocated": torch.cuda.memory_allocated(0), "reserved": torch.cuda.memory_reserved(0),
            "max_allocated": torch.cuda.max_memory_allocated(0), "device_used": total - free}
