"""The ``resources:`` section of a job file, parsed into :class:`ComponentResources` records (SPEC §13).

Each entry names a component of ``cluster.component_placement`` and what one of its processes holds on each
accelerator it owns: ``{trainer: {memory: {train: 50GiB, idle: 40GiB, offloaded: 1GiB}}}``. Figures are read
with :func:`~hwplace.foundation.sizes.parse_size`; a mistake is a :class:`~hwplace.ConfigError` naming its key
path (``resources.trainer.memory.train``). The rule that adds the figures up per device is
:mod:`hwplace.planning.memory`. Imports the layers below and :mod:`hwplace.config.checks`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwplace.config.checks import LABEL, check_keys, component, mapping
from hwplace.foundation.errors import ConfigError
from hwplace.foundation.frozen import FrozenDict
from hwplace.foundation.sizes import parse_size

KEYS = ("memory",)  # the keys of one resources entry; profiles come later (SPEC §13)
OFFLOADED = "offloaded"
"""The reserved phase held after ``offload()`` while another component of the device has the turn."""
IDLE = "idle"
"""The reserved phase held while another component of the device has the turn, not offloaded."""
RESERVED_PHASES = (OFFLOADED, IDLE)


@dataclass(frozen=True)
class ComponentResources:
    """What one process of ``component`` holds on each accelerator it owns: ``memory`` maps each phase to
    bytes, in the order written (``offloaded`` and ``idle`` are reserved; every other phase is a working one)."""

    component: str
    memory: Mapping[str, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", FrozenDict(self.memory))
        if not self.working_phases:
            raise ConfigError(f"resources.{self.component}.memory", "declares no working phase",
                              allowed=f"a phase other than {' and '.join(RESERVED_PHASES)}, such as train: 50GiB")

    @property
    def working_phases(self) -> dict[str, int]:
        """The working phases and their figures: every phase but ``offloaded`` and ``idle``."""
        return {phase: amount for phase, amount in self.memory.items() if phase not in RESERVED_PHASES}

    @property
    def peak_phase(self) -> tuple[str, int]:
        """The largest working phase and its figure (the first written of equal ones)."""
        phases = self.working_phases
        name = max(phases, key=lambda phase: phases[phase])
        return name, phases[name]

    @property
    def takes_turns(self) -> bool:
        """Whether it declares what it holds while another component works (``offloaded`` or ``idle``)."""
        return any(phase in self.memory for phase in RESERVED_PHASES)

    @property
    def meanwhile(self) -> tuple[str, int]:
        """The phase held, and its figure, while another component of the device works: ``offloaded`` if
        declared, else ``idle`` if declared, else the largest working phase (it does not take turns)."""
        for phase in RESERVED_PHASES:
            if phase in self.memory:
                return phase, self.memory[phase]
        return self.peak_phase


def parse_resources(section: Any, components: Sequence[str]) -> tuple[ComponentResources, ...]:
    """The ``resources:`` section, one record per entry in the order written; ``()`` when absent.

    Entries are checked against ``components`` (those of ``cluster.component_placement``); every figure must
    be an amount of memory (:func:`~hwplace.foundation.sizes.parse_size`).
    """
    if section is None:
        return ()
    entries = mapping(section, "resources")
    records = []
    for name, entry in entries.items():
        path = f"resources.{name}"
        component(name, path, components)
        entry = mapping(entry, path)
        check_keys(entry, KEYS, path)
        if "memory" not in entry:
            raise ConfigError(path, "declares nothing", allowed="memory: {PHASE: AMOUNT, ...}, such as "
                              "memory: {train: 50GiB, offloaded: 1GiB}")
        records.append(ComponentResources(name, parse_memory(entry["memory"], f"{path}.memory")))
    return tuple(records)


def parse_memory(value: Any, path: str) -> dict[str, int]:
    """A mapping of phases to amounts (one ``memory:`` of the section, or of a profile's point), checked: phase
    names, reserved names misspelt, amounts."""
    phases = mapping(value, path)
    if not phases:
        raise ConfigError(path, "is empty", allowed="PHASE: AMOUNT entries, such as train: 50GiB")
    memory: dict[str, int] = {}
    for phase, amount in phases.items():
        if not isinstance(phase, str) or not LABEL.match(phase):
            raise ConfigError(f"{path}.{phase}", "is not a phase name", value=phase,
                              allowed="1 to 128 letters, digits, '_', '.' and '-'")
        near = difflib.get_close_matches(phase.lower(), RESERVED_PHASES, n=1, cutoff=0.85)
        if near and phase != near[0]:
            raise ConfigError(f"{path}.{phase}", f"is so close to the reserved phase {near[0]!r} that it is taken "
                              "for a misspelling", allowed=f"{near[0]!r} itself, or a working phase named otherwise")
        memory[phase] = parse_size(amount, f"{path}.{phase}")
    return memory
