"""What messaging and weight sync need from Ray: the group entries and a small key-value store.

The key-value store is Ray's internal one (in its control service), in a namespace per Ray namespace, so two
jobs do not meet. Imports Ray: loaded on first use.
"""

from __future__ import annotations

import pickle
import time

import ray
from ray.experimental import internal_kv

from hwplace.executor import GroupEntry

WAIT_STEPS = (0.002, 0.005, 0.01, 0.02, 0.05)  # kv_wait's back-off while a peer is setting up (once per pair)


def namespace() -> str:
    return f"hwplace:{ray.get_runtime_context().namespace}"


def put_entry(entry: GroupEntry) -> None:
    internal_kv._internal_kv_put(f"entry:{entry.name}", pickle.dumps(entry), overwrite=True, namespace=namespace())


def delete_entry(name: str) -> None:
    internal_kv._internal_kv_del(f"entry:{name}", namespace=namespace())


def find_entry(name: str) -> GroupEntry | None:
    found = internal_kv._internal_kv_get(f"entry:{name}", namespace=namespace())
    return None if found is None else pickle.loads(found)  # type: ignore[no-any-return]


def kv_put(key: str, value: bytes) -> None:
    internal_kv._internal_kv_put(f"kv:{key}", value, overwrite=True, namespace=namespace())


def kv_wait(key: str, timeout: float) -> bytes:
    """The value of ``key``; Ray's internal store cannot block, so this backs off from 2 to 50 ms between reads.

    Used only while a communicator is set up (once per pair of workers), never on a message's path.
    """
    deadline = time.monotonic() + timeout
    for attempt in range(1 << 30):
        found = internal_kv._internal_kv_get(f"kv:{key}", namespace=namespace())
        if found is not None:
            return bytes(found)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(WAIT_STEPS[min(attempt, len(WAIT_STEPS) - 1)], left))
    raise TimeoutError(f"no process published {key!r} within {timeout:g} s")
