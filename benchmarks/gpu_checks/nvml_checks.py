"""Checks that need no second process: the cuda backend against the real NVML (issue 26's setting: detection,
health, UUIDs, memory, isolation), and the weight-sync transport decision from placements (issue 26 point 4).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from gpu_checks.harness import CheckFailed, check, error_text

SINGLE_GPU_LIMITS = [
    "the PCI-bus ordering of several GPUs (cuda_ordinal against NVML's index) and index masks over them",
    "isolation of different GPUs to different processes (each sees only its own UUID)",
    "NCCL between two GPUs (the supported case of messaging.Pair) and a received tensor's device",
    "a weight-sync source holding two GPUs with targets on either (point 4 on hardware)",
]


def _nvml_view(pynvml: Any) -> list[dict[str, Any]]:
    """What pynvml itself says about each GPU, in NVML order."""
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        try:
            mig = pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        except pynvml.NVMLError:
            mig = False
        gpus.append({"uuid": pynvml.nvmlDeviceGetUUID(handle), "name": pynvml.nvmlDeviceGetName(handle),
                     "memory_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle).total, "mig": mig,
                     "bus": pynvml.nvmlDeviceGetPciInfo(handle).busId})
    return gpus


def _torch_sees(env: dict[str, str]) -> dict[str, Any]:
    """What a fresh CUDA process sees under ``env`` (added to this one's): its device count and UUIDs."""
    code = ("import json, torch; n = torch.cuda.device_count(); print(json.dumps({'count': n, 'uuids': "
            "[str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]}))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120, check=False)
    if done.returncode:
        return {"error": done.stderr[-1500:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _same_uuid(nvml_uuid: str, torch_uuid: str) -> bool:
    """NVML's ``GPU-<hex>`` and torch's rendering of the same UUID (with or without the prefix)."""
    return nvml_uuid.removeprefix("GPU-").removeprefix("MIG-").lower() in torch_uuid.lower()


def _no_nvml(problem: str) -> dict[str, Any]:
    import hwplace
    from hwplace_plugins.cuda import CudaBackend

    devices = CudaBackend(environ={}).detect([])
    reason = devices.reason if isinstance(devices, hwplace.NoDevices) else None
    details = {"nvml": problem, "reason": reason, "devices": len(devices)}
    if not reason:
        raise CheckFailed("without NVML the backend did not say why it found nothing", details)
    return {"summary": f"no NVML here; the backend finds nothing and says: {reason[:100]}", **details}


@check("nvml", 90, issue="26 (setting): NVML detection on the real driver")
def nvml(gpu: bool) -> dict[str, Any]:
    import hwplace
    from hwplace_plugins.cuda import CudaBackend

    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver: detection must find nothing and say why
        return _no_nvml(error_text(exc))
    try:
        truth = _nvml_view(pynvml)
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    detection = hwplace.PluginManager().detect("cuda", timeout=30)  # through the entry points, as hwplace does
    devices = CudaBackend(environ={}).detect([])  # every GPU, whatever mask this process inherited
    problems: list[str] = []
    if detection.error:
        problems.append(f"PluginManager.detect('cuda'): {detection.error}")
    listed = [{"index": d.index, "model": d.model, "healthy": d.healthy, "reason": d.reason,
               "properties": dict(d.properties)} for d in devices]
    whole = [d for d in devices if "mig" not in d.properties]
    if sorted(str(d.properties.get("uuid")) for d in whole) != sorted(g["uuid"] for g in truth if not g["mig"]):
        problems.append("the backend's UUIDs differ from NVML's")
    for d, g in zip(whole, sorted((g for g in truth if not g["mig"]), key=lambda g: g["bus"]), strict=False):
        if d.properties.get("memory_bytes") != g["memory_bytes"]:
            problems.append(f"device {d.index}: memory_bytes {d.properties.get('memory_bytes')} != NVML's "
                            f"{g['memory_bytes']}")
    problems += [f"device {d.index} unhealthy: {d.reason}" for d in devices if not d.healthy]
    details: dict[str, Any] = {"driver": driver, "nvml": truth, "devices": listed,
                               "detect_seconds": round(detection.seconds, 3),
                               "inherited_mask": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if whole:
        last = whole[-1]
        uuid = str(last.properties["uuid"])
        masked = CudaBackend(environ={"CUDA_VISIBLE_DEVICES": uuid}).detect([])
        by_index = CudaBackend(environ={"CUDA_VISIBLE_DEVICES": str(last.properties["cuda_ordinal"]),
                                        "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).detect([])
        details["masks"] = {"uuid": [d.properties.get("uuid") for d in masked],
                            "index": [d.properties.get("uuid") for d in by_index]}
        if details["masks"] != {"uuid": [uuid], "index": [uuid]}:
            problems.append(f"a UUID mask and an index mask do not both select {uuid}: {details['masks']}")
        env = CudaBackend().isolation_env([last])
        details["isolation_env"] = env
        if gpu:
            seen = details["isolated_process_sees"] = _torch_sees(env)
            if seen.get("count") != 1 or not _same_uuid(uuid, seen.get("uuids", [""])[0]):
                problems.append(f"a process under isolation_env {env} sees {seen}, not only {uuid}")
    if len(whole) < 2:
        details["single_gpu_cannot_show"] = SINGLE_GPU_LIMITS
    if problems:
        raise CheckFailed("; ".join(problems), details)
    return {"summary": f"{len(devices)} device(s): {', '.join(sorted({d.model for d in devices}))}; driver "
                       f"{driver}; detect {detection.seconds:.2f} s", **details}


@check("sync_plan_overlap", 30, issue="26 point 4: transport from where the tensors are, not placement overlap")
def sync_plan_overlap(gpu: bool) -> dict[str, Any]:
    """A source holding GPUs 0 and 1 whose tensors are on its cuda:0 or its cuda:1; a target on GPU 1 alone: the
    transport of each version follows the tensors (same-device only on the GPU the target holds)."""
    import hwplace
    from hwplace.planning.sync_plan import SAME_DEVICE, SAME_NODE, plan_sync
    from hwplace.runtime.weight_sync.device_share import physical_device
    from hwplace.runtime.weight_sync.transports import choose

    section = {"num_nodes": 1, "component_placement": {"trainer": "0-1:0", "rollout": "1"}}
    cluster = hwplace.testing.fake_cluster(section, accelerators_per_node=2, accelerator_type="cuda")
    placements = hwplace.ComponentPlacement({"cluster": section}, cluster)
    source, target = placements.get_placements("trainer")[0], placements.get_placements("rollout")[0]
    plan = plan_sync(source, {"rollout": [target]})
    chosen = {}
    for tensors_on in (0, 1):
        physical = physical_device(tensors_on, source.visible_accelerators or None)
        chosen[f"source cuda:{tensors_on}"] = choose(plan[0].transport, target.local_hardware_ranks, physical)
    details: dict[str, Any] = {
        "source": {"local_hardware_ranks": source.local_hardware_ranks, "visible": source.visible_accelerators},
        "target": {"local_hardware_ranks": target.local_hardware_ranks, "visible": target.visible_accelerators},
        "planned": plan[0].transport, "chosen": chosen}
    if chosen != {"source cuda:0": SAME_NODE, "source cuda:1": SAME_DEVICE}:
        raise CheckFailed("a version's transport does not follow where its tensors are", details)
    return {"summary": f"planned {plan[0].transport}; per version: {chosen}", **details}
