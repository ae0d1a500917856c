"""The npu backend on this machine's real driver tools: run it on an Ascend node (``tox -e npu``).

Where there is no NPU, each test checks that detection says so, then skips with that reason.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

import hwplace
from hwplace.testing.conformance import BackendConformance
from hwplace_plugins import npu
from hwplace_plugins.npu import MASK_VARIABLE, RAY_OPT_OUT, NpuBackend


@pytest.fixture(scope="module")
def here() -> list[hwplace.Device]:
    """What the backend finds on this machine, as ``hwplace hardware`` would."""
    return NpuBackend().detect([])


def npus_or_skip(here: list[hwplace.Device]) -> list[hwplace.Device]:
    if here:
        return here
    assert isinstance(here, hwplace.NoDevices), "no NPU found, and no reason given"
    assert here.reason.strip(), "no NPU found, and an empty reason given"
    pytest.skip(f"needs an Ascend NPU; {here.reason}")


def test_detection_finds_npus_or_says_why_not(here: list[hwplace.Device]) -> None:
    if not here:
        assert isinstance(here, hwplace.NoDevices)
        assert here.reason.startswith(("no Ascend NPU here: ", f"{MASK_VARIABLE}=")), here.reason
        return
    assert [d.index for d in here] == list(range(len(here)))
    assert all(d.model.startswith("Ascend") for d in here)
    assert all(d.healthy or d.reason for d in here)


def test_the_real_npu_smi_table_is_read(here: list[hwplace.Device]) -> None:
    devices = npus_or_skip(here)
    if shutil.which("npu-smi") is None and not os.access("/usr/local/sbin/npu-smi", os.X_OK):
        pytest.skip("NPUs here, but no npu-smi: found through /dev/davinci* only")
    fell_back = [d for d in devices if d.properties.get("source") != "npu-smi" and "physical_id" in d.properties]
    assert not fell_back, f"npu-smi is here but its output was not used: {fell_back[0].properties.get('npu_smi')}"
    assert all(d.properties.get("memory_bytes", 0) > 2**30 for d in devices if "physical_id" in d.properties)


def test_physical_ids_are_distinct_and_ascending(here: list[hwplace.Device]) -> None:
    devices = [d for d in npus_or_skip(here) if "physical_id" in d.properties]
    ids = [d.properties["physical_id"] for d in devices]
    assert ids == sorted(set(ids))
    assert [d.properties["logical_id"] for d in devices] == [d.index for d in devices]


def test_an_inherited_mask_is_honoured(here: list[hwplace.Device]) -> None:
    devices = [d for d in npus_or_skip(here) if "physical_id" in d.properties]
    last = devices[-1].properties["physical_id"]
    masked = NpuBackend(environ={MASK_VARIABLE: str(last)}).detect([])
    assert [(d.index, d.properties["physical_id"]) for d in masked] == [(0, last)]
    assert NpuBackend().isolation_env(masked) == {MASK_VARIABLE: str(last), RAY_OPT_OUT: "1"}


def test_isolation_leaves_a_process_exactly_its_own_chip(here: list[hwplace.Device]) -> None:
    devices = [d for d in npus_or_skip(here) if d.healthy]
    if not devices:
        pytest.skip("NPUs here, but none healthy")
    if importlib.util.find_spec("torch_npu") is None:
        pytest.skip("torch_npu is not installed: cannot open an NPU from Python here")
    probe = "import torch, torch_npu; print(torch.npu.device_count())"
    for device in {devices[0].index: devices[0], devices[-1].index: devices[-1]}.values():
        env = {**os.environ, **NpuBackend().isolation_env([device])}
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=180,
                              check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "1", (device, done.stdout)


class TestRealNpuConformance(BackendConformance):
    """hwplace's conformance kit on this machine: real NPUs where present, the reason for none where not."""

    plugin = npu
    backend_name = "npu"
