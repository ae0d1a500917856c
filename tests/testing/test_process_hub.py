"""The process cluster's hub served to other processes (hwplace.testing.processes.service): a burst of callers.

Every thread of a worker process that reaches the hub dials a connection of its own (a weight sync's source
opens one per target link, all in the same publish), and the hub's accepting thread authenticates each caller
before it takes the next. The callers that arrive meanwhile wait in the listening socket's queue: a queue one
deep dropped the rest, and a caller whose handshake the kernel had answered with a SYN cookie then waited
forever for the hub's challenge (weight syncs on the process executor hung about one run in three).
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time

import pytest

from hwplace.testing.processes.hub import Hub
from hwplace.testing.processes.service import HubClient, HubService

pytestmark = pytest.mark.time_limit(60)

BURST = 16


def test_a_burst_of_callers_waits_in_the_queue_while_the_hub_authenticates_another() -> None:
    authkey = os.urandom(16)
    hub = Hub()
    service = HubService(hub, authkey)
    slow = socket.create_connection(service.address)
    burst = [socket.socket() for _ in range(BURST)]
    try:
        slow.recv(1)  # the hub's challenge: its accepting thread has taken this caller and waits for the answer
        for caller in burst:
            caller.setblocking(False)
            caller.connect_ex(service.address)
        # on loopback a connection the queue takes is established at once; one it drops is tried again only a
        # second later (or, answered with a SYN cookie and then dropped, never), so waiting this long is enough
        deadline = time.monotonic() + 0.5
        connected: set[socket.socket] = set()
        while len(connected) < BURST and time.monotonic() < deadline:
            _, writable, _ = select.select([], [c for c in burst if c not in connected], [], 0.05)
            connected.update(writable)
        assert len(connected) == BURST, f"the hub's listening queue took {len(connected)} of {BURST} callers"
    finally:
        slow.close()
        for caller in burst:
            caller.close()
    try:
        hub.kv_put("key", b"value")
        answers: list[bytes] = []
        threads = [threading.Thread(target=lambda: answers.append(HubClient(service.address, authkey).call(
            "kv_wait", "key", 10.0))) for _ in range(BURST)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert answers == [b"value"] * BURST
    finally:
        service.close()
        hub.close()
