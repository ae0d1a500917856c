"""Snapshots of a running job (SPEC §12): what one holds, how it is taken and put back, and the folder that
keeps them.

A snapshot is one file, ``snapshot-<step>.pkl``, in the folder ``hwplace run --snapshots DIR`` names: the step
and the driver's ``state``, each launched group's ranks' ``state_dict()`` (where the worker class defines one),
the contents of the job's channels (:mod:`hwplace.channels.snapshot`) and the newest version of each of its weight
syncs. It is written to a temporary file in
the folder, flushed to disk, then renamed over its name, so a driver killed while writing leaves the newest
complete snapshot as it was; the newest ``keep`` are kept. Imports the layers below.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import re
import tempfile
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hwplace.channels.channel import Channel
from hwplace.channels.snapshot import ChannelContents, export_channel, restore_channel
from hwplace.contracts.capabilities import Rendezvous, require
from hwplace.contracts.executor import Executor
from hwplace.foundation.errors import ChannelClosed, ConfigError, HwplaceError
from hwplace.runtime.group import WorkerGroup
from hwplace.runtime.weight_sync.sync import WeightSync, note_version, noted_version

FORMAT = "hwplace snapshot 1"  # the first entry of every snapshot file
_NAME = re.compile(r"snapshot-(\d{12})\.pkl\Z")
_TEMPORARY = ".snapshot-"  # the prefix of a snapshot being written (left behind by a writer killed meanwhile)
STATE_DICT, LOAD_STATE_DICT = "state_dict", "load_state_dict"


@dataclass(frozen=True)
class Resumed:
    """What ``job.resumed`` holds in a resumed job: the ``step`` and driver ``state`` given to the snapshot it
    resumes from, and its file (``path``)."""

    step: int
    state: Any
    path: Path


def file_name(step: int) -> str:
    return f"snapshot-{step:012d}.pkl"


class SnapshotFolder:
    """The folder that keeps a job's snapshots: the newest ``keep`` of them; ``say`` is told of what it passes
    over (a snapshot that cannot be read)."""

    def __init__(self, path: str | os.PathLike[str], keep: int = 2, option: str = "--snapshots",
                 say: Callable[[str], None] | None = None) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError("--keep-snapshots", "is how many snapshots to keep", value=keep, allowed="1 or more")
        self.path = Path(path)
        self.keep = keep
        self.option = option
        self._say = say or (lambda line: None)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(option, "names a file, not a folder", value=str(path))

    def create(self) -> None:
        """Make the folder (its parent must exist)."""
        if not self.path.parent.is_dir():
            raise ConfigError(self.option, "names a folder whose parent does not exist", value=str(self.path),
                              allowed="a folder in an existing folder (it is made if missing)")
        self.path.mkdir(exist_ok=True)

    def steps(self) -> list[tuple[int, Path]]:
        """The snapshots there, oldest first, as (step, file)."""
        if not self.path.is_dir():
            return []
        found = [(int(match[1]), entry) for entry in self.path.iterdir() if (match := _NAME.match(entry.name))]
        return sorted(found)

    def newest(self) -> tuple[Mapping[str, Any], Path] | None:
        """The newest snapshot that reads whole, and its file; one that does not is passed over (and said)."""
        for step, path in reversed(self.steps()):
            try:
                with path.open("rb") as file:
                    record = pickle.load(file)
                if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("step") != step:
                    raise ValueError("it is not a hwplace snapshot")
            except Exception as exc:  # a torn or foreign file: the previous one is whole (atomic writes)
                self._say(f"snapshot {path} cannot be read ({type(exc).__name__}: {exc}); trying the one before it")
                continue
            return record, path
        return None

    def write(self, step: int, record: Mapping[str, Any]) -> Path:
        """Write ``record`` as the snapshot of ``step``, atomically; keep the newest ``keep``."""
        self.create()
        for entry in self.path.iterdir():  # what a writer killed meanwhile left: never a snapshot
            if entry.name.startswith(_TEMPORARY):
                with contextlib.suppress(OSError):
                    entry.unlink()
        final = self.path / file_name(step)
        descriptor, temporary = tempfile.mkstemp(prefix=_TEMPORARY, suffix=".tmp", dir=self.path)
        try:
            with os.fdopen(descriptor, "wb") as file:
                _dump(record, file, step)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        folder = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself reaches the disk
        finally:
            os.close(folder)
        for _, old in self.steps()[: -self.keep]:
            with contextlib.suppress(OSError):
                old.unlink()
        return final


def _dump(record: Mapping[str, Any], file: BinaryIO, step: int) -> None:
    """Pickle ``record`` into ``file`` as it goes (no second copy in memory); with cloudpickle when plain pickle
    refuses a class defined in the job's own file (it pickles such classes by value)."""
    try:
        pickle.Pickler(file, protocol=5).dump(record)
        return
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        first: Exception = exc
    try:
        cloudpickle = importlib.import_module("cloudpickle")  # optional: Ray brings it
    except ImportError:
        cloudpickle = None
    if cloudpickle is not None:
        file.seek(0)
        file.truncate()
        try:
            cloudpickle.dump(record, file, protocol=5)
            return
        except Exception as exc:
            first = exc
    raise HwplaceError(f"job.snapshot(step {step}): the snapshot does not pickle ({type(first).__name__}: "
                       f"{first}); the driver's state and every worker's state_dict() must pickle") from None


def step_of(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or step >= 10**12:
        raise ConfigError("step", "must be a whole number from 0 (the job's step count)", value=step)
    return step


def group_states(groups: Mapping[str, WorkerGroup]) -> dict[str, list[Any]]:
    """Each group's ranks' ``state_dict()``, in rank order, for the groups whose worker class defines one; all
    asked at once, each after the calls already made to it (plain methods run one at a time)."""
    asked = {}
    for name, group in groups.items():
        if not callable(getattr(group.worker_class, STATE_DICT, None)):
            continue
        if not callable(getattr(group.worker_class, LOAD_STATE_DICT, None)):
            raise ConfigError(f"group {name!r}", f"{group.worker_class.__name__} defines state_dict() but not "
                              "load_state_dict(state), so a resumed job could not put the state back",
                              allowed="define both, or neither")
        asked[name] = group.state_dict()
    return {name: list(handle.wait()) for name, handle in asked.items()}


def load_states(group: WorkerGroup, states: Sequence[Any]) -> None:
    """Hand each rank of a freshly launched ``group`` its state from a snapshot (``load_state_dict``)."""
    if len(states) != group.world_size:
        raise ConfigError(f"group {group.name!r}", f"has {group.world_size} ranks, but the snapshot resumed from "
                          f"holds the state of {len(states)}", allowed="resume with the placement the snapshot "
                          "was taken with")
    if not callable(getattr(group.worker_class, LOAD_STATE_DICT, None)):
        raise ConfigError(f"group {group.name!r}", f"{group.worker_class.__name__} has no load_state_dict(state), "
                          "and the snapshot resumed from holds its ranks' state")
    handles = [group.execute_on(rank).load_state_dict(state) for rank, state in enumerate(states)]
    for handle in handles:
        handle.wait()


def channel_contents(channels: Sequence[Channel], closed: bool = False) -> dict[str, ChannelContents]:
    """Each channel's contents, each one consistent cut (one step on its host); ``closed``: a channel closed
    meanwhile holds nothing to keep and is left out (else its ``ChannelClosed`` is raised)."""
    found = {}
    for channel in channels:
        try:
            found[channel.name] = export_channel(channel)
        except ChannelClosed:
            if not closed:
                raise
    return found


def refill(channel: Channel, contents: Mapping[str, ChannelContents]) -> bool:
    """Put back what the snapshot holds of the channel of ``channel``'s name; whether it held any."""
    found = contents.get(channel.name)
    if found is None:
        return False
    restore_channel(channel, found)
    return True


def sync_versions(syncs: Mapping[str, WeightSync], executor: Executor) -> dict[str, int]:
    """Each weight sync's newest version (as its source noted it), by name."""
    if not syncs:
        return {}
    rendezvous = require(executor, Rendezvous, "job.snapshot")
    return {name: noted_version(sync, rendezvous) for name, sync in syncs.items()}


def continue_versions(sync: WeightSync, executor: Executor, versions: Mapping[str, int]) -> None:
    """A resumed job's ``sync``: its source's versions go on from the one the snapshot recorded of its name."""
    if versions.get(sync.name):
        note_version(sync, require(executor, Rendezvous, "job.weight_sync"), versions[sync.name])


class MadeHere:
    """Every channel and weight sync the driver makes while a job runs (through the job or not: the session's
    :meth:`~hwplace.plugin.session.Session.on_made` hook calls :meth:`record`), for its snapshots; in a resumed job
    (``record``, the snapshot it resumed from) a channel starts with what the snapshot held of its name, once, and a
    sync's versions go on from the one it recorded."""

    def __init__(self, record: Mapping[str, Any], executor: Callable[[], Executor]) -> None:
        self.channels: dict[str, Channel] = {}
        self.syncs: dict[str, WeightSync] = {}
        self._record, self._executor = record, executor  # a job's cluster may plan only: its executor when needed
        self._refilled: set[str] = set()

    def record(self, made: Any) -> None:
        if isinstance(made, Channel):
            self.channels[made.name] = made
            self.refill(made)
        elif isinstance(made, WeightSync):
            self.syncs[made.name] = made
            if self._record.get("weight_syncs", {}).get(made.name):  # a resumed job's: its cluster can run workers
                continue_versions(made, self._executor(), self._record["weight_syncs"])

    def hook(self) -> Callable[[Any], None]:
        """:meth:`record` as the session's hook, which keeps this no longer alive than its job keeps it."""
        alive = weakref.ref(self)

        def record(made: Any) -> None:
            found = alive()
            if found is not None:
                found.record(made)

        return record

    def refill(self, channel: Channel) -> bool:
        """Put back, the first time a channel of its name is made or named here, what the snapshot held of it;
        whether it held any (a name is one channel of the cluster: never put back twice)."""
        held = channel.name in self._record.get("channels", {})
        if channel.name not in self._refilled:
            self._refilled.add(channel.name)
            refill(channel, self._record.get("channels", {}))
        return held


def snapshot_folders(snapshots: str | os.PathLike[str] | None, resume: str | os.PathLike[str] | None, keep: int,
                     say: Callable[[str], None]) -> tuple[SnapshotFolder | None, tuple[Mapping[str, Any], Path] | None]:
    """The folder a run keeps its snapshots in (``snapshots``, else ``resume``'s), and the snapshot it resumes
    from (the newest in ``resume``; ``None`` when that folder holds none yet: the run starts from the beginning).

    A ``snapshots`` folder that holds snapshots of an earlier run is refused unless the run resumes from it:
    a new run must not mix its snapshots with another's."""
    found = None
    if resume is not None:
        source = SnapshotFolder(resume, keep, "--resume", say)
        if not source.path.is_dir():
            raise ConfigError("--resume", "there is no such folder", value=os.fspath(resume),
                              allowed="the folder an earlier run kept its snapshots in (hwplace run --snapshots DIR)")
        found = source.newest()
        say(f"resume: {source.path} holds no snapshot yet; starting from the beginning" if found is None else
            f"resuming from {found[1]} (step {found[0]['step']})")
    if snapshots is None and resume is None:
        return None, None
    folder = SnapshotFolder(snapshots if snapshots is not None else resume, keep, say=say)  # type: ignore[arg-type]
    earlier = folder.steps()
    if earlier and (resume is None or folder.path.resolve() != Path(resume).resolve()):
        raise ConfigError("--snapshots", f"{folder.path} holds snapshots of an earlier run (the newest of step "
                          f"{earlier[-1][0]})", allowed=f"continue that run with --resume {folder.path}, or name "
                          "another folder")
    folder.create()
    return folder, found
