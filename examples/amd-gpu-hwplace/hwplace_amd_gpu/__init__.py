"""AMD GPUs for hwplace, read from the kernel's KFD topology (``/sys/class/kfd/kfd/topology/nodes``).

Each topology node with a non-zero ``gpu_id`` is a GPU; GPUs are numbered in topology order, which is the
order ``HIP_VISIBLE_DEVICES`` counts in. A mask the node already has (``HIP_VISIBLE_DEVICES`` or
``ROCR_VISIBLE_DEVICES`` inherited from a scheduler) is honoured: only those GPUs are reported, and each
keeps its physical position as ``physical_id``, which is what isolation writes back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import hwplace

TOPOLOGY = "sys/class/kfd/kfd/topology/nodes"
MASK_VARIABLES = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _properties(node: Path) -> dict[str, str]:
    lines = (node / "properties").read_text().splitlines()
    return dict(line.split(maxsplit=1) for line in lines if len(line.split(maxsplit=1)) == 2)


class AmdGpu(hwplace.HardwareBackend):
    """AMD GPUs; ``root`` is where the sysfs tree lives (``/`` on a real node, a folder in tests)."""

    name = "amd-gpu"
    kind = "accelerator"

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root)

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        topology = self.root / TOPOLOGY
        if not topology.is_dir():
            return hwplace.NoDevices(f"no AMD GPU driver here: {topology} does not exist (amdgpu/KFD not loaded)")
        gpus = []
        for node in sorted(topology.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
            try:
                gpu_id = (node / "gpu_id").read_text().strip()
                props = _properties(node)
                model = (node / "name").read_text().strip() or "AMD GPU"
            except OSError:
                continue  # a node without those files is not a GPU node
            if gpu_id not in ("", "0"):
                gpus.append((model, gpu_id, props))
        if not gpus:
            return hwplace.NoDevices(f"the KFD topology at {topology} lists no GPU")
        chosen, problem = self._masked(len(gpus))
        if problem:
            return hwplace.NoDevices(problem)
        return [
            hwplace.Device(index, gpus[physical][0], properties={
                "physical_id": physical, "gpu_id": gpus[physical][1],
                "unique_id": gpus[physical][2].get("unique_id", ""),
                "location_id": gpus[physical][2].get("location_id", "")})
            for index, physical in enumerate(chosen)
        ]

    @staticmethod
    def _masked(count: int) -> tuple[list[int], str]:
        for variable in MASK_VARIABLES:
            raw = os.environ.get(variable)
            if raw is None:
                continue
            entries = [e.strip() for e in raw.split(",") if e.strip()]
            bad = [e for e in entries if not (e.isdigit() and int(e) < count)]
            if bad:
                return [], f"{variable}={raw!r} names {bad[0]!r}, not a GPU of this node (0-{count - 1})"
            return [int(e) for e in entries], ""
        return list(range(count)), ""

    def isolation_env(self, devices: Sequence[hwplace.Device]) -> dict[str, str]:
        ids = ",".join(str(d.properties.get("physical_id", d.index)) for d in devices)
        return {"HIP_VISIBLE_DEVICES": ids, "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}


@hwplace.hookimpl
def hwplace_hardware_backends() -> list[hwplace.HardwareBackend]:
    return [AmdGpu()]
