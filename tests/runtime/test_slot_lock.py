"""The source's end of a slot's lock (hwplace/runtime/weight_sync/slot_lock.py); its use by the device ring and
the readers is in test_device_ring.py and test_device_share.py."""

from __future__ import annotations

from descriptors import closes_once

from hwplace.runtime.weight_sync.slot_lock import SlotLock


def test_closing_a_lock_twice_leaves_a_file_given_its_number_meanwhile_open() -> None:
    lock = SlotLock("test-close-twice")
    closes_once(lock.fd, lock.close)
