"""How a process cluster's channels carry large items: stashed, pickled, in the driver's hub (the channels'
host), until a consumer fetches them. Imports the contracts, the foundation and this package."""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from typing import Any

from hwplace.contracts.capabilities import ObjectStore
from hwplace.foundation.errors import ChannelLost, HwplaceError
from hwplace.testing.processes.service import hub_at
from hwplace.testing.processes.wire import Address


class ProcessObjectStore(ObjectStore):
    """The stash of channel ``name`` in the hub at ``address``; it pickles, and works in any of the cluster's
    processes."""

    def __init__(self, address: Address, authkey: bytes, name: str) -> None:
        self._address = address
        self._authkey = authkey
        self._name = name

    def stash(self, item: Any) -> bytes:
        key = os.urandom(16)
        self._call("stash", key, pickle.dumps(item, protocol=5))
        return key

    def fetch(self, keys: Sequence[bytes], keep: bool = False) -> list[Any]:
        return [pickle.loads(data) for data in self._call("fetch", list(keys), keep)]

    def _call(self, op: str, *args: Any) -> Any:
        try:
            return hub_at(self._address, self._authkey).call(op, self._name, *args)
        except ChannelLost:
            raise
        except HwplaceError as exc:
            raise ChannelLost(f"channel {self._name!r}: {exc}") from None
