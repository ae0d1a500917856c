"""Notes ``hwplace plan`` and ``hwplace run`` print under the plan: what the plan implies that a reader would
not guess, such as a component whose accelerators' collective backend hwplace does not run (``hccl`` on
``npu``: its tensors travel through host memory, over gloo).

Imports the layers below.
"""

from __future__ import annotations

import importlib.util
from typing import TextIO

from hwplace.planning.component import ComponentPlacement
from hwplace.plugin.manager import PluginManager
from hwplace.plugin.session import get_plugin_manager

RUN_BACKENDS = ("gloo", "nccl")  # the collective backends hwplace's messaging runs (nccl with CUDA)
TORCH_MODULES = {"hccl": "torch_npu"}  # the torch extension a collective backend needs


def collective_notes(plan: ComponentPlacement, manager: PluginManager | None = None) -> list[str]:
    """One note per hardware type of the plan whose backend names a collective backend hwplace does not run,
    naming the components on it."""
    manager = manager or get_plugin_manager()
    backends = manager.backends()
    on: dict[str, list[str]] = {}
    for component in plan.components:
        for hardware_type in dict.fromkeys(p.hardware_type for p in plan.get_placements(component)):
            info = backends.get(hardware_type)
            collective = getattr(info.backend, "collective_backend", "gloo") if info is not None else "gloo"
            if collective not in RUN_BACKENDS:
                on.setdefault(f"{hardware_type}\0{collective}", []).append(component)
    notes = []
    for key, components in on.items():
        hardware_type, collective = key.split("\0")
        module = TORCH_MODULES.get(collective)
        missing = f" ({module} is not installed here either)" if module and importlib.util.find_spec(module) is None \
            else ""
        notes.append(f"{', '.join(components)} on {hardware_type}: the {hardware_type} backend's collective "
                     f"backend is {collective!r}, which hwplace does not run{missing}: tensors these workers send "
                     "each other (messaging, weight sync) travel through host memory, over gloo")
    return notes


def print_notes(plan: ComponentPlacement, out: TextIO) -> None:
    """The notes under the plan, each on a ``note:`` line; nothing when there are none."""
    for note in collective_notes(plan):
        out.write(f"note: {note}\n")
