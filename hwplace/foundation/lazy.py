"""Names a module gives out on first use (PEP 562): a public face, or a module that would otherwise import more
than the processes that load it use.

A worker process loads :class:`hwplace.Worker` and its hosting, and an executor plugin's worker side the names it
hosts with; each such module imports its heavier collaborators only when a name of theirs is first asked for. The
module lists those names under ``TYPE_CHECKING`` (so type checkers, and the layering checks, still see every
edge) and in ``homes``, where they load from. Imports nothing of hwplace.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def on_first_use(module: str, homes: Mapping[str, str]) -> Callable[[str], object]:
    """The ``__getattr__`` of ``module``, whose names ``homes`` says where to load from: each name maps to its
    module, ``"module:attribute"`` where the name differs there, or to the module itself when it is
    ``module.name``. A name is loaded once and then kept in ``module``."""

    def __getattr__(name: str) -> object:
        if name not in homes:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, _, attribute = homes[name].partition(":")
        loaded = importlib.import_module(home)
        value = loaded if home == f"{module}.{name}" else getattr(loaded, attribute or name)
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__
