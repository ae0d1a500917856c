"""Turns on shared accelerators: the arbiter's rules (:class:`TurnTable`, pure) and its host (:class:`TurnServer`).

One arbiter runs per node where processes of different groups share an accelerator; every worker of that node
that calls ``turn()`` talks to it over one local connection (:mod:`hwplace.runtime.turns.client`). Rules:

- a request names its owner (a connection), its group and its units (the accelerators it wants);
- it is granted when no worker of another group holds any of its units and no request of another group that
  came earlier waits for one of them: first come, first served. Workers of one group never exclude each other;
- a grant says ``onload`` when another group held one of its units last;
- a holder that defined ``offload()`` and leaves while a request of another group waits for one of its units is
  told to offload first, and keeps its turn until it has (then the waiter enters);
- a lost connection (the worker died) releases what its owner held and withdraws what it waited for.

Imports the foundation only.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

Unit = tuple[str, int]
Granted = Callable[[bool, bool], None]  # (granted, onload); granted False: the request timed out
MAX_LINE = 1 << 16


@dataclass(eq=False)
class TurnRequest:
    owner: Hashable
    group: str
    units: frozenset[Unit]
    reply: Granted
    who: str = ""  # "trainer rank 0", for messages
    done: bool = False


@dataclass
class _Holding:
    group: str
    owners: set[Hashable] = field(default_factory=set)


class TurnTable:
    """The state of one node's turns: who holds which unit, and who waits, in arrival order."""

    def __init__(self) -> None:
        self._holding: dict[Unit, _Holding] = {}
        self._granted: dict[Hashable, TurnRequest] = {}
        self._waiting: list[TurnRequest] = []
        self._last: dict[Unit, str] = {}

    def acquire(self, owner: Hashable, group: str, units: Iterable[Unit], reply: Granted,
                who: str = "") -> TurnRequest | None:
        """Ask for a turn on ``units``; ``reply(True, onload)`` now or later. Returns the request while it waits."""
        if owner in self._granted:
            raise ValueError(f"{who or owner} already holds a turn")
        request = TurnRequest(owner, group, frozenset(units), reply, who)
        self._waiting.append(request)
        self._settle()
        return None if request.done else request

    def _settle(self) -> None:
        ahead: list[TurnRequest] = []
        for request in list(self._waiting):
            blocked = any(w.group != request.group and w.units & request.units for w in ahead) or any(
                unit in self._holding and self._holding[unit].group != request.group for unit in request.units)
            if blocked:
                ahead.append(request)
                continue
            self._waiting.remove(request)
            onload = any(self._last.get(unit, request.group) != request.group for unit in request.units)
            for unit in request.units:
                self._holding.setdefault(unit, _Holding(request.group)).owners.add(request.owner)
                self._last[unit] = request.group
            self._granted[request.owner] = request
            request.done = True
            request.reply(True, onload)

    def wanted(self, owner: Hashable) -> bool:
        """Whether a request of another group waits for a unit that ``owner`` holds."""
        held = self._granted.get(owner)
        return held is not None and any(w.group != held.group and w.units & held.units for w in self._waiting)

    def release(self, owner: Hashable) -> None:
        """End ``owner``'s turn and let in whoever can enter now."""
        held = self._granted.pop(owner, None)
        if held is None:
            return
        for unit in held.units:
            holding = self._holding[unit]
            holding.owners.discard(owner)
            if not holding.owners:
                del self._holding[unit]
        self._settle()

    def cancel(self, request: TurnRequest) -> None:
        """Withdraw a waiting request (its timeout elapsed): ``reply(False, False)``; a granted one is left alone."""
        if request.done:
            return
        self._waiting.remove(request)
        request.done = True
        request.reply(False, False)
        self._settle()  # it may have been the one that kept later requests out

    def drop(self, owner: Hashable) -> None:
        """``owner`` is gone: withdraw what it waits for (without a reply) and release what it holds."""
        for request in [w for w in self._waiting if w.owner == owner]:
            self._waiting.remove(request)
            request.done = True
        self.release(owner)
        self._settle()

    def holders(self, units: Iterable[Unit]) -> list[str]:
        """Who holds any of ``units`` now, for a timeout's message."""
        owners = {owner for unit in units if unit in self._holding for owner in self._holding[unit].owners}
        return sorted(self._granted[owner].who for owner in owners)


class TurnServer:
    """Serves one node's :class:`TurnTable` over local TCP, one JSON line per message; runs on an event loop.

    A client says ``hello`` (token, group, who) first; then ``acquire`` (units, timeout) is answered with
    ``{"granted": bool, "onload": bool, "holders": [...]}`` and ``release`` (hooks: whether it can offload) with
    ``{"offload": bool}``; after an offload, ``released`` is answered ``{}``. A connection that breaks the
    protocol, or ends, releases what its worker held.
    """

    def __init__(self) -> None:
        self.table = TurnTable()
        self.token = os.urandom(16).hex()
        self._server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1") -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Client(self), host, 0)
        return int(self._server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


class _Client(asyncio.Protocol):
    """One worker's connection to the arbiter."""

    def __init__(self, server: TurnServer) -> None:
        self.table = server.table
        self.token = server.token
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.group = self.who = ""
        self.greeted = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
        self.table.drop(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and (end := self.buffer.find(b"\n")) >= 0:
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            try:
                self._message(json.loads(line))
            except (ValueError, KeyError, TypeError):
                self.transport.abort()
        if self.transport is not None and len(self.buffer) > MAX_LINE:
            self.transport.abort()

    def _send(self, answer: dict[str, Any]) -> None:
        if self.transport is not None:
            self.transport.write(json.dumps(answer).encode() + b"\n")

    def _message(self, message: dict[str, Any]) -> None:
        if not self.greeted:
            if message.get("token") != self.token:
                raise ValueError("no token")
            self.group, self.who, self.greeted = str(message["group"]), str(message["who"]), True
            return
        op = message["op"]
        if op == "acquire":
            units = [(str(kind), int(index)) for kind, index in message["units"]]

            def granted(ok: bool, onload: bool) -> None:
                if self.timer is not None:
                    self.timer.cancel()
                    self.timer = None
                self._send({"granted": ok, "onload": onload, "holders": [] if ok else self.table.holders(units)})

            request = self.table.acquire(self, self.group, units, granted, self.who)
            if request is not None and message.get("timeout") is not None:
                self.timer = asyncio.get_running_loop().call_later(float(message["timeout"]), self.table.cancel,
                                                                   request)
        elif op == "release":
            if message.get("hooks") and self.table.wanted(self):
                self._send({"offload": True})
            else:
                self.table.release(self)
                self._send({"offload": False})
        elif op == "released":
            self.table.release(self)
            self._send({})
        else:
            raise ValueError(op)
