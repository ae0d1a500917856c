"""Jobs: a config whose ``job.entrypoint`` names the function that runs it, as ``hwplace run`` starts it.

The config is parsed once into a :class:`~hwplace.JobConfig` (or given as one), which the offline check, the
``Cluster`` and ``ComponentPlacement`` all receive. The entry point is called with a :class:`Job`: the config,
the connected cluster and its component placement, with helpers to read the job's own settings and to launch
components.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import runpy
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO, TypeVar

from hwplace.application.group_failure import GroupFailed, ended_by_group_failure
from hwplace.application.notes import print_notes
from hwplace.application.report import print_cluster, print_plan, print_sync_plans, sync_plans
from hwplace.application.snapshots import (
    FORMAT,
    MadeHere,
    Resumed,
    SnapshotFolder,
    channel_contents,
    group_states,
    load_states,
    snapshot_folders,
    step_of,
    sync_versions,
)
from hwplace.channels.channel import Channel
from hwplace.config.job_config import JobConfig, parse_job_config
from hwplace.config.restart import Restart
from hwplace.contracts.capabilities import Leases
from hwplace.foundation.errors import ConfigError, HwplaceError, PlacementError, WorkerError
from hwplace.foundation.wording import did_you_mean, plural, safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.inventory.local import local_cluster
from hwplace.inventory.offline import fake_cluster
from hwplace.planning.component import ComponentPlacement
from hwplace.plugin.session import session
from hwplace.runtime.group import WorkerGroup, group_record
from hwplace.runtime.weight_sync.sync import WeightSync
from hwplace.runtime.worker import Worker

ENTRYPOINT_FORMS = ("'file.py:function' (a path relative to the config's folder) or 'package.module:function' "
                    "(an installed module)")
ENTRYPOINT_KEY = "entrypoint"
NAME_KEY = "name"  # the job's name on a shared cluster (hwplace status, lease conflicts)
RESERVED_KEYS = (ENTRYPOINT_KEY, NAME_KEY)  # hwplace's keys of job:, not the job's own settings

W = TypeVar("W", bound=Worker)


class Job:
    """What a job's entry point receives: ``config`` (the whole file, a plain dict of its own), ``cluster`` and
    ``placement``, plus helpers.

    ``snapshots`` is the folder :meth:`snapshot` writes to (``hwplace run --snapshots DIR``), ``resume_from`` the
    snapshot record (and its file) a resumed job continues from: ``job.resumed`` then says its step and state.
    """

    def __init__(self, config: Mapping[str, Any] | JobConfig, cluster: Cluster, placement: ComponentPlacement, *,
                 snapshots: SnapshotFolder | None = None,
                 resume_from: tuple[Mapping[str, Any], Path] | None = None) -> None:
        self.config = config.to_dict() if isinstance(config, JobConfig) else dict(config)
        self.cluster = cluster
        self.placement = placement
        self.groups: dict[str, WorkerGroup] = {}  # launched through this job, in launch order
        self.channels: dict[str, Channel] = {}  # created through job.channel, by name
        self.syncs: dict[str, WeightSync] = {}  # created through job.weight_sync, by name
        self.snapshots = snapshots
        self._record: Mapping[str, Any] = resume_from[0] if resume_from else {}
        self._made = MadeHere(self._record, cluster.executor)  # every channel and sync this driver makes
        self._stop_recording = session().on_made(self._made.hook())
        self.resumed = Resumed(self._record["step"], self._record["state"], resume_from[1]) if resume_from else None
        self._told = False

    def settings(self, **defaults: Any) -> SimpleNamespace:
        """The job's own settings: ``defaults`` overridden by the config's ``job:`` section.

        Every key of ``job:`` (but ``entrypoint`` and ``name``) must be one of ``defaults``, of the default's type (an
        integer passes for a float); otherwise a :class:`~hwplace.ConfigError` names the key.
        """
        section = job_section(self.config)
        values = dict(defaults)
        for key, value in section.items():
            if key in RESERVED_KEYS:
                continue
            if key not in defaults:
                raise ConfigError(f"job.{key}", "is not a setting of this job",
                                  allowed=f"settings: {', '.join(sorted(defaults)) or 'none'}"
                                          f"{did_you_mean(str(key), defaults)}")
            values[key] = _typed(value, defaults[key], f"job.{key}")
        return SimpleNamespace(**values)

    def launch(self, worker_class: type[W], component: str, *args: Any, name: str | None = None,
               isolate_accelerator: bool = True, restart: Restart | None = None, **kwargs: Any) -> WorkerGroup:
        """Launch ``worker_class(*args, **kwargs)`` on every process of ``component``'s placement.

        The group is named after the component unless ``name`` is given, and is shut down with the job. It
        restarts as the config's ``restart:`` section says for the component, unless ``restart`` is given.
        """
        policy = restart if restart is not None else self.placement.job.restart.get(component)
        group = worker_class.create_group(*args, **kwargs).launch(
            self.cluster, self.placement.get_strategy(component), name=name or component,
            isolate_accelerator=isolate_accelerator, restart=policy)
        self.groups[group.name] = group
        states = self._record.get("groups", {}).get(group.name)
        if states is not None:  # a resumed job: each rank gets its state back before the group is used
            try:
                load_states(group, states)
            except BaseException:
                group.shutdown()
                del self.groups[group.name]
                raise
        return group

    def channel(self, name: str, maxsize: int = 0, *, group_affinity: str | None = None,
                group_rank_affinity: int | None = None) -> Channel:
        """Create channel ``name`` on the job's cluster (as :meth:`hwplace.Channel.create`), closed with the job;
        :meth:`snapshot` keeps its contents, and in a resumed job it starts with what the snapshot held of the
        channel of that name."""
        made = Channel.create(name, maxsize, group_affinity=group_affinity, group_rank_affinity=group_rank_affinity,
                              cluster=self.cluster)  # refilled as every channel this driver makes (MadeHere)
        self.channels[name] = made
        return made

    def weight_sync(self, name: str, source: str, targets: Sequence[str] = ("rollout",), **options: Any) -> WeightSync:
        """Weight sync ``name`` on the job's cluster (:meth:`hwplace.WeightSync.create`, with its options): the
        newest version goes into :meth:`snapshot`; a resumed job's source goes on from there."""
        self.syncs[name] = WeightSync.create(name, source, targets, cluster=self.cluster, **options)
        return self.syncs[name]  # its versions continued as every sync this driver makes (MadeHere)

    def refill(self, channel: Channel) -> bool:
        """Put back what the snapshot this job resumed from holds of the channel of ``channel``'s name (one that
        ``snapshot(channels=...)`` named, created by a worker, say); whether it held any. Call it on a channel
        nobody uses yet. A channel this driver makes (:meth:`channel`, ``Channel.create``) is refilled as it is
        made; what was put back once is never put back again."""
        return self._made.refill(channel)

    def snapshot(self, step: int, state: Any = None, *, channels: Sequence[Channel] | None = None) -> Path | None:
        """Record the job at this step: ``step`` (a whole number, growing), the driver's ``state`` (anything that
        pickles), each launched group's ranks' ``state_dict()`` where the worker class defines one, the contents
        of ``channels`` (default: every channel this driver made, by :meth:`channel` or ``Channel.create``, and
        did not close), each one consistent cut with held items counted as not taken, and the newest version of
        each weight sync this driver made. Call it at a step boundary: when no worker method that hands out data,
        trains or publishes runs. Written atomically into the ``--snapshots``
        folder; returns the file (``None`` without one: it says so once on stderr). See docs/resilience.md."""
        step = step_of(step)
        if self.snapshots is None:
            if not self._told:
                self._told = True
                sys.stderr.write(f"hwplace: note: job.snapshot(step {step}) keeps nothing: run with --snapshots DIR "
                                 "to keep snapshots (said once)\n")
            return None
        newest = self.snapshots.steps()[-1:]
        if newest and step < newest[0][0]:
            raise ConfigError("step", f"is before that of the newest snapshot in {self.snapshots.path} "
                              f"({newest[0][0]})", value=step, allowed="steps that grow from one snapshot to the next")
        record = {"format": FORMAT, "step": step, "state": state, "groups": group_states(self.groups),
                  "channels": channel_contents(list(self._made.channels.values()), closed=True) if channels is None
                  else channel_contents(channels),
                  "weight_syncs": sync_versions(self._made.syncs, self.cluster.executor())}
        return self.snapshots.write(step, record)

    def shutdown(self) -> None:
        """Shut down every group launched through this job, the last launched first, then close the channels
        made by :meth:`channel`."""
        self._stop_recording()
        for group in reversed(list(self.groups.values())):
            group.shutdown()
        self.groups.clear()
        for channel in self.channels.values():
            with contextlib.suppress(HwplaceError):  # closed already, or its host is gone
                channel.close()
        self.channels.clear()


def _typed(value: Any, default: Any, path: str) -> Any:
    """``value`` if it has the type of ``default`` (``None`` takes anything), else a ``ConfigError``."""
    if default is None:
        return value
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is kind or (kind not in (bool, int, float) and isinstance(value, kind)):
        return value
    raise ConfigError(path, f"must be {_a(kind.__name__)}, like its default {safe_repr(default)}", value=value)


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def job_section(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config's ``job:`` mapping; a ``ConfigError`` when it is missing or not a mapping."""
    section = config.get("job")
    if not isinstance(section, Mapping):
        raise ConfigError("job", "is missing" if section is None else "must be a mapping",
                          value=section, allowed=f"a job: section whose entrypoint is {ENTRYPOINT_FORMS}")
    return section


def job_name_of(config: Mapping[str, Any], default: str | None) -> str | None:
    """The job's name: ``job.name`` when the config gives one, else ``default`` (its file's name)."""
    section = config.get("job")
    if not isinstance(section, Mapping) or section.get(NAME_KEY) is None:
        return default
    name = section[NAME_KEY]
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > 100 or not name.isprintable():
        raise ConfigError(f"job.{NAME_KEY}", "is not a usable job name", value=name,
                          allowed="1 to 100 printable characters (leave it out to name the job after its config "
                          "file)")
    return name.strip()


def load_entrypoint(config: Mapping[str, Any], base: Path) -> Callable[[Job], Any]:
    """The function ``job.entrypoint`` names; a file path is read relative to ``base``.

    A file is run as a script would be, in a module of its own that is not left in ``sys.modules``, so its
    classes travel to the workers by value, like those of a ``__main__`` script; so do the modules it imports
    from its own folder, which no worker needs a copy of.
    """
    spec = job_section(config).get(ENTRYPOINT_KEY)
    path = f"job.{ENTRYPOINT_KEY}"
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ConfigError(path, "is missing" if spec is None else "must name a function", value=spec,
                          allowed=ENTRYPOINT_FORMS)
    where, function = (part.strip() for part in spec.split(":"))
    if where.endswith(".py"):
        file = (base / where).resolve()
        if not file.is_file():
            raise ConfigError(path, f"there is no file {str(file)!r}", value=spec, allowed=ENTRYPOINT_FORMS)
        if str(file.parent) not in sys.path:  # its sibling modules import as they would for a script
            sys.path.insert(0, str(file.parent))
        before = set(sys.modules)
        namespace = runpy.run_path(str(file), run_name=f"__hwplace_job_{file.stem}__")
        for name in set(sys.modules) - before:  # its sibling modules travel by value too, like the file itself
            if _inside(getattr(sys.modules[name], "__file__", None), file.parent):
                del sys.modules[name]
        source = str(file)
    else:
        try:
            namespace = vars(importlib.import_module(where))
        except ModuleNotFoundError as exc:
            if exc.name is None or not where.startswith(exc.name):
                raise  # the module exists, and something it imports is missing: show the real traceback
            raise ConfigError(path, f"there is no module {where!r}", value=spec, allowed=ENTRYPOINT_FORMS) from None
        source = f"module {where}"
    entry = namespace.get(function)
    if not callable(entry):
        functions = [k for k, v in namespace.items() if callable(v) and not k.startswith("_")]
        raise ConfigError(path, f"{source} has no function {function!r}{did_you_mean(function, functions)}",
                          value=spec, allowed="a function that takes the hwplace.Job")
    return entry  # type: ignore[no-any-return]


def _inside(path: str | None, folder: Path) -> bool:
    """Whether the file ``path`` lies in ``folder`` or below it."""
    return path is not None and Path(path).resolve().is_relative_to(folder)


PLANNED = "(planned: not launched yet)"  # the worker class a component's up-front lease shows in hwplace status


@contextlib.contextmanager
def leased_plan(cluster: Cluster, placement: ComponentPlacement) -> Iterator[None]:
    """Lease every device of the plan to this job before any group launches, for the block.

    Each component's devices are registered as a group named after it (which ``Job.launch`` then takes over):
    a device another live job holds is a ``PlacementError`` naming it and its holder before the entry point
    runs, not when the clashing component launches, after the others. Nothing when the executor keeps no
    leases."""
    executor = cluster.executor()
    if not isinstance(executor, Leases):
        yield
        return
    leased: list[str] = []
    try:
        for component in placement.components:
            record = group_record(cluster, component, Worker, placement.get_placements(component))
            if record.leases:
                try:
                    executor.register_group(replace(record, worker_class=PLANNED))
                except PlacementError as exc:
                    raise PlacementError(f"job {cluster.job_name!r}, before launching anything: {exc}") from None
                leased.append(component)
        yield
    finally:
        for component in leased:
            executor.deregister_group(component)


@contextlib.contextmanager
def _simulated(counts: list[int] | None, executor: str) -> Iterator[None]:
    """A throwaway local cluster of ``executor`` with ``counts`` fake accelerators on its nodes, for the block; or
    nothing."""
    if counts is None:
        yield
        return
    with local_cluster(len(counts), counts, executor=executor):
        yield


def run_job(
    config: str | os.PathLike[str] | Mapping[str, Any] | JobConfig | Any,
    *,
    accelerators_per_node: int | Sequence[int] | None = None,
    base: str | os.PathLike[str] | None = None,
    out: TextIO | None = None,
    job_name: str | None = None,
    snapshots: str | os.PathLike[str] | None = None,
    resume: str | os.PathLike[str] | None = None,
    keep_snapshots: int = 2,
    planned: Callable[[ComponentPlacement], None] | None = None,
) -> Any:
    """Run a job: connect the cluster, place every component, print the plan, call ``job.entrypoint``.

    With ``accelerators_per_node`` (one count per node, or an int for one node), the job runs on a throwaway
    local Ray cluster of that shape with fake accelerators, checked against that inventory before Ray
    starts; otherwise on the cluster ``cluster:`` describes. ``config`` is parsed once, before anything starts
    (a :class:`~hwplace.JobConfig` is used as it is). A relative ``job.entrypoint`` file is read
    from ``base``: by default the config file's folder, or the working directory for a mapping. Every group
    the entry point launched through the :class:`Job` is shut down when it returns or raises. It prints the
    cluster it joined (address and nodes) and the plan before calling the entry point. The job's name (``hwplace
    status``, lease conflicts) is ``job.name``, else ``job_name``, else its config file's: ``pipeline.yaml``
    runs as job ``pipeline``. Every device of the plan is leased to the job before the entry point runs
    (:func:`leased_plan`). ``job.snapshot`` writes into the folder ``snapshots`` (keeping the newest
    ``keep_snapshots``); ``resume`` names a folder whose newest snapshot the job continues from (and keeps its
    snapshots in, unless ``snapshots`` names another): the groups launched get their ranks' state back, channels
    made with ``job.channel`` their items, and the entry point reads ``job.resumed``. ``planned`` is handed the
    placement once it is made. Returns what the entry point returns.
    """
    def say(line: str) -> None:
        (out or sys.stdout).write(line + "\n")

    folder, resume_from = snapshot_folders(snapshots, resume, keep_snapshots, say)
    job_config = config if isinstance(config, JobConfig) else parse_job_config(config)  # every mistake, up front
    cluster_config = job_config.cluster
    if base is None:
        base = Path(os.fsdecode(config)).parent if isinstance(config, str | os.PathLike) else Path.cwd()
    entry = load_entrypoint(job_config.raw, Path(base))
    counts = None
    if accelerators_per_node is not None:
        counts = [accelerators_per_node] if isinstance(accelerators_per_node, int) else list(accelerators_per_node)
        if cluster_config.address not in (None, "local"):
            raise ConfigError("cluster.address", "is set, but a simulated cluster runs on this machine",
                              value=cluster_config.address, allowed="leave out one of the two")
        if cluster_config.num_nodes > len(counts):
            raise ConfigError("accelerators_per_node", f"gives {plural(len(counts), 'node')} but cluster.num_nodes "
                              f"is {cluster_config.num_nodes}", value=accelerators_per_node,
                              allowed=f"at least {cluster_config.num_nodes} nodes")
        simulated = fake_cluster(cluster_config, num_nodes=len(counts), accelerators_per_node=counts)
        sync_plans(job_config.weight_sync, ComponentPlacement(job_config, simulated))  # source ranks: checked too
        cluster_config = replace(cluster_config, address=None)  # the simulated cluster is the local one
        job_config = replace(job_config, cluster=cluster_config)
    if job_name is None and isinstance(config, str | os.PathLike):
        job_name = Path(os.fsdecode(config)).stem
    job_name = job_name_of(job_config.raw, job_name)
    with _simulated(counts, cluster_config.executor):
        cluster = Cluster(cluster_cfg=cluster_config, job_name=job_name)
        print_cluster(cluster, out or sys.stdout)
        placement = ComponentPlacement(job_config, cluster)
        if planned is not None:
            planned(placement)
        syncs = sync_plans(job_config.weight_sync, placement)
        print_plan(placement, out or sys.stdout)
        print_sync_plans(syncs, out or sys.stdout)
        print_notes(placement, out or sys.stdout)
        failures: list[WorkerError] = []
        try:
            with leased_plan(cluster, placement), ended_by_group_failure(failures):
                job = Job(job_config, cluster, placement, snapshots=folder, resume_from=resume_from)
                try:
                    return entry(job)
                finally:
                    job.shutdown()
        except GroupFailed:  # a group used up its restarts: the job ends with its last cause (SPEC §12)
            raise failures[0] from None
