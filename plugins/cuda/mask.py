"""Reading an inherited ``CUDA_VISIBLE_DEVICES`` the way CUDA reads it.

A batch scheduler (Slurm, a container runtime, an outer launcher) may already have restricted this node's
processes to some GPUs. CUDA's rules, as NVIDIA documents them and as PyTorch mirrors them in
``torch.cuda._parse_visible_devices`` for its NVML-based device count:

- unset: every GPU, in order; set but empty: none;
- the first entry decides the form of the whole list: ``GPU-...`` a list of GPU UUIDs, ``MIG-...`` a list
  of MIG device ids, anything else a list of indices;
- an index is read like ``strtoul`` (leading blanks, an optional sign, the digits at the start: ``1gpu2``
  reads as 1); a UUID may be abbreviated to any prefix that names one GPU (``GPU-8932f937``);
- the list stops at the first entry that is not valid (not a number, negative, an index beyond the GPUs, an
  entry of another form, a UUID that matches no GPU or more than one): only the GPUs before it are visible;
- a GPU named twice makes the whole list empty: CUDA then shows no GPU at all.

Indices count GPUs in PCI bus order, the order ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` gives them. This module
only reads the text against the GPUs it is given; it touches no library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

VARIABLE = "CUDA_VISIBLE_DEVICES"
MAX_SHOWN = 80  # characters of a mask quoted in a message

Form = Literal["all", "index", "uuid", "mig"]


@dataclass(frozen=True)
class MigIds:
    """What a mask can name a MIG device by: its ``MIG-`` UUID, or its parent, GPU instance and compute instance."""

    uuid: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None


@dataclass(frozen=True)
class GpuIds:
    """What a mask can name one GPU by (besides its position in PCI bus order) and the MIG devices it holds."""

    uuid: str | None
    migs: tuple[MigIds, ...] = ()


@dataclass(frozen=True)
class Selection:
    """The GPUs a mask leaves visible, in mask order, and what went wrong reading it.

    Each target is ``(gpu, mig)``: the GPU's position in PCI bus order, and the position of one of its MIG
    devices in ``GpuIds.migs`` or ``None`` for the GPU as a whole. ``problem`` says why the list stopped
    early (or is empty); it is ``""`` when every entry was used.
    """

    form: Form
    targets: tuple[tuple[int, int | None], ...]
    problem: str = ""


def quoted(text: str) -> str:
    """The mask as a message shows it: quoted, and shortened when long."""
    return repr(text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "...")


def _strtoul(entry: str) -> str:
    """The index an entry gives, as a canonical digit string, or why it gives none.

    Read as ``strtoul`` reads it: leading blanks, an optional sign, then the digits at the start.
    """
    text = entry.strip()
    sign = text[:1] if text[:1] in ("+", "-") else ""
    rest = text[len(sign):]
    digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
    if not digits:
        return "is not a GPU index, UUID or MIG id"
    value = digits.lstrip("0") or "0"
    return "is a negative index" if sign == "-" and value != "0" else value


def _stopped(text: str, position: int, entry: str, why: str, kept: int) -> str:
    before = f"only the {kept} GPU{'s' if kept != 1 else ''} before it {'are' if kept != 1 else 'is'} visible" \
        if kept else "no GPU is visible"
    return (f"{VARIABLE}={quoted(text)}: entry {position + 1} ({quoted(entry)}) {why}; CUDA stops at the first "
            f"invalid entry, so {before}")


def _twice(text: str, what: str) -> str:
    return f"{VARIABLE}={quoted(text)} names {what} twice, and CUDA then shows no GPU at all"


def _match(prefix: str, names: Sequence[str | None]) -> list[int]:
    return [i for i, name in enumerate(names) if name is not None and name.startswith(prefix)]


def _by_index(text: str, entries: list[str], count: int) -> Selection:
    values: list[str] = []
    stop: tuple[int, str] | None = None
    for position, entry in enumerate(entries):
        value = _strtoul(entry)
        if value in values:
            return Selection("index", (), _twice(text, f"GPU {value}"))
        if not value.isdigit():
            stop = position, value
            break
        values.append(value)
    for position, value in enumerate(values):
        if len(value) > 6 or int(value) >= count:
            shown = value if len(value) <= 12 else value[:9] + "..."
            stop = position, f"is GPU index {shown}, but this node has " + (
                f"{count} GPU{'s' if count != 1 else ''} (0 to {count - 1})" if count else "no GPU")
            values = values[:position]
            break
    targets = tuple((int(v), None) for v in values)
    problem = _stopped(text, stop[0], entries[stop[0]], stop[1], len(targets)) if stop else ""
    return Selection("index", targets, problem)


def _by_uuid(text: str, entries: list[str], gpus: Sequence[GpuIds]) -> Selection:
    names: list[str] = []
    stop: tuple[int, str] | None = None
    for position, entry in enumerate(entries):
        if entry in names:
            return Selection("uuid", (), _twice(text, repr(entry)))
        if not entry.startswith("GPU-"):
            stop = position, "is not a GPU UUID, and a list that starts with a GPU UUID holds only GPU UUIDs"
            break
        names.append(entry)
    uuids = [gpu.uuid for gpu in gpus]
    targets: list[tuple[int, int | None]] = []
    for position, name in enumerate(names):
        found = _match(name, uuids)
        if len(found) != 1:
            stop = position, ("matches no GPU here" if not found else
                              f"is the start of {len(found)} GPUs' UUIDs, so it names none of them")
            break
        if (found[0], None) in targets:
            return Selection("uuid", (), _twice(text, f"the GPU {uuids[found[0]]}"))
        targets.append((found[0], None))
    problem = _stopped(text, stop[0], entries[stop[0]], stop[1], len(targets)) if stop else ""
    return Selection("uuid", tuple(targets), problem)


def _legacy_mig(entry: str, gpus: Sequence[GpuIds]) -> tuple[int, int] | str:
    """``MIG-GPU-<uuid>/<gpu instance>/<compute instance>``, the form drivers before R470 used."""
    parent, _, ids = entry[len("MIG-"):].partition("/")
    gi, _, ci = ids.partition("/")
    if not (gi.isascii() and gi.isdigit() and ci.isascii() and ci.isdigit() and len(gi) <= 6 and len(ci) <= 6):
        return "is not a MIG id (MIG-GPU-<uuid>/<gpu instance>/<compute instance>)"
    found = _match(parent, [gpu.uuid for gpu in gpus])
    if len(found) != 1:
        return f"names {'no GPU here' if not found else f'{len(found)} GPUs'} as its parent"
    migs = gpus[found[0]].migs
    slots = [i for i, mig in enumerate(migs) if (mig.gpu_instance_id, mig.compute_instance_id) == (int(gi), int(ci))]
    if not slots:
        return f"names GPU instance {int(gi)}, compute instance {int(ci)}, which its GPU does not have"
    return found[0], slots[0]


def _by_mig(text: str, entries: list[str], gpus: Sequence[GpuIds]) -> Selection:
    names: list[str] = []
    stop: tuple[int, str] | None = None
    for position, entry in enumerate(entries):
        if entry in names:
            return Selection("mig", (), _twice(text, repr(entry)))
        if not entry.startswith("MIG-"):
            stop = position, "is not a MIG id, and a list that starts with a MIG id holds only MIG ids"
            break
        names.append(entry)
    owners = [(g, m) for g, gpu in enumerate(gpus) for m in range(len(gpu.migs))]
    uuids = [gpus[g].migs[m].uuid for g, m in owners]
    targets: list[tuple[int, int | None]] = []
    for position, name in enumerate(names):
        target: tuple[int, int] | str
        if name.startswith("MIG-GPU-"):
            target = _legacy_mig(name, gpus)
        else:
            found = _match(name, uuids)
            target = owners[found[0]] if len(found) == 1 else "matches no MIG device here" if not found else \
                f"is the start of {len(found)} MIG devices' UUIDs, so it names none of them"
        if isinstance(target, str):
            stop = position, target
            break
        if target in targets:
            return Selection("mig", (), _twice(text, f"the MIG device {name}"))
        targets.append(target)
    problem = _stopped(text, stop[0], entries[stop[0]], stop[1], len(targets)) if stop else ""
    return Selection("mig", tuple(targets), problem)


def select(text: str | None, gpus: Sequence[GpuIds]) -> Selection:
    """The GPUs (or MIG devices) that ``CUDA_VISIBLE_DEVICES=text`` leaves visible among ``gpus``.

    ``gpus`` are the node's GPUs in PCI bus order; ``text`` is ``None`` when the variable is unset. Never
    raises: a malformed mask is read as CUDA reads it, and ``Selection.problem`` says what was dropped.
    """
    if text is None:
        return Selection("all", tuple((i, None) for i in range(len(gpus))))
    entries = text.split(",")
    if text.startswith("GPU-"):
        return _by_uuid(text, entries, gpus)
    if text.startswith("MIG-"):
        return _by_mig(text, entries, gpus)
    if not text.strip():
        return Selection("index", (), f"{VARIABLE}={quoted(text)} is set and empty: CUDA shows no GPU (Ray sets it "
                                      "so in a task or actor without GPUs, unless "
                                      "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1)")
    return _by_index(text, entries, len(gpus))
