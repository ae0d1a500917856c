"""The example AMD backend: on a KFD topology written under a temporary root, and through hwplace's kit."""

from __future__ import annotations

from pathlib import Path

import hwplace_amd_gpu
import pytest

import hwplace
from hwplace.testing import BackendConformance


def topology(root: Path, gpus: int) -> Path:
    nodes = root / hwplace_amd_gpu.TOPOLOGY
    (nodes / "0").mkdir(parents=True)  # the CPU node: gpu_id 0
    (nodes / "0" / "gpu_id").write_text("0\n")
    (nodes / "0" / "name").write_text("\n")
    (nodes / "0" / "properties").write_text("cpu_cores_count 64\nsimd_count 0\n")
    for i in range(gpus):
        node = nodes / str(i + 1)
        node.mkdir()
        (node / "gpu_id").write_text(f"{4000 + i}\n")
        (node / "name").write_text("gfx90a\n")
        (node / "properties").write_text(f"simd_count 440\nunique_id {9000 + i}\nlocation_id {256 * (i + 1)}\n")
    return root


def test_gpus_are_read_from_the_topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    found = hwplace_amd_gpu.AmdGpu(topology(tmp_path, 4)).detect([])
    assert [(d.index, d.model, d.properties["physical_id"]) for d in found] == [
        (0, "gfx90a", 0), (1, "gfx90a", 1), (2, "gfx90a", 2), (3, "gfx90a", 3)]
    assert found[2].properties["unique_id"] == "9002"


def test_an_inherited_mask_keeps_physical_ids_for_isolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "2,3")
    backend = hwplace_amd_gpu.AmdGpu(topology(tmp_path, 4))
    found = backend.detect([])
    assert [(d.index, d.properties["physical_id"]) for d in found] == [(0, 2), (1, 3)]
    assert backend.isolation_env([found[1]]) == {"HIP_VISIBLE_DEVICES": "3",
                                                 "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}


def test_a_bad_mask_and_no_driver_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1,7")
    masked = hwplace_amd_gpu.AmdGpu(topology(tmp_path / "a", 2)).detect([])
    assert isinstance(masked, hwplace.NoDevices)
    assert masked.reason == "HIP_VISIBLE_DEVICES='1,7' names '7', not a GPU of this node (0-1)"
    absent = hwplace_amd_gpu.AmdGpu(tmp_path / "b").detect([])
    assert isinstance(absent, hwplace.NoDevices)
    assert "no AMD GPU driver here" in absent.reason


def test_it_is_found_through_its_entry_point() -> None:
    info = hwplace.PluginManager().backend("amd-gpu")
    assert (info.plugin, info.distribution, info.kind) == ("amd-gpu", "amd-gpu-hwplace", "accelerator")


class TestAmdGpuConformance(BackendConformance):
    """hwplace's conformance kit, on whatever this machine has (no AMD GPU in CI: it must say so)."""

    plugin = hwplace_amd_gpu
    backend_name = "amd-gpu"
