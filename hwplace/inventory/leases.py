"""The lease book: which job's groups hold each device of a cluster, and the jobs' channels; pure bookkeeping, no
executor. An executor offering :class:`hwplace.executor.Leases` keeps one per cluster where every job reaches it
(Ray: a named actor; the process executor: its hub), and says how to tell which jobs still have a live driver.
Groups of one job may share devices; a device another live job holds is a
:class:`~hwplace.contracts.registry.LeaseConflict`. Imports the contracts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from hwplace.contracts.registry import GroupRecord, LeaseConflict, WorkerRecord
from hwplace.foundation.errors import PlacementError


class LeaseBook:
    """Jobs, their groups and channels, and which job's groups hold each device.

    A job is a mapping with ``id`` (Ray's job id), ``name``, ``pid``, ``host``. ``alive`` answers which of some
    job ids still have a live driver; it is asked only about jobs other than the caller's.
    """

    def __init__(self, alive: Callable[[Collection[str]], set[str]]) -> None:
        self._alive = alive
        self.jobs: dict[str, dict[str, Any]] = {}
        self.groups: dict[tuple[str, str], GroupRecord] = {}
        self.channels: dict[str, dict[str, Any]] = {}

    def _join(self, job: Mapping[str, Any]) -> None:
        """Record ``job``. A job first seen without a name (a worker's channel) takes its driver's later, and a
        driver that names its job again (a new ``Cluster(job_name=...)``) renames it: the latest name wins."""
        known = self.jobs.get(str(job["id"]))
        if known is None:
            self.jobs[str(job["id"])] = {**job, "since": time.time()}
        elif job.get("name") is not None and (known.get("name") != job["name"] or known.get("pid") is None):
            known.update(job)

    def forget_dead(self, except_job: str | None = None) -> None:
        """Drop the jobs whose driver has ended, with their groups, leases and channels."""
        others = [j for j in self.jobs if j != except_job]
        if not others:
            return
        live = self._alive(others)
        for job_id in [j for j in others if j not in live]:
            del self.jobs[job_id]
            for key in [k for k in self.groups if k[0] == job_id]:
                del self.groups[key]
            for name in [n for n, c in self.channels.items() if c["job"] == job_id]:
                del self.channels[name]

    def conflicts(self, job_id: str, record: GroupRecord) -> list[LeaseConflict]:
        held: dict[tuple[str, str, str], tuple[str, GroupRecord]] = {}
        for (owner, _), group in self.groups.items():  # in launch order: the first holder is named
            for lease in group.leases:
                if owner != job_id:
                    held.setdefault(lease.key, (owner, group))
        found = []
        for lease in record.leases:
            if lease.key in held:
                owner, group = held[lease.key]
                info = self.jobs[owner]
                found.append(LeaseConflict(lease, str(info["name"]), owner, f"pid {info['pid']} on {info['host']}",
                                           group.group))
        return found

    def register_group(self, job: Mapping[str, Any], record: GroupRecord) -> list[LeaseConflict]:
        """Record ``record`` for ``job`` and lease its devices, or return the conflicts and record nothing."""
        self._join(job)
        if self.conflicts(str(job["id"]), record):
            self.forget_dead(except_job=str(job["id"]))  # the job table is read only when it matters
            found = self.conflicts(str(job["id"]), record)
            if found:
                return found
        self.groups[(str(job["id"]), record.group)] = record
        return []

    def deregister_group(self, job_id: str, group: str) -> None:
        self.groups.pop((job_id, group), None)

    def update_workers(self, job_id: str, group: str, workers: Sequence[WorkerRecord]) -> None:
        """New records of the workers of ``job_id``'s group ``group`` (their states); its leases are unchanged."""
        record = self.groups.get((job_id, group))
        if record is not None:
            self.groups[(job_id, group)] = replace(record, workers=tuple(workers))

    def register_channel(self, job: Mapping[str, Any], name: str, where: str) -> None:
        self._join(job)
        self.channels[name] = {"name": name, "job": str(job["id"]), "where": where}

    def deregister_channel(self, name: str) -> None:
        self.channels.pop(name, None)

    def snapshot(self) -> dict[str, Any]:
        """Every live job, group, lease and channel, as JSON-ready lists."""
        self.forget_dead()
        groups, leases = [], []
        for (job_id, _), record in sorted(self.groups.items()):
            job_name = self.jobs[job_id]["name"]
            groups.append({"job": job_id, "job_name": job_name, "group": record.group,
                           "worker_class": record.worker_class, "workers": [asdict(w) for w in record.workers]})
            leases += [{**asdict(lease), "device": lease.describe(), "job": job_id, "job_name": job_name,
                        "group": record.group} for lease in record.leases]
        jobs = [{**info, "groups": sum(1 for (j, _) in self.groups if j == job_id)}
                for job_id, info in sorted(self.jobs.items())]
        return {"jobs": jobs, "groups": groups, "leases": leases,
                "channels": [dict(c) for _, c in sorted(self.channels.items())]}


def lease_refusal(group: str, conflicts: Sequence[LeaseConflict]) -> PlacementError:
    """The :class:`PlacementError` for a group that cannot start because other jobs hold its devices: the first
    three conflicts (device, node, holder), how many more, and what to do."""
    more = f"; and {len(conflicts) - 3} more" if len(conflicts) > 3 else ""
    return PlacementError(f"group {group!r} cannot start: " + "; ".join(c.describe() for c in conflicts[:3]) + more
                          + "; a device is leased to one job at a time: wait until that job ends or shuts its group "
                          "down, or place this component on other devices (hwplace status lists the leases)")
