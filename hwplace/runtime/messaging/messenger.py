"""Messages between any two workers of a cluster: what ``Worker.send``, ``recv`` and ``broadcast`` run.

Each pair of workers gets its own communicator (:mod:`hwplace.runtime.messaging.communicator`) the first time either
sends to or receives from the other. A small message (up to 4 KiB with its header) is copied into a frame and
queued: ``send`` returns without waiting for it to leave (up to ``QUEUED`` in flight per pair), so a stream of
them costs no thread hand-over on the sender. A thread per pair receives the peer's frames as they come, in order, and
hands each to the oldest waiting ``recv`` (or keeps it until one comes), so a ``recv`` can time out without
losing a message, and a peer that dies fails every waiting ``recv`` at once. Imports the layers below and
:mod:`hwplace.runtime.messaging.communicator`.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hwplace.contracts.capabilities import Rendezvous, require
from hwplace.contracts.executor import Executor, GroupEntry
from hwplace.contracts.records import WorkerContext
from hwplace.foundation.errors import ConfigError, WorkerError
from hwplace.plugin.session import get_plugin_manager, session
from hwplace.runtime.messaging.communicator import (
    CONNECT_TIMEOUT,
    DEVICE_TENSOR,
    HEADER,
    Communicator,
    Member,
    check_member,
    connect,
    decode,
    decode_fields,
    empty_payload,
    encode,
    find_entry,
    torch_module,
)


class MessageHandle:
    """A ``send`` or ``recv`` in flight (``async_op=True``): ``wait(timeout=None)`` returns what was received
    (``None`` for a send) or raises; an elapsed timeout raises ``TimeoutError`` and the operation goes on.
    ``done()`` says whether it finished; ``await handle`` waits inside async code."""

    def __init__(self, future: Future[Any], what: str) -> None:
        self._future = future
        self._what = what

    def wait(self, timeout: float | None = None) -> Any:
        try:
            return self._future.result(timeout)
        except TimeoutError:
            if self._future.done():
                return self._future.result()
            raise TimeoutError(f"{self._what} did not finish within {timeout:g} s; it goes on") from None

    def done(self) -> bool:
        return self._future.done()

    async def wait_async(self) -> Any:
        return await asyncio.wrap_future(self._future)

    def __await__(self) -> Generator[Any, None, Any]:
        return self.wait_async().__await__()

    def __repr__(self) -> str:
        return f"<MessageHandle {self._what}{' done' if self.done() else ''}>"


def device_backend(placements: Sequence[Any]) -> str | None:
    """The accelerator collective backend every one of ``placements`` has (``nccl``), or ``None`` (gloo only)."""
    manager = get_plugin_manager()
    names = set()
    for placement in placements:
        if placement.local_accelerator_id < 0:
            return None
        try:
            names.add(getattr(manager.backend(placement.hardware_type).item, "collective_backend", "gloo"))
        except Exception:
            return None
    name = names.pop() if len(names) == 1 else "gloo"
    return name if name == "nccl" and torch_module().cuda.is_available() else None


FRAME = 4096  # bytes of every message's first part: the header, then the payload when it fits (inline)
FRAME_TAG, PAYLOAD_TAG = 0, 1
QUEUED = 64  # small (inline) sends a pair keeps in flight before a send waits for the oldest
RING = 8  # frames a pair's receiving thread keeps a receive posted for


def inline(header: Any) -> bool:
    """Whether the payload a header announces travels inside its frame (small, in host memory)."""
    return int(header[0]) != DEVICE_TENSOR and int(header[1]) <= FRAME - HEADER * 8


class Recycled:
    """Receive buffers for large payloads (at least ``least`` bytes), each taken again for a payload of its size
    once nothing refers to it any more: no tensor, view or array made from it is alive (the buffer's reference
    count, which every such object raises, says so). Keeps the ``keep`` used last. A fresh 64 MiB buffer costs
    its page faults on every message; a recycled one none."""

    def __init__(self, keep: int = 2, least: int = 2**20) -> None:
        self.keep, self.least = keep, least
        self.arrays: list[Any] = []  # numpy uint8 arrays, the one used last at the end

    def take(self, nbytes: int) -> Any:
        import numpy as np  # noqa: PLC0415 (optional: numpy, installed with torch)

        torch = torch_module()
        for index in range(len(self.arrays)):
            # references: the list's and getrefcount's argument; any more is a tensor, view or array still alive
            if self.arrays[index].nbytes == nbytes and sys.getrefcount(self.arrays[index]) <= 2:
                self.arrays.append(self.arrays.pop(index))
                return torch.from_numpy(self.arrays[-1])
        array = np.empty(nbytes, dtype=np.uint8)
        if nbytes >= self.least:
            self.arrays = [*self.arrays, array][-self.keep :]
        return torch.from_numpy(array)


def peer_error(entry: GroupEntry, rank: int, problem: str) -> WorkerError:
    return WorkerError(problem, group=entry.name, rank=rank, node_rank=entry.placements[rank].node_rank)


class Pair:
    """This worker and one peer: the peer's frames, received by a thread of their own, and the waiting recvs."""

    def __init__(self, messenger: Messenger, peer: GroupEntry, rank: int) -> None:
        self.peer, self.rank = peer, rank
        me = (messenger.entry.name, messenger.context.rank)
        self.members: tuple[Member, ...] = tuple(sorted([me, (peer.name, rank)]))
        launches = {messenger.entry.name: messenger.entry.launch_id, peer.name: peer.launch_id}
        self.key = "msg/" + "|".join(f"{g}#{launches[g]}/{r}" for g, r in self.members)
        self.ready = threading.Event()
        self.comm: Communicator | None = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.messages: deque[Any] = deque()
        self.waiters: deque[Future[Any]] = deque()
        self.queued: deque[tuple[Any, Any]] = deque()  # small sends in flight: (work, frame), oldest first
        self.sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hwplace-send")
        backend = device_backend([messenger.entry.placements[messenger.context.rank], peer.placements[rank]])
        self.thread = threading.Thread(target=self._receive, args=(messenger, backend), daemon=True,
                                       name=f"hwplace-recv-{peer.name}-{rank}")
        self.thread.start()

    def __str__(self) -> str:
        return f"group {self.peer.name!r} rank {self.rank}"

    def _receive(self, messenger: Messenger, backend: str | None) -> None:
        import numpy as np  # noqa: PLC0415 (optional: numpy, installed with torch)

        torch = torch_module()
        try:
            index = self.members.index((messenger.entry.name, messenger.context.rank))
            self.comm = connect(messenger.rendezvous, self.key, self.members, index, messenger.address, backend)
            self.ready.set()
            other = 1 - index
            frames = [torch.zeros(FRAME, dtype=torch.uint8) for _ in range(RING)]
            views = [frame.numpy() for frame in frames]  # read through numpy: a few us less per message than torch
            # RING receives stay posted, so RING queued sends can leave at once; gloo fills them in posting order
            posted = deque(self.comm.gloo.recv([frame], other, FRAME_TAG) for frame in frames)
            recycled = Recycled()
            for turn in itertools.count():
                posted.popleft().wait()
                raw = views[turn % RING]
                fields = raw[: HEADER * 8].view(np.int64).tolist()
                on_device = fields[0] == DEVICE_TENSOR
                small = not on_device and fields[1] <= FRAME - HEADER * 8
                data = raw[HEADER * 8 : HEADER * 8 + fields[1]].copy() if small else None
                posted.append(self.comm.gloo.recv([frames[turn % RING]], other, FRAME_TAG))  # read out: post again
                if data is not None:
                    payload = torch.from_numpy(data) if data.size else torch.empty(0, dtype=torch.uint8)
                    self._deliver(decode_fields(fields, payload))
                    continue
                payload = empty_payload(torch.tensor(fields), torch.cuda.current_device()) if on_device else \
                    recycled.take(fields[1])
                (self.comm.device if on_device else self.comm.gloo).recv([payload], other, PAYLOAD_TAG).wait()
                self._deliver(decode_fields(fields, payload))
        except BaseException as exc:
            self._fail(exc)

    def _deliver(self, message: Any) -> None:
        with self.lock:
            if self.waiters:
                self.waiters.popleft().set_result(message)
            else:
                self.messages.append(message)

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, TimeoutError) and not self.ready.is_set():
            problem = f"did not come to exchange messages within {CONNECT_TIMEOUT:g} s ({exc})"
        else:
            problem = f"the connection to it broke; the worker has died or shut down ({_first_line(exc)})"
        error = peer_error(self.peer, self.rank, problem)
        with self.lock:
            self.error = error
            waiters, self.waiters = list(self.waiters), deque()
        self.ready.set()
        for waiter in waiters:
            waiter.set_exception(error)

    def claim(self) -> Future[Any]:
        """The next message, now or when it comes."""
        future: Future[Any] = Future()
        with self.lock:
            if self.messages:
                future.set_result(self.messages.popleft())
            elif self.error is not None:
                future.set_exception(self.error)
            else:
                self.waiters.append(future)
        return future

    def withdraw(self, future: Future[Any]) -> bool:
        """Give up a claim that has not been served; False when it was served meanwhile."""
        with self.lock:
            if future in self.waiters:
                self.waiters.remove(future)
                return True
            return False

    def connected(self) -> Communicator:
        if not self.ready.wait(CONNECT_TIMEOUT + 5.0) or self.comm is None:
            raise self.error or peer_error(self.peer, self.rank, "the connection to it is not set up")
        if self.error is not None:
            raise self.error
        return self.comm

    def send(self, obj: Any, async_op: bool) -> MessageHandle | None:
        comm = self.connected()
        torch = torch_module()
        header, payload = encode(obj, device_ok=comm.device is not None)
        other = 1 - comm.index
        frame = torch.zeros(FRAME, dtype=torch.uint8)
        frame[: HEADER * 8] = header.view(torch.uint8)
        if inline(header):
            frame[HEADER * 8 : HEADER * 8 + payload.numel()] = payload
        small = inline(header) and not async_op
        with self.send_lock:
            self._reap(len(self.queued) >= QUEUED)
            works = [comm.gloo.send([frame], other, FRAME_TAG)]
            if small:  # its bytes are in the frame: queued, not awaited (a failure is raised by a later send)
                self.queued.append((works[0], frame))
                return None
            if not inline(header):
                on_device = int(header[0]) == DEVICE_TENSOR
                works.append((comm.device if on_device else comm.gloo).send([payload], other, PAYLOAD_TAG))
        if not async_op:
            self._finish(works, frame, payload)
            return None
        return MessageHandle(self.sender.submit(self._finish, works, frame, payload), f"send to {self}")

    def _reap(self, wait: bool) -> None:
        """Forget the queued sends that finished (waiting for the oldest when ``wait``); raise one's failure."""
        while self.queued and (wait or self.queued[0][0].is_completed()):
            work, frame = self.queued.popleft()
            wait = False
            self._finish([work], frame)

    def _finish(self, works: list[Any], *keep: Any) -> None:
        try:
            for work in works:
                work.wait()
        except RuntimeError as exc:
            raise self.error or peer_error(self.peer, self.rank, f"sending failed: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(exc).__name__


class Messenger:
    """One worker's pairs and broadcast communicators."""

    def __init__(self, context: WorkerContext, executor: Executor) -> None:
        self.context, self.executor = context, executor
        self.rendezvous = require(executor, Rendezvous, "messaging (send, recv, broadcast)")
        self.entry = find_entry(executor, context.group)
        self.address = self.entry.addresses[context.rank]
        self.lock = threading.Lock()
        self.pairs: dict[tuple[str, int], Pair] = {}
        self.sets: dict[tuple[str, ...], tuple[Communicator, list[GroupEntry]]] = {}

    def pair(self, group: object, rank: object) -> Pair:
        if not isinstance(group, str):
            raise ConfigError("group", "a peer's group is its name, a string", value=group)
        with self.lock:
            found = self.pairs.get((group, rank))  # type: ignore[arg-type]
            if found is not None and found.error is None:
                return found
            entry = find_entry(self.executor, group)
            checked = check_member(entry, rank, "rank")
            if (group, checked) == (self.context.group, self.context.rank):
                raise ConfigError("rank", f"group {group!r} rank {checked} is this worker; send to another one")
            if found is not None and found.peer.launch_id == entry.launch_id:
                return found  # the same, failed peer: its error stands
            made = self.pairs[(group, checked)] = Pair(self, entry, checked)
            return made

    def recv(self, group: str, rank: int, async_op: bool, timeout: float | None) -> Any:
        pair = self.pair(group, rank)
        future = pair.claim()
        if async_op:
            return MessageHandle(future, f"recv from {pair}")
        try:
            return future.result(timeout)
        except TimeoutError:
            if pair.withdraw(future):
                raise TimeoutError(f"recv from {pair}: nothing came within {timeout:g} s") from None
            return future.result()

    def broadcast(self, obj: Any, src: tuple[str, int], groups: Sequence[str]) -> Any:
        if isinstance(groups, str) or not groups or not all(isinstance(g, str) for g in groups):
            raise ConfigError("groups", "broadcast takes a tuple of group names", value=groups)
        names = tuple(dict.fromkeys(groups))
        with self.lock:
            made = self.sets.get(names)
        if made is None:
            made = self._broadcast_set(names)
        comm, entries = made
        if not (isinstance(src, tuple) and len(src) == 2 and src[0] in names):
            raise ConfigError("src", f"the source is a (group, rank) of the groups {list(names)}", value=src)
        root = comm.members.index((src[0], check_member(entries[names.index(src[0])], src[1], "src")))
        torch = torch_module()
        header, payload = encode(obj, device_ok=False) if comm.index == root else (None, None)
        if header is None:
            header = torch.zeros(HEADER, dtype=torch.int64)
        try:
            comm.gloo.broadcast(header, root).wait()
            if payload is None:
                payload = empty_payload(header)
            if payload.numel():
                comm.gloo.broadcast(payload, root).wait()
        except RuntimeError as exc:
            with self.lock:
                self.sets.pop(names, None)
            raise WorkerError(f"broadcast over groups {list(names)} failed; a member has died or left "
                              f"({_first_line(exc)})", group=self.context.group, rank=self.context.rank) from None
        return obj if comm.index == root else decode(header, payload)

    def _broadcast_set(self, names: tuple[str, ...]) -> tuple[Communicator, list[GroupEntry]]:
        entries = [find_entry(self.executor, name) for name in names]
        me = (self.context.group, self.context.rank)
        members = [(e.name, r) for e in entries for r in range(len(e.placements))]
        if me not in members:
            raise ConfigError("groups", f"this worker (group {me[0]!r}) is not in the groups {list(names)}; every "
                              "member of the listed groups calls broadcast, and only they")
        key = "bcast/" + "|".join(f"{e.name}#{e.launch_id}" for e in entries)
        comm = connect(self.rendezvous, key, members, members.index(me), self.address, None)
        with self.lock:
            self.sets[names] = (comm, entries)
        return comm, entries


def messenger(context: WorkerContext) -> Messenger:
    """This worker's messenger, made on first use (kept in the session)."""
    here = session()
    made: Messenger = here.state("messaging", lambda: Messenger(context, here.executor))
    if made.context is not context:
        raise WorkerError("messaging: this process's messenger belongs to another worker",
                          group=context.group, rank=context.rank)
    return made
