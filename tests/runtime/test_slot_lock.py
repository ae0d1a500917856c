"""The source's end of a slot's lock (hwplace/runtime/weight_sync/slot_lock.py); its use by the device ring and
the readers is in test_device_ring.py and test_device_share.py."""

from __future__ import annotations

import os

from hwplace.runtime.weight_sync.slot_lock import SlotLock


def test_closing_a_lock_twice_leaves_a_file_given_its_number_meanwhile_open() -> None:
    other = os.open(os.devnull, os.O_RDONLY)  # opened first: a number of its own
    try:
        lock = SlotLock("test-close-twice")
        number = lock.fd
        lock.close()
        os.dup2(other, number)  # another file of this process now has the number the lock had
        try:
            lock.close()
            os.fstat(number)  # still open
        finally:
            os.close(number)
    finally:
        os.close(other)
