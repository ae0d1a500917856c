"""What an executor is: the runtime that discovers a cluster's nodes and runs workers on them.

The built-in one is Ray (``plugins/ray``); ``cluster.executor`` in the config names the one to use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplace.hardware import PLUGIN_NAME
from hwplace.wording import safe_repr

if TYPE_CHECKING:
    from hwplace.cluster import Node
    from hwplace.config import ClusterConfig
    from hwplace.plugin_manager import PluginManager

class Executor:
    """Base class of an executor plugin; subclass it and return an instance from ``hwplace_executors()``.

    An executor imports its runtime (Ray, ...) only when one of its methods is called, never at import.
    """

    name: ClassVar[str] = ""

    def discover(self, config: ClusterConfig, plugin_manager: PluginManager) -> list[Node]:
        """Connect to (or start) the runtime ``config.address`` names and return its live nodes, in rank order.

        Each node's hardware is what every registered backend detects on that node, plus the devices
        ``config`` declares for it. Fewer live nodes than ``config.num_nodes`` raises ``ConfigError``.
        """
        raise NotImplementedError(f"{type(self).__name__}.discover")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def check_executor(executor: object) -> str | None:
    """Say what is wrong with an executor object a plugin returned, or ``None`` when it is usable."""
    if not isinstance(executor, Executor):
        return f"{safe_repr(executor)} is not a hwplace.Executor"
    try:
        name = executor.name
    except Exception as exc:
        return f"reading {type(executor).__name__}.name raised {safe_repr(exc)}"
    if not isinstance(name, str) or not PLUGIN_NAME.match(name):
        return (f"{type(executor).__name__}.name is {safe_repr(name)}; an executor name is 1 to 64 lower-case "
                "letters, digits, '.', '_' and '-'")
    return None
