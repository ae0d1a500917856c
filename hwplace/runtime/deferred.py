"""What :class:`~hwplace.runtime.worker.Worker` uses only when a worker asks for it, loaded then (PEP 562).

A worker process unpickles its class, and with it ``Worker``; every process of a group pays for what that
imports before it answers. Channels (and through them the cluster and its config), the group launcher (and the
placement strategies), messaging and turns are what a worker may never use, so ``Worker`` reaches them through
this module: ``deferred.Channel`` loads :mod:`hwplace.channels.channel` the first time a worker opens a
channel. Imports the layers below and :mod:`hwplace.runtime.group`, the messaging room's ``messenger`` and the
turns room's ``client``, each on first use (:mod:`hwplace.foundation.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwplace.foundation.lazy import on_first_use

if TYPE_CHECKING:  # what __getattr__ below loads on first use (_HOMES says from where), as type checkers see it
    from hwplace.channels.channel import Channel
    from hwplace.runtime.group import GroupLauncher
    from hwplace.runtime.messaging.messenger import messenger
    from hwplace.runtime.turns.client import Turn, Turns

_HOMES: dict[str, str] = {
    "Channel": "hwplace.channels.channel",
    "GroupLauncher": "hwplace.runtime.group",
    "messenger": "hwplace.runtime.messaging.messenger",
    "Turn": "hwplace.runtime.turns.client",
    "Turns": "hwplace.runtime.turns.client",
}

if not TYPE_CHECKING:
    __getattr__ = on_first_use(__name__, _HOMES)

__all__ = ["Channel", "GroupLauncher", "Turn", "Turns", "messenger"]
