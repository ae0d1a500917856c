"""The placement string: ``resource_ranks[:process_ranks]`` entries joined by commas.

:func:`parse_placement` checks the syntax alone; :func:`resolve_placement` checks the entries against the
number of resources of a node group and says which resources each process gets.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hwplace.foundation.errors import PlacementError

MAX_PROCESSES = 1_000_000
MAX_DIGITS = 18  # no rank is longer; bounds the cost of converting what a user typed
_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+))?\Z")
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Entry:
    """One ``resource_ranks[:process_ranks]`` entry; ``span`` locates it in the placement string."""

    resources: tuple[int, int] | None  # inclusive; None means "all"
    processes: tuple[int, int] | None  # inclusive; None means "as many as resources, continuing"
    span: tuple[int, int]


@dataclass(frozen=True)
class ResolvedEntry:
    """An entry with both ranges known: resources ``first..last`` serve processes ``first..last``."""

    entry: Entry
    first_resource: int
    last_resource: int
    first_process: int
    last_process: int

    @property
    def num_resources(self) -> int:
        return self.last_resource - self.first_resource + 1

    @property
    def num_processes(self) -> int:
        return self.last_process - self.first_process + 1

    def resource_lists(self) -> Iterator[range]:
        """The resource ranks of each process of this entry, in process order."""
        r, p, first = self.num_resources, self.num_processes, self.first_resource
        if r >= p:
            step = r // p
            for k in range(p):
                yield range(first + k * step, first + (k + 1) * step)
        else:
            share = p // r
            for k in range(p):
                resource = first + k // share
                yield range(resource, resource + 1)

    def resource_ids(self) -> list[tuple[int, ...]]:
        """The resource ranks of each process of this entry, in process order, as tuples: what
        :meth:`resource_lists` yields, built in bulk (planning makes one per process)."""
        r, p, first = self.num_resources, self.num_processes, self.first_resource
        if r == p:
            return [(i,) for i in range(first, first + p)]
        if r > p:
            step = r // p
            return [tuple(range(start, start + step)) for start in range(first, first + p * step, step)]
        share = p // r
        return [one for one in [(i,) for i in range(first, first + r)] for _ in range(share)]


def placement_text(value: object) -> str:
    """The placement string of a YAML value: a string as it is, an integer as its decimal string."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise PlacementError(
            f"a placement is a string such as '0-3' or '0-1:0-3,4-7', or an integer; got {value!r}"
        )
    return str(value)


def parse_range(part: str) -> tuple[int, int] | None:
    """``'a'`` or ``'a-b'`` (whitespace ignored) as an inclusive pair; ``None`` when it is not one.

    A descending range raises :class:`ValueError`.
    """
    match = _RANGE.match(_WHITESPACE.sub("", part))
    if match is None:
        return None
    for digits in match.groups(default=""):
        if len(digits) > MAX_DIGITS:
            raise ValueError(f"{digits[:8]}... has {len(digits)} digits; a rank has at most {MAX_DIGITS}")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if last < first:
        raise ValueError(f"range {first}-{last} is descending; write {last}-{first}")
    return first, last


def parse_placement(text: str) -> list[Entry]:
    """Split a placement string into entries, checking the syntax of each."""
    entries: list[Entry] = []
    start = 0
    for raw in text.split(","):
        end = start + len(raw)
        stripped = raw.strip()
        lead = len(raw) - len(raw.lstrip())
        if stripped:
            span = (start + lead, start + lead + len(stripped))
        else:  # an empty entry: point at the commas around it
            span = (max(start - 1, 0), min(end + 1, len(text)))
        entries.append(_parse_entry(stripped, text, span))
        start = end + 1
    return entries


def _parse_entry(entry: str, text: str, span: tuple[int, int]) -> Entry:
    def fail(reason: str) -> PlacementError:
        return PlacementError(reason, text=text, span=span)

    if not entry:
        raise fail("empty entry; entries are 'resource_ranks[:process_ranks]' separated by single commas")
    parts = entry.split(":")
    if len(parts) > 2:
        raise fail("more than one ':'; an entry is 'resource_ranks[:process_ranks]'")
    resources = _parse_part(parts[0], "resource ranks", fail, allow_all=True)
    processes = _parse_part(parts[1], "process ranks", fail, allow_all=False) if len(parts) == 2 else None
    return Entry(resources, processes, span)


def _parse_part(
    part: str, what: str, fail: Callable[[str], PlacementError], *, allow_all: bool
) -> tuple[int, int] | None:
    compact = _WHITESPACE.sub("", part)
    if compact.lower() == "all":
        if allow_all:
            return None
        raise fail(f"{what} cannot be 'all'; give a range such as 0-7")
    try:
        parsed = parse_range(compact)
    except ValueError as exc:
        raise fail(f"{what}: {exc}") from None
    if parsed is None:
        allowed = "'a', 'a-b' or 'all'" if allow_all else "'a' or 'a-b'"
        shown = f"{part.strip()!r}" if part.strip() else "nothing"
        raise fail(f"{what} are {shown}; allowed: {allowed} with non-negative integers")
    return parsed


def resolve_placement(text: str, entries: list[Entry], num_resources: int, resources: str) -> list[ResolvedEntry]:
    """Check entries against ``num_resources`` and number their processes.

    ``resources`` describes what the ranks index, for messages ("the 16 accelerators of group 'cluster'").
    """
    resolved: list[ResolvedEntry] = []
    next_process = 0
    previous: ResolvedEntry | None = None
    for entry in entries:

        def fail(reason: str, entry: Entry = entry) -> PlacementError:
            return PlacementError(reason, text=text, span=entry.span)

        if num_resources == 0:
            raise fail(f"there are no resources to place on: {resources}")
        first, last = entry.resources if entry.resources is not None else (0, num_resources - 1)
        if last >= num_resources:
            raise fail(f"resource rank {last} does not exist: {resources} (ranks 0-{num_resources - 1})")
        if previous is not None and first <= previous.last_resource:
            raise fail(
                f"resources {first}-{last} overlap or precede the previous entry's "
                f"{previous.first_resource}-{previous.last_resource}; "
                "entries must be in ascending resource order and may not overlap"
            )
        count = last - first + 1
        if entry.processes is None:
            p_first, p_last = next_process, next_process + count - 1
        else:
            p_first, p_last = entry.processes
            if p_first != next_process:
                raise fail(
                    f"process ranks start at {p_first} but must continue at {next_process}: a component's "
                    "processes are 0..N-1, each exactly once, in ascending entry order"
                )
        processes = p_last - p_first + 1
        if count % processes and processes % count:
            raise fail(
                f"{count} resources and {processes} processes: one count must divide the other "
                "(several resources per process, or several processes per resource)"
            )
        if p_last >= MAX_PROCESSES:
            raise fail(f"process rank {p_last} is too large; a component has at most {MAX_PROCESSES} processes")
        previous = ResolvedEntry(entry, first, last, p_first, p_last)
        resolved.append(previous)
        next_process = p_last + 1
    return resolved
