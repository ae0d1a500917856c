"""Which jobs of a process cluster are alive: a job is the process that registered its groups (its pid on this
machine), alive while that process is. The hub keeps a :class:`hwplace.inventory.leases.LeaseBook` with this as its
rule, the same book and conflict rule as the Ray executor's registry. Imports nothing of hwplace.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Any


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_pids(jobs: Mapping[str, Mapping[str, Any]], job_ids: Collection[str]) -> set[str]:
    """Which of ``job_ids`` (keys of ``jobs``, each with its driver's ``pid``) still have a live driver."""
    return {job_id for job_id in job_ids if pid_alive(int(jobs[job_id]["pid"]))}
