"""The device leases of a process cluster: which job's groups hold each device, kept by the driver's hub.

The same bookkeeping and the same rule as the Ray executor's registry: groups of one job may share devices,
a device held by another live job is a :class:`~hwplace.contracts.registry.LeaseConflict`; a job is the
process that registered its groups (its pid on this machine), alive while that process is. Imports the
contracts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from hwplace.contracts.registry import GroupRecord, LeaseConflict


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LeaseBook:
    """Jobs (mappings with ``id``, ``name``, ``pid``, ``host``), their groups and channels, and their leases."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.groups: dict[tuple[str, str], GroupRecord] = {}
        self.channels: dict[str, dict[str, Any]] = {}

    def join(self, job: Mapping[str, Any]) -> None:
        """Record ``job``; a job named again (or first seen without a name) takes the latest name."""
        known = self.jobs.get(str(job["id"]))
        if known is None:
            self.jobs[str(job["id"])] = {**job, "since": time.time()}
        elif job.get("name") is not None and known.get("name") != job["name"]:
            known.update(job)

    def forget_dead(self) -> None:
        """Drop the jobs whose process has ended, with their groups, leases and channels."""
        for job_id in [j for j, info in self.jobs.items() if not pid_alive(int(info["pid"]))]:
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
        self.join(job)
        self.forget_dead()
        found = self.conflicts(str(job["id"]), record)
        if found:
            return found
        self.groups[(str(job["id"]), record.group)] = record
        return []

    def deregister_group(self, job_id: str, group: str) -> None:
        self.groups.pop((job_id, group), None)

    def register_channel(self, job: Mapping[str, Any], name: str, where: str) -> None:
        self.join(job)
        self.channels[name] = {"name": name, "job": str(job["id"]), "where": where}

    def deregister_channel(self, name: str) -> None:
        self.channels.pop(name, None)

    def snapshot(self) -> dict[str, Any]:
        """Every live job, group, lease and channel, as JSON-ready lists (the Ray registry's shape)."""
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
