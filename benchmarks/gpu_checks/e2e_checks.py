"""End-to-end checks through an executor, with no Ray: a trainer and a rollout group on the same GPU (the
colocated layout of SPEC §9), launched by hwplace's process executor (``hwplace.testing.process_cluster``) on a
node whose accelerators are this machine's own (real CUDA detection through NVML). They exercise
``WeightSync`` (the same-device transport over CUDA IPC, an odd-length bf16 tensor, memory over many versions,
a ring of device buckets smaller than the model)
and ``Worker.send`` / ``recv`` of CUDA tensors between the two colocated workers (issue 26 points 1 to 5).

On a machine without a GPU the same checks run on a simulated node of fake accelerators with CPU tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from gpu_checks.harness import CheckFailed, check

MiB = 2**20
TIMEOUT = 60.0  # seconds a target waits for one version, a recv for one message


@contextlib.contextmanager
def colocated(gpu: bool, env: dict[str, str] | None = None) -> Iterator[tuple[Any, Any, Any]]:
    """A trainer and a rollout group, one worker each, sharing accelerator 0, their processes started with ``env``
    added; yields (cluster, trainer, rollout)."""
    import hwplace
    from gpu_checks.e2e_workers import Rollout, Trainer
    from hwplace.testing import process_cluster

    shape: dict[str, Any] = {"inherit_env": True} if gpu else {"num_nodes": 1, "accelerators_per_node": 2}
    with process_cluster(**shape, env_vars=env) as cluster:
        kinds = sorted(t for t, devices in cluster.nodes[0].hardware.items() if devices and t != "node")
        if gpu and "cuda" not in kinds:
            raise CheckFailed(f"the node has no cuda accelerators: found {kinds}; problems {cluster.problems}")
        strategy = hwplace.PackedPlacementStrategy(0, 0)
        trainer = Trainer.create_group().launch(cluster, placement_strategy=strategy, name="trainer")
        try:
            rollout = Rollout.create_group().launch(cluster, placement_strategy=strategy, name="rollout")
            try:
                yield cluster, trainer, rollout
            finally:
                rollout.shutdown()
        finally:
            trainer.shutdown()


def _wait(handle: Any, what: str) -> Any:
    try:
        return handle.wait(timeout=TIMEOUT * 2)[0]
    except Exception as exc:
        raise CheckFailed(f"{what}: {type(exc).__name__}: {str(exc)[:1500]}") from exc


def _weight_sync(gpu: bool, env: dict[str, str] | None, ring: dict[str, Any] | None = None) -> dict[str, Any]:
    """Versions from a trainer to a rollout on its GPU (``ring``: the sync's ``bucket_bytes`` and
    ``device_buckets``); every one intact, and the trainer's ring never above what ``sync.device_bytes`` states."""
    import hwplace

    versions, mib = (60, 64) if gpu else (20, 8)
    with colocated(gpu, env) as (cluster, trainer, rollout):
        sync = hwplace.WeightSync.create("policy", source="trainer", targets=("rollout",), cluster=cluster,
                                         **(ring or {}))
        before = _wait(trainer.gpu(), "the trainer's device")
        taking = rollout.take(sync, versions, TIMEOUT)
        published = _wait(trainer.publish(sync, versions, mib), "publish")
        taken = _wait(taking, "latest() on the colocated rollout")
        details = {"device": before, "plan": str(sync.plan), "versions": versions, "mib": mib, "ring": ring or {},
                   "published": published, "taken": taken}
        if taken["wrong"] or taken["last"] != versions:
            raise CheckFailed("the rollout did not get every version intact", details)
        stated = published["plan_device_bytes"]["source"]
        held = max(device for _, (device, _host) in published["ring"])
        if held > stated:
            raise CheckFailed(f"the trainer's ring held {held} bytes, more than the {stated} sync.device_bytes "
                              "states", details)
        details["summary"] = (f"{versions} versions of {mib} MiB intact; the source's ring held at most {held} "
                              f"bytes (stated: {stated}), host buckets {published['ring'][-1][1][1]}")
        return details


@check("weight_sync_e2e", 240, issue="26 points 2 to 5 end to end: WeightSync between two colocated workers")
def weight_sync_e2e(gpu: bool) -> dict[str, Any]:
    return _weight_sync(gpu, None)


@check("weight_sync_e2e_ring", 240, cpu=False, issue="26 point 3 end to end: the same through a ring of 2 buckets "
       "of 16 MiB, half the model: the source's GPU memory bounded by the ring, the rest in host buckets")
def weight_sync_e2e_ring(gpu: bool) -> dict[str, Any]:
    return _weight_sync(gpu, None, {"bucket_bytes": 16 * MiB if gpu else 2 * MiB, "device_buckets": 2})


@check("weight_sync_e2e_expandable", 240, cpu=False, issue="26 point 2 end to end: the same, every process under "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (RL stacks set it)")
def weight_sync_e2e_expandable(gpu: bool) -> dict[str, Any]:
    return _weight_sync(gpu, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})


@check("messaging_e2e_same_gpu", 180, issue="26 point 1 end to end: send/recv of a CUDA tensor between two "
       "workers on one GPU")
def messaging_e2e_same_gpu(gpu: bool) -> dict[str, Any]:
    mib = 64
    with colocated(gpu) as (_cluster, trainer, rollout):
        receiving = rollout.receive_from("trainer", 0, TIMEOUT)
        sent = _wait(trainer.send_to("rollout", 0, mib, 3.0), "send to the colocated rollout")
        got = _wait(receiving, "recv on the colocated rollout")
        if got["received"] != 3.0 or got["numel"] != mib * MiB // 4:
            raise CheckFailed("the message arrived changed", {"got": got})
        return {"send_s": sent, "got": got}


@check("messaging_e2e_crossing", 180, issue="26 point 5 end to end: two workers sending 256 MiB to each other "
       "at once")
def messaging_e2e_crossing(gpu: bool) -> dict[str, Any]:
    mib = 256 if gpu else 32
    with colocated(gpu) as (_cluster, trainer, rollout):
        one = trainer.exchange("rollout", 0, mib, 1.0, TIMEOUT)
        other = rollout.exchange("trainer", 0, mib, 2.0, TIMEOUT)
        a, b = _wait(one, "the trainer's exchange"), _wait(other, "the rollout's exchange")
        if (a["received"], b["received"]) != (2.0, 1.0):
            raise CheckFailed("the crossing messages arrived changed", {"trainer": a, "rollout": b})
        return {"trainer": a, "rollout": b, "mib": mib}
