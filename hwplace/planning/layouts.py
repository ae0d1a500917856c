"""The records of the placement search (:mod:`hwplace.planning.search`): a planned cell and its components
(:class:`Cell`, :class:`Slot`), a layout's best plan (:class:`Candidate`) and the whole result
(:class:`SearchResult`), which writes a plan as the ``component_placement:`` to paste. Imports the layers below
and :mod:`hwplace.planning.cost` and :mod:`hwplace.planning.profile`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hwplace.planning.cost import SyncCost
from hwplace.planning.profile import Point


@dataclass(frozen=True)
class Slot:
    """A component in a planned cell: its processes, each of ``devices_per_process`` accelerators, and the
    profile point that predicts it."""

    component: str
    processes: int
    devices_per_process: int
    point: Point


@dataclass(frozen=True)
class Cell:
    """A cell of a plan: components on accelerators ``first`` to ``first + size - 1`` of group ``cluster``,
    taking turns; ``seconds`` per step with the syncs that touch it, ``peak`` memory of each of its accelerators
    (``None``: no figure known)."""

    slots: tuple[Slot, ...]
    first: int
    size: int
    seconds: float
    peak: int | None

    @property
    def components(self) -> tuple[str, ...]:
        return tuple(slot.component for slot in self.slots)

    def placements(self) -> dict[str, str]:
        """Each component's placement string: one key for the cell where its processes are alike."""
        span = f"{self.first}-{self.first + self.size - 1}" if self.size > 1 else str(self.first)
        text = {s.component: span if s.devices_per_process == 1 else
                f"{span}:{'0' if s.processes == 1 else f'0-{s.processes - 1}'}" for s in self.slots}
        if len(set(text.values())) == 1:
            return {",".join(self.components): text[self.slots[0].component]}
        return text


@dataclass(frozen=True)
class Candidate:
    """A layout and its best plan (``None`` with ``reason`` when none could be predicted)."""

    layout: tuple[tuple[str, ...], ...]
    cells: tuple[Cell, ...] | None
    step_seconds: float | None
    syncs: tuple[SyncCost, ...] = ()
    reason: str | None = None

    @property
    def label(self) -> str:
        """``"trainer,rollout | reward"``: who colocates with whom."""
        return " | ".join(",".join(cell) for cell in self.layout)

    @property
    def peak(self) -> int | None:
        known = [c.peak for c in self.cells or () if c.peak is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class SearchResult:
    """Every layout, the predicted ones fastest first, then those the profile could not predict."""

    candidates: tuple[Candidate, ...]
    devices: int
    description: str
    fixed: Mapping[str, str]  # component -> its written placement entry, as YAML

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def component_placement(self, candidate: Candidate | None = None) -> str:
        """The ``component_placement:`` of a predicted candidate (the best by default), as YAML to paste."""
        chosen = candidate or self.best
        assert chosen.cells is not None
        lines = ["component_placement:"]
        for cell in chosen.cells:
            lines += [f"  {key}: {value}" for key, value in cell.placements().items()]
        lines += [f"  {key}: {value}" for key, value in self.fixed.items()]
        return "\n".join(lines) + "\n"



def written_entry(placement: str, groups: tuple[str, ...]) -> str:
    """A component's entry as written in the config, in YAML's flow form: ``{node_group: node, placement: "0:0-1"}``."""
    return f'{{node_group: {",".join(groups)}, placement: "{placement}"}}'
