"""What :class:`~hwplace.plugin.session.Session` uses only when asked for it, loaded then (PEP 562).

Every worker process loads the session at start-up (it holds the worker's context), but a worker that never looks
up its executor by name never needs the plugin manager (and through it the hooks, detection and the plugin
records) or the capability check (and through it the registry's records). The session reaches them through this
module: ``deferred.PluginManager`` loads :mod:`hwplace.plugin.manager` the first time a process asks for its
manager. Imports the contracts' capabilities and :mod:`hwplace.plugin.manager`, each on first use
(:mod:`hwplace.foundation.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwplace.foundation.lazy import on_first_use

if TYPE_CHECKING:  # what __getattr__ below loads on first use (_HOMES says from where), as type checkers see it
    from hwplace.contracts.capabilities import require
    from hwplace.plugin.manager import PluginManager

_HOMES: dict[str, str] = {
    "PluginManager": "hwplace.plugin.manager",
    "require": "hwplace.contracts.capabilities",
}

if not TYPE_CHECKING:
    __getattr__ = on_first_use(__name__, _HOMES)

__all__ = ["PluginManager", "require"]
