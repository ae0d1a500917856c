"""hwplace's registry on a Ray cluster: the jobs that use it, their groups, device leases and channels.

:class:`hwplace.executor.LeaseBook` is the bookkeeping (pure: no Ray). :class:`Registry` runs it as one detached,
named Ray actor per cluster (``registry`` in the namespace ``hwplace``), made by the first job that launches a group
and found by the next. Ray's resource accounting counts GPUs but not which ones; the book knows which device each job
holds. A job's driver that ended (``ray.shutdown()``, an exit, SIGKILL) is marked dead in Ray's job table as soon as
its raylet sees it go: the registry reads that table whenever it answers, so the dead job's leases end then, without
a heartbeat or a polling loop.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from hwplace.executor import GroupRecord, LeaseBook, LeaseConflict

NAME = "registry"
NAMESPACE = "hwplace"


def live_jobs(job_ids: Collection[str]) -> set[str]:
    """Which of ``job_ids`` have a live driver, per the cluster's job table (its control service)."""
    import ray  # noqa: PLC0415 (optional: Ray; this runs in the registry's actor)

    table = ray._private.state.jobs()  # type: ignore[no-untyped-call]
    wanted = set(job_ids)
    return {str(j["JobID"]) for j in table if str(j["JobID"]) in wanted and not j["IsDead"]}


class Registry:
    """The Ray actor that keeps one cluster's :class:`LeaseBook`; its calls run one at a time."""

    def __init__(self) -> None:
        self._book = LeaseBook(live_jobs)

    def register_group(self, job: Mapping[str, Any], record: GroupRecord) -> list[LeaseConflict]:
        return self._book.register_group(job, record)

    def deregister_group(self, job_id: str, group: str) -> None:
        self._book.deregister_group(job_id, group)

    def update_workers(self, job_id: str, group: str, workers: Any) -> None:
        self._book.update_workers(job_id, group, workers)

    def register_channel(self, job: Mapping[str, Any], name: str, where: str) -> None:
        self._book.register_channel(job, name, where)

    def deregister_channel(self, name: str) -> None:
        self._book.deregister_channel(name)

    def snapshot(self) -> dict[str, Any]:
        return self._book.snapshot()
