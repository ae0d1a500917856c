"""This worker and one peer: the communicator between them, the thread that receives the peer's frames, the
waiting recvs, and the handle of a message in flight.

A small message (up to 4 KiB with its header) is copied into a frame and queued: ``send`` returns without
waiting for it to leave (up to ``QUEUED`` in flight per pair), so a stream of them costs no thread hand-over
on the sender. A thread per pair receives the peer's frames as they come, in order, and hands each to the
oldest waiting ``recv`` (or keeps it until one comes), so a ``recv`` can time out without losing a message, a
``recv`` cancelled in async code loses nothing either, and a peer that dies fails every waiting ``recv`` at once.
A message this worker cannot read (an unpickling error) fails the one ``recv`` that takes it.

A peer that dies in the middle of a message: gloo fails every receive posted on a pair whose connection
closed, except the one it was reading into (gloo's tcp ``Pair::signalException`` fails the buffers of the
pending operations, not the one in ``rx_``): that wait would last gloo's timeout, and no call (``abort`` of the
group included) ends it. So a second thread per pair waits on a receive nothing is ever sent to (``WATCH_TAG``,
0 bytes): it fails the moment the connection closes, and when the receiving thread then still waits for the
peer ``GRACE`` s later (every other wait ends at once), that thread is stuck in the message being read, and the
watcher fails the pair. The stuck thread and its buffer stay until gloo's timeout ends the wait.

Tensors on GPUs take the pair's path (:func:`hwplace.planning.sharing.message_path`, decided once both ends
have said what they hold): device to device over NCCL, or through host memory when both hold one GPU (the
colocated layout), landing on the receiver's own device (:func:`hwplace.runtime.messaging.devices.own_device`).
Imports the layers below, :mod:`hwplace.runtime.messaging.communicator` and
:mod:`hwplace.runtime.messaging.devices`.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hwplace.contracts.executor import GroupEntry, Pending
from hwplace.contracts.records import Placement
from hwplace.foundation.errors import WorkerError
from hwplace.foundation.wording import first_line
from hwplace.planning.sharing import HOST, NCCL, message_path
from hwplace.plugin.session import get_plugin_manager
from hwplace.runtime.messaging.communicator import (
    CONNECT_TIMEOUT,
    DEVICE_TENSOR,
    HEADER,
    HOSTED,
    Communicator,
    Member,
    add_devices,
    decode_fields,
    encode,
    exchange,
    torch_module,
)
from hwplace.runtime.messaging.devices import abort, own_device, physical_id, wait_work

FRAME = 4096  # bytes of every message's first part: the header, then the payload when it fits (inline)
FRAME_TAG, PAYLOAD_TAG, WATCH_TAG = 0, 1, 2  # nothing is ever sent with WATCH_TAG
GRACE = 0.5  # seconds the receiving thread may still wait for a peer whose connection closed before it is stuck
WATCH_LIMIT = datetime.timedelta(days=3650)  # the watching receive's own timeout: it must outlive the pair
QUEUED = 64  # small (inline) sends a pair keeps in flight before a send waits for the oldest
RING = 8  # frames a pair's receiving thread keeps a receive posted for


class MessageHandle(Pending):
    """A ``send`` or ``recv`` in flight (``async_op=True``): ``wait(timeout=None)`` returns what was received
    (``None`` for a send) or raises; an elapsed timeout raises ``TimeoutError`` and the operation goes on.
    ``done()`` says whether it finished; ``await handle`` waits inside async code (a cancelled ``await`` of a
    recv gives up its place: the message goes to the next recv)."""

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

    def __repr__(self) -> str:
        return f"<MessageHandle {self._what}{' done' if self.done() else ''}>"


def collective_backend(placement: Placement) -> str:
    """``"nccl"`` when the worker at ``placement`` holds an accelerator whose backend moves its tensors with
    NCCL and CUDA works in this process; ``""`` otherwise."""
    if placement.local_accelerator_id < 0:
        return ""
    try:
        name = getattr(get_plugin_manager().backend(placement.hardware_type).item, "collective_backend", "gloo")
    except Exception:
        return ""
    return NCCL if name == NCCL and torch_module().cuda.is_available() else ""


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
    """This worker and one peer: the peer's frames, received by a thread of their own, and the waiting recvs.

    ``me`` is this worker's (group, rank) and ``placement`` its placement; ``chosen()`` the CUDA device its
    threads chose (:func:`hwplace.runtime.messaging.devices.chosen_device`), read when a device tensor lands.
    """

    def __init__(self, connector: Callable[[str, tuple[Member, ...], int], Communicator], me: GroupEntry,
                 my_rank: int, placement: Placement, chosen: Callable[[], int | None], peer: GroupEntry,
                 rank: int) -> None:
        self.peer, self.rank, self.placement, self.chosen = peer, rank, placement, chosen
        mine: Member = (me.name, my_rank)
        self.members: tuple[Member, ...] = tuple(sorted([mine, (peer.name, rank)]))
        self.index = self.members.index(mine)
        entries = {me.name: me, peer.name: peer}
        # keyed by each end's launch and process (its incarnation): a restarted end meets its peer afresh
        self.key = "msg/" + "|".join(f"{g}#{entries[g].launch_id}/{r}.{entries[g].incarnation(r)}"
                                     for g, r in self.members)
        self.ready = threading.Event()
        self.comm: Communicator | None = None
        self.path = HOST  # how device tensors travel, decided on connection
        self.hosted = False  # both ends hold CUDA GPUs: a device tensor sent through the host lands on one
        self.error: BaseException | None = None
        self.waiting: float | None = None  # since when the receiving thread waits for the peer (None: it does not)
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.messages: deque[tuple[bool, Any]] = deque()  # (received, the message or the error reading it)
        self.waiters: deque[Future[Any]] = deque()
        self.queued: deque[tuple[Any, Any]] = deque()  # small sends in flight: (work, frame), oldest first
        self.sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hwplace-send")
        self.thread = threading.Thread(target=self._receive, args=(connector,), daemon=True,
                                       name=f"hwplace-recv-{peer.name}-{rank}")
        self.thread.start()

    def __str__(self) -> str:
        return f"group {self.peer.name!r} rank {self.rank}"

    def _connect(self, connector: Callable[[str, tuple[Member, ...], int], Communicator]) -> Communicator:
        comm = connector(self.key, self.members, self.index)
        mine = collective_backend(self.placement)
        here = physical_id(torch_module(), own_device(self.placement, self.chosen())) if mine else ""
        said = [text.partition("|") for text in exchange(comm, f"{mine}|{here}")]
        placements = [self.placement, self.peer.placements[self.rank]][:: 1 if self.index == 0 else -1]
        self.path = message_path(placements[0], placements[1], (said[0][0], said[1][0]), (said[0][2], said[1][2]))
        self.hosted = said[0][0] == said[1][0] == NCCL
        if self.path == NCCL:
            add_devices(comm, self.key)
        return comm

    def _receive(self, connector: Callable[[str, tuple[Member, ...], int], Communicator]) -> None:
        import numpy as np  # noqa: PLC0415 (optional: numpy, installed with torch)

        torch = torch_module()
        try:
            comm = self.comm = self._connect(connector)
            self.ready.set()
            other = 1 - self.index
            watch = comm.gloo.recv([torch.zeros(0, dtype=torch.uint8)], other, WATCH_TAG)
            threading.Thread(target=self._watch, args=(watch,), daemon=True,
                             name=f"hwplace-watch-{self.peer.name}-{self.rank}").start()
            frames = [torch.zeros(FRAME, dtype=torch.uint8) for _ in range(RING)]
            views = [frame.numpy() for frame in frames]  # read through numpy: a few us less per message than torch
            # RING receives stay posted, so RING queued sends can leave at once; gloo fills them in posting order
            posted = deque(comm.gloo.recv([frame], other, FRAME_TAG) for frame in frames)
            recycled = Recycled()
            for turn in itertools.count():
                self._wait(posted.popleft().wait)
                raw = views[turn % RING]
                fields = raw[: HEADER * 8].view(np.int64).tolist()
                on_device = fields[0] == DEVICE_TENSOR
                small = not on_device and fields[1] <= FRAME - HEADER * 8
                data = raw[HEADER * 8 : HEADER * 8 + fields[1]].copy() if small else None
                posted.append(comm.gloo.recv([frames[turn % RING]], other, FRAME_TAG))  # read out: post again
                if data is not None:
                    self._deliver(fields, torch.from_numpy(data) if data.size else torch.empty(0, dtype=torch.uint8))
                    continue
                if on_device:
                    payload = torch.empty(fields[1], dtype=torch.uint8, device=self._device())
                    work = comm.devices[other].recv([payload], other, PAYLOAD_TAG)
                    self._wait(wait_work, work, lambda: self.error, comm.devices)
                else:
                    payload = recycled.take(fields[1])
                    self._wait(comm.gloo.recv([payload], other, PAYLOAD_TAG).wait)
                self._deliver(fields, payload)
        except BaseException as exc:
            self._fail(exc)

    def _wait(self, wait: Callable[..., Any], *args: Any) -> None:
        """``wait(*args)`` for the peer, marked as such for the watcher."""
        self.waiting = time.monotonic()
        try:
            wait(*args)
        finally:
            self.waiting = None

    def _watch(self, watch: Any) -> None:
        """Wait until the pair's connection closes (``watch``, a receive nothing is sent to, then fails); fail the
        pair when the receiving thread is then stuck in a message the peer did not finish (see the module)."""
        try:
            watch.wait(WATCH_LIMIT)
        except Exception as exc:
            problem = first_line(exc)
        else:
            return  # cannot happen: nothing is sent with WATCH_TAG
        closed = time.monotonic()
        while self.error is None:
            since = self.waiting
            if since is not None and time.monotonic() - max(since, closed) >= GRACE:
                self._fail(peer_error(self.peer, self.rank, "the connection to it closed in the middle of a "
                                      f"message; the worker has died or shut down ({problem})"))
            time.sleep(0.01)

    def _device(self) -> str:
        return f"cuda:{own_device(self.placement, self.chosen())}"

    def _deliver(self, fields: list[int], payload: Any) -> None:
        try:
            message: Any = decode_fields(fields, payload)
            if fields[0] == HOSTED and self.hosted:
                message = message.to(self._device())
            entry = (True, message)
        except Exception as exc:  # this message only: the next ones still arrive
            entry = (False, peer_error(self.peer, self.rank, "sent a message this worker cannot read "
                                       f"({type(exc).__name__}: {first_line(exc)}); later messages still arrive"))
        with self.lock:
            while self.waiters:
                waiter = self.waiters.popleft()
                if waiter.set_running_or_notify_cancel():  # False: its recv was cancelled, skip it
                    break
            else:
                self.messages.append(entry)
                return
        settle(waiter, entry)

    def _fail(self, exc: BaseException) -> None:
        error: BaseException
        if isinstance(exc, WorkerError):
            error = exc
        elif isinstance(exc, TimeoutError) and not self.ready.is_set():
            error = peer_error(self.peer, self.rank,
                               f"did not come to exchange messages within {CONNECT_TIMEOUT:g} s ({exc})")
        else:
            error = peer_error(self.peer, self.rank, "the connection to it broke; the worker has died or shut "
                               f"down ({first_line(exc)})")
        with self.lock:
            if self.error is not None:  # the first error stands (the watcher's, or the receiving thread's)
                error = self.error
            self.error = error
            waiters, self.waiters = list(self.waiters), deque()
        self.ready.set()
        if self.comm is not None:
            abort(self.comm.devices)
        for waiter in waiters:
            if waiter.set_running_or_notify_cancel():
                waiter.set_exception(error)

    def claim(self) -> Future[Any]:
        """The next message, now or when it comes."""
        future: Future[Any] = Future()
        with self.lock:
            if self.messages:
                entry = self.messages.popleft()
            elif self.error is not None:
                entry = (False, self.error)
            else:
                self.waiters.append(future)
                return future
        future.set_running_or_notify_cancel()
        settle(future, entry)
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
        header, payload = encode(obj, device_ok=bool(comm.devices), hosted=self.hosted)
        other = 1 - comm.index
        frame = torch.zeros(FRAME, dtype=torch.uint8)
        frame[: HEADER * 8] = header.view(torch.uint8)
        if inline(header):
            frame[HEADER * 8 : HEADER * 8 + payload.numel()] = payload
        small = inline(header) and not async_op
        device = None
        with self.send_lock:  # one thread at a time on the pair's groups (NCCL forbids two on one communicator)
            self._reap(len(self.queued) >= QUEUED)
            works = [comm.gloo.send([frame], other, FRAME_TAG)]
            if small:  # its bytes are in the frame: queued, not awaited (a failure is raised by a later send)
                self.queued.append((works[0], frame))
                return None
            if int(header[0]) == DEVICE_TENSOR:
                device = comm.devices[comm.index].send([payload], other, PAYLOAD_TAG)
            elif not inline(header):
                works.append(comm.gloo.send([payload], other, PAYLOAD_TAG))
        if not async_op:
            self._finish(works, device, frame, payload)
            return None
        return MessageHandle(self.sender.submit(self._finish, works, device, frame, payload), f"send to {self}")

    def _reap(self, wait: bool) -> None:
        """Forget the queued sends that finished (waiting for the oldest when ``wait``); raise one's failure."""
        while self.queued and (wait or self.queued[0][0].is_completed()):
            work, frame = self.queued.popleft()
            wait = False
            self._finish([work], None, frame)

    def _finish(self, works: list[Any], device: Any, *keep: Any) -> None:
        try:
            for work in works:
                work.wait()
            if device is not None:
                wait_work(device, lambda: self.error, self.comm.devices if self.comm else ())
        except RuntimeError as exc:
            if isinstance(exc, WorkerError):
                raise
            raise self.error or peer_error(self.peer, self.rank, f"sending failed: {first_line(exc)}") from None


def settle(future: Future[Any], entry: tuple[bool, Any]) -> None:
    """Give a running ``future`` a received message, or the error that stands for it."""
    if entry[0]:
        future.set_result(entry[1])
    else:
        future.set_exception(entry[1])
