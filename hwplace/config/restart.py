"""Restart in place (SPEC §12): the :class:`Restart` policy a group is launched with, and the ``restart:`` section.

``launch(..., restart=hwplace.Restart(max_restarts=3, scope="rank"))`` or, in a job file, ``restart: {rollout:
{max_restarts: 3}, trainer: {max_restarts: 2, scope: group}}`` (``hwplace run`` hands each component's policy to
``Job.launch``). A mistake is a :class:`~hwplace.ConfigError` naming its key path. What a policy does at run time
is :mod:`hwplace.runtime.restarts`. Imports the layers below and :mod:`hwplace.config.checks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.config.checks import check_keys, component
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.frozen import FrozenDict
from hwplace.foundation.wording import did_you_mean, safe_repr

SCOPES = ("rank", "group")
KEYS = ("max_restarts", "scope")  # the keys of one restart: entry


@dataclass(frozen=True)
class Restart:
    """How a group's dead processes are started again in place.

    ``max_restarts``: how many restarts the group may use (each rank its own count with ``scope="rank"``; the
    group one count with ``scope="group"``); 0 restarts nothing. ``scope="rank"`` starts only the dead rank
    again; ``scope="group"`` stops and starts every rank together, for groups bound by a collective.
    """

    max_restarts: int
    scope: str = "rank"

    def __post_init__(self) -> None:
        check_restart(self.max_restarts, self.scope, "restart")

    def describe(self) -> str:
        """``"3 restarts per rank"`` / ``"2 restarts of the whole group"``: for ``hwplace plan``."""
        count = f"{self.max_restarts} restart{'' if self.max_restarts == 1 else 's'}"
        return f"{count} per rank" if self.scope == "rank" else f"{count} of the whole group"


def check_restart(max_restarts: Any, scope: Any, path: str) -> None:
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"{path}.max_restarts", "is how many times a dead process may be started again",
                          value=max_restarts, allowed="a whole number, 0 or more")
    if scope not in SCOPES:
        raise ConfigError(f"{path}.scope", f"{safe_repr(scope)} is not a restart scope"
                          f"{did_you_mean(scope, SCOPES) if isinstance(scope, str) else ''}",
                          allowed="'rank' (the dead rank alone) or 'group' (every rank of the group together)")


def parse_restart(section: Any, components: Sequence[str]) -> Mapping[str, Restart]:
    """The ``restart:`` section (``{component: {max_restarts: 3, scope: rank}}``), checked against the config's
    components; a ``ConfigError`` naming the key path otherwise."""
    if section is None:
        return FrozenDict()
    if not isinstance(section, Mapping):
        raise ConfigError("restart", "is a mapping of components to {max_restarts, scope}", value=section,
                          allowed="restart: {rollout: {max_restarts: 3}}")
    policies = {}
    for name, entry in section.items():
        path = f"restart.{name}"
        component(name, path, components)
        if not isinstance(entry, Mapping):
            raise ConfigError(path, "is a mapping with max_restarts (and scope)", value=entry,
                              allowed="{max_restarts: 3, scope: rank}")
        check_keys(entry, KEYS, path)
        if "max_restarts" not in entry:
            raise ConfigError(f"{path}.max_restarts", "is missing", allowed="a whole number, 0 or more")
        check_restart(entry["max_restarts"], entry.get("scope", "rank"), path)
        policies[name] = Restart(entry["max_restarts"], entry.get("scope", "rank"))
    return FrozenDict(policies)
