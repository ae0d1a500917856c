"""End-to-end checks through an executor: WeightSync publish/latest and Worker.send/recv between real workers on
one GPU. They need hwplace's Ray-free subprocess executor (hwplace/testing, being written); until it lands the
check reports ``skip``.

To add one: write ``def weight_sync_e2e(gpu)`` below that launches a source and a target group through that
executor on GPU 0 (the target's transport is then ``shared-memory``), publishes a few CUDA state dicts and
returns what ``latest()`` gave (versions, digests, seconds); raise ``CheckFailed`` with the error text where a
version does not arrive. Remove the ``CheckSkipped`` stub.
"""

from __future__ import annotations

from typing import Any

from gpu_checks.harness import CheckSkipped, check


# TODO(e2e): replace this stub with the real check once hwplace.testing has the subprocess executor.
@check("weight_sync_e2e", 180, issue="26 points 2, 3, 5 end to end: WeightSync over CUDA IPC between two workers")
def weight_sync_e2e(gpu: bool) -> dict[str, Any]:
    raise CheckSkipped("STUB: needs the Ray-free subprocess executor in hwplace/testing (not there yet); see "
                       "benchmarks/gpu_checks/e2e_checks.py")
