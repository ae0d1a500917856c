"""Where a weight sync's source notes each version it publishes: a key of the rendezvous, for a restarted source,
or a resumed job's, to go on from the newest version published (versions never go back). Imports the contracts'
rendezvous.
"""

from __future__ import annotations

from hwplace.contracts.capabilities import Rendezvous


def version_key(uid: str) -> str:
    """The rendezvous key where a sync's source notes each version it publishes, for a restarted one to go on."""
    return f"wsync/{uid}/version"


def continued_version(rendezvous: Rendezvous, uid: str) -> int:
    """The newest version a sync's earlier source processes published (0 when none did)."""
    try:
        return int(rendezvous.kv_wait(version_key(uid), 0))
    except TimeoutError:
        return 0


def note_continued(rendezvous: Rendezvous, uid: str, version: int) -> None:
    """Versions of sync ``uid`` go on from ``version``, never back below one noted already."""
    rendezvous.kv_put(version_key(uid), str(max(version, continued_version(rendezvous, uid))).encode())
