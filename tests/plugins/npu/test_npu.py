"""The Ascend NPU backend, on recorded npu-smi output served by a real (fake) npu-smi and device files in tmp_path."""

from __future__ import annotations

import os
import pickle
import shlex
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

import hwplace
from hwplace.plugin.manager import PluginManager
from hwplace.testing import backend_plugin, fake_cluster
from hwplace.testing.conformance import BackendConformance  # (hwplace.testing loads it lazily: Any to mypy)
from hwplace_plugins import npu
from hwplace_plugins.npu import NpuBackend, smi
from hwplace_plugins.npu.command import Answer, run_all

ISOLATION = "ASCEND_RT_VISIBLE_DEVICES"
OPT_OUT = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
FIXTURES = Path(__file__).parent / "fixtures"

FakeSmi = Callable[..., Path]
DeviceTree = Callable[..., Path]


def recorded(name: str) -> str:
    """A recorded npu-smi answer from ``fixtures/``."""
    return (FIXTURES / name).read_text()


@pytest.fixture
def fake_smi(tmp_path: Path) -> FakeSmi:
    """Writes an executable ``npu-smi`` into tmp_path; returns its path. Each call is logged to ``calls.log``.

    ``info``: what ``npu-smi info`` prints (a fixture name or the text); ``mapping``: what ``npu-smi info -m``
    prints (``None``: it fails with status 2, like a driver without ``-m``); ``status`` and ``stderr``: how
    ``info`` exits; ``hang``: every call starts a child that sleeps and waits for it, holding the pipes.
    """

    def make(info: str = "", *, mapping: str | None = None, status: int = 0, stderr: str = "",
             hang: bool = False, folder: str = "bin") -> Path:
        where = tmp_path / folder
        where.mkdir(parents=True, exist_ok=True)
        texts = {}
        for key, text in (("info", info), ("map", mapping)):
            if text is not None:
                body = recorded(text) if text.endswith(".txt") and "\n" not in text else text
                (where / f"{key}.txt").write_text(body)
                texts[key] = shlex.quote(str(where / f"{key}.txt"))
        lines = ["#!/bin/sh", "PATH=/usr/bin:/bin; export PATH",
                 f'echo "$*" >> {shlex.quote(str(where / "calls.log"))}']
        if hang:
            pids = shlex.quote(str(where / "children.pid"))
            lines += [f"sleep 60 & echo $! >> {pids}", "wait", "exit 0"]
        lines += ['if [ "$1" = info ] && [ "$2" = -m ]; then',
                  f"  cat {texts['map']}; exit 0" if "map" in texts else
                  "  echo 'Error: unknown parameter -m' >&2; exit 2",
                  "fi",
                  f"cat {texts['info']}",
                  f"printf '%s\\n' {shlex.quote(stderr)} >&2" if stderr else ":",
                  f"exit {status}"]
        tool = where / "npu-smi"
        tool.write_text("\n".join(lines) + "\n")
        tool.chmod(0o755)
        return tool

    return make


@pytest.fixture
def device_tree(tmp_path: Path) -> DeviceTree:
    """Writes ``dev/davinciN`` (and ``dev/davinci_manager`` unless told not to) under a root; returns the root."""

    def make(numbers: Iterable[int], *, manager: bool = True, root: str = "root") -> Path:
        dev = tmp_path / root / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        for number in numbers:
            (dev / f"davinci{number}").touch()
        for name in (["davinci_manager"] if manager else []) + ["devmm_svm", "hisi_hdc", "null"]:
            (dev / name).touch()
        return tmp_path / root

    return make


def backend(tool: Path | str, root: Path | str = "/nonexistent-root", mask: str | None = None,
            timeout: float = 5.0) -> NpuBackend:
    return NpuBackend(root, tool, timeout=timeout, environ={} if mask is None else {ISOLATION: mask})


def summary(devices: list[hwplace.Device]) -> list[tuple[int, int, bool]]:
    return [(d.index, d.properties["physical_id"], d.healthy) for d in devices]


# -- reading npu-smi's tables --------------------------------------------------------------------------------


def test_an_atlas_800t_a2_table_reads_as_eight_910b3_chips() -> None:
    chips = smi.parse_info(recorded("atlas800t_a2_910b3_x8.txt"))
    assert [(c.npu_id, c.chip_id, c.name, c.health) for c in chips] == [(i, 0, "910B3", "OK") for i in range(8)]
    assert [c.bus_id for c in chips[:3]] == ["0000:C1:00.0", "0000:C2:00.0", "0000:81:00.0"]
    assert {c.hbm_mib for c in chips} == {65536}
    assert {c.memory_mib for c in chips} == {None}  # 0 / 0: not shown on this model
    assert {(c.device_id, c.phy_id) for c in chips} == {(None, None)}


def test_the_process_table_is_not_read_as_chips() -> None:
    chips = smi.parse_info(recorded("atlas800t_a2_910b3_x8_one_alarm.txt"))  # two running processes listed
    assert len(chips) == 8
    assert [c.health for c in chips] == ["OK", "OK", "Warning", "OK", "OK", "Alarm", "OK", "OK"]


def test_dual_die_and_device_column_layouts() -> None:
    a3 = smi.parse_info(recorded("a3_910c_2cards.txt"))
    assert [(c.npu_id, c.chip_id, c.phy_id, c.health) for c in a3] == [
        (0, 0, 0, "OK"), (0, 1, 1, "OK"), (1, 0, 2, "OK"), (1, 1, 3, "Critical")]
    duo = smi.parse_info(recorded("atlas300i_duo_310p3.txt"))
    assert [(c.npu_id, c.chip_id, c.device_id, c.memory_mib, c.hbm_mib) for c in duo] == [
        (8, 0, 0, 44280, None), (8, 1, 1, 43693, None), (9, 0, 2, 44280, None), (9, 1, 3, 43693, None)]


def test_the_chip_map_leaves_out_the_mcus() -> None:
    assert smi.parse_map(recorded("atlas800t_a2_910b3_x8_map.txt")) == {(i, 0): i for i in range(8)}
    assert smi.parse_map(recorded("a3_910c_2cards_map.txt")) == {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3}


HEADER = recorded("atlas800t_a2_910b3_x8.txt").splitlines()[:6]
ROW_A = "| 0     910B3               | OK            | 95.3        35                0    / 0             |"
ROW_B = "| 0                         | 0000:C1:00.0  | 0           0    / 0          3396 / 65536         |"


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ([], "the answer is empty"),
        (["dcmi model initialized failed, because the device is used. ret is -8020"],
         "no 'NPU Name | Health' table header; it begins 'dcmi model initialized failed"),
        (HEADER[:4], "line 5: the second header line"),
        ([*HEADER, ROW_A], "line 7: NPU 0 has no chip line after it"),
        ([*HEADER, ROW_A, HEADER[2]], "line 7: NPU 0 has no chip line after it"),
        ([*HEADER, ROW_A.replace("| 0     910B3", "| x     910B3"), ROW_B], "line 7: the NPU id is 'x', not a number"),
        ([*HEADER, ROW_A, ROW_B.replace("0000:C1:00.0", "C1 garbage  ")], "bus id 'C1 garbage' of NPU 0 is not"),
        ([*HEADER, ROW_A, ROW_B.replace("3396 / 65536", "3396 /      ")], "expected memory and HBM usage"),
        ([*HEADER, ROW_A, ROW_B + " extra |"], "line 8: 4 cells where a chip line has 3"),
        ([*HEADER, ROW_A, ROW_B, ROW_A, ROW_B], "NPU 0 chip 0 is listed twice"),
        ([*HEADER, ROW_A.replace("| OK ", "| O K"), ROW_B], "line 7: health is 'O K"),
    ],
    ids=["empty", "driver-error", "one-header", "cut-short", "no-chip-line", "npu-id", "bus-id", "memory",
         "cells", "twice", "health"],
)
def test_a_garbled_table_is_refused_saying_where(lines: list[str], problem: str) -> None:
    with pytest.raises(smi.SmiFormatError, match=problem.replace("|", r"\|").replace("(", r"\(")):
        smi.parse_info("\n".join(lines))


def test_the_recorded_garbled_answer_is_refused_at_the_driver_message() -> None:
    with pytest.raises(smi.SmiFormatError, match=r"line 11: 'dcmi get device memory info failed\. ret is -8005'"):
        smi.parse_info(recorded("garbled.txt"))


def test_a_header_without_chips_reads_as_none() -> None:
    assert smi.parse_info("\n".join(HEADER)) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "no 'NPU ID  Chip ID  Chip Logic ID' header"),
        ("NPU ID Chip ID Chip Logic ID Chip Name\n0 0\n", "expected 'NPU ID, Chip ID, Chip Logic ID, Chip Name'"),
        ("NPU ID Chip ID Chip Logic ID Chip Name\n0 0 x Ascend\n", "the Chip Logic ID is 'x', not a number"),
        ("NPU ID Chip ID Chip Logic ID Chip Name\n0 0 0 Ascend\n1 0 0 Ascend\n", "Chip Logic ID 0 is given to two"),
        ("NPU ID Chip ID Chip Logic ID Chip Name\n0 0 0 Ascend\n0 0 1 Ascend\n", "NPU 0 chip 0 is listed twice"),
    ],
)
def test_a_garbled_chip_map_is_refused(text: str, problem: str) -> None:
    with pytest.raises(smi.SmiFormatError, match=problem):
        smi.parse_map(text)


# -- detection through npu-smi ---------------------------------------------------------------------------------


def test_an_eight_chip_box_is_detected_through_npu_smi(fake_smi: FakeSmi) -> None:
    tool = fake_smi("atlas800t_a2_910b3_x8.txt", mapping="atlas800t_a2_910b3_x8_map.txt")
    devices = backend(tool).detect([])
    assert summary(devices) == [(i, i, True) for i in range(8)]
    assert {d.model for d in devices} == {"Ascend 910B3"}
    first = devices[0].properties
    assert (first["memory_bytes"], first["bus_id"], first["health"]) == (64 * 2**30, "0000:C1:00.0", "OK")
    assert (first["source"], first["id_source"], first["logical_id"]) == (
        "npu-smi", "npu-smi info -m (Chip Logic ID)", 0)
    assert sorted((tool.parent / "calls.log").read_text().splitlines()) == ["info", "info -m"]


def test_a_chip_in_alarm_is_unhealthy_and_says_why(fake_smi: FakeSmi) -> None:
    tool = fake_smi("atlas800t_a2_910b3_x8_one_alarm.txt", mapping="atlas800t_a2_910b3_x8_map.txt")
    devices = backend(tool).detect([])
    assert [d.index for d in devices if not d.healthy] == [5]
    assert devices[5].reason == ("NPU 5 chip 0 (0000:02:00.0): npu-smi reports health Alarm; "
                                 "`npu-smi info -t health -i 5 -c 0` shows the alarm codes")
    assert devices[2].healthy
    assert "health Warning (a minor alarm" in devices[2].reason
    assert devices[5].properties["health"] == "Alarm"


def test_a_dual_die_box_numbers_dies_by_chip_logic_id(fake_smi: FakeSmi) -> None:
    devices = backend(fake_smi("a3_910c_2cards.txt", mapping="a3_910c_2cards_map.txt")).detect([])
    assert summary(devices) == [(0, 0, True), (1, 1, True), (2, 2, True), (3, 3, False)]
    assert [(d.properties["npu_id"], d.properties["chip_id"], d.properties["chip_phy_id"]) for d in devices] == [
        (0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)]
    assert devices[0].model == "Ascend910"
    assert "health Critical" in devices[3].reason


def test_without_a_chip_map_ids_come_from_the_device_column_or_the_position(fake_smi: FakeSmi) -> None:
    duo = backend(fake_smi("atlas300i_duo_310p3.txt", folder="duo")).detect([])  # NPU ids 8 and 9, no -m
    assert summary(duo) == [(i, i, True) for i in range(4)]
    assert [d.properties["npu_id"] for d in duo] == [8, 8, 9, 9]
    assert duo[0].properties["memory_bytes"] == 44280 * 2**20
    assert duo[0].properties["id_source"].startswith("the Device column of npu-smi info (")
    assert "info -m exited with status 2: Error: unknown parameter -m" in duo[0].properties["id_source"]
    plain = backend(fake_smi("atlas800t_a2_910b3_x8.txt", folder="plain")).detect([])
    assert summary(plain) == [(i, i, True) for i in range(8)]
    assert plain[0].properties["id_source"].startswith("position in npu-smi info (")


def test_a_chip_map_that_misses_a_chip_is_not_half_believed(fake_smi: FakeSmi) -> None:
    partial = "\n".join(recorded("atlas800t_a2_910b3_x8_map.txt").splitlines()[:-2])  # NPU 7 left out
    devices = backend(fake_smi("atlas800t_a2_910b3_x8.txt", mapping=partial)).detect([])
    assert summary(devices) == [(i, i, True) for i in range(8)]
    assert "gives no Chip Logic ID for NPU 7 chip 0" in devices[0].properties["id_source"]


def test_renumbered_logic_ids_are_what_the_devices_carry(fake_smi: FakeSmi) -> None:
    """NPU ids need not be runtime ids: a VM with cards 8 and 9 has chips 0 and 1."""
    info = "\n".join([*HEADER, ROW_A.replace("| 0 ", "| 9 "), ROW_B, ROW_A.replace("| 0 ", "| 8 "), ROW_B])
    mapping = "NPU ID  Chip ID  Chip Logic ID  Chip Name\n8 0 0 Ascend910B3\n8 1 - Mcu\n9 0 1 Ascend910B3\n"
    devices = backend(fake_smi(info, mapping=mapping)).detect([])
    assert [(d.index, d.properties["npu_id"], d.properties["physical_id"]) for d in devices] == [(0, 8, 0), (1, 9, 1)]


# -- physical and logical ids: an inherited mask -----------------------------------------------------------------


def test_an_inherited_mask_restricts_the_node_and_keeps_physical_ids(fake_smi: FakeSmi) -> None:
    tool = fake_smi("atlas800t_a2_910b3_x8.txt", mapping="atlas800t_a2_910b3_x8_map.txt")
    npus = backend(tool, mask="4,5,6,7")
    devices = npus.detect([])
    assert [(d.index, d.properties["logical_id"], d.properties["physical_id"]) for d in devices] == [
        (0, 0, 4), (1, 1, 5), (2, 2, 6), (3, 3, 7)]
    assert [d.properties["bus_id"] for d in devices] == ["0000:01:00.0", "0000:02:00.0", "0000:41:00.0", "0000:42:00.0"]
    # the classic failure would be "0,1": the node's chips 0 and 1, which the mask took away
    assert npus.isolation_env(devices[:2]) == {ISOLATION: "4,5", OPT_OUT: "1"}
    assert npus.isolation_env([devices[3]]) == {ISOLATION: "7", OPT_OUT: "1"}


def test_the_mask_is_read_from_the_environment_by_default(fake_smi: FakeSmi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ISOLATION, "1,3")
    devices = NpuBackend("/nonexistent-root", fake_smi("atlas800t_a2_910b3_x8.txt"), timeout=5).detect([])
    assert summary(devices) == [(0, 1, True), (1, 3, True)]


@pytest.mark.parametrize(
    ("mask", "expected", "problem"),
    [
        ("4,9", [(0, 4, True)], "entry 1 (9) names no NPU of this node (physical ids here: 0-7)"),
        ("4,x,6", [(0, 4, True), (2, 6, True)], "entry 1 ('x') is not a device id"),
        ("4, 5", [(0, 4, True)], "entry 1 (' 5') is not a device id"),
        ("4,,5", [(0, 4, True), (2, 5, True)], "entry 1 ('') is not a device id"),
        ("-1,4", [(1, 4, True)], "entry 0 ('-1') is not a device id"),
        ("4,4", [(0, 4, True)], "entry 1 (4) repeats physical id 4 (entry 0)"),
        ("5,4", [(0, 5, True)], "entry 1 (4) comes after 5: the Ascend runtime accepts ids in ascending order only"),
    ],
)
def test_a_bad_mask_entry_is_an_unhealthy_device_naming_it(
    fake_smi: FakeSmi, mask: str, expected: list[tuple[int, int, bool]], problem: str
) -> None:
    devices = backend(fake_smi("atlas800t_a2_910b3_x8.txt"), mask=mask).detect([])
    assert [(d.index, d.properties["physical_id"], d.healthy) for d in devices if d.healthy] == expected
    (bad,) = [d for d in devices if not d.healthy]
    assert bad.reason.startswith(f"ASCEND_RT_VISIBLE_DEVICES={mask!r}: {problem}")
    assert "physical_id" not in bad.properties
    with pytest.raises(ValueError, match=rf"npu device {bad.index} is the bad ASCEND_RT_VISIBLE_DEVICES entry"):
        NpuBackend().isolation_env([bad])


@pytest.mark.parametrize("mask", ["", " ", "NoDevFiles"])
def test_a_mask_that_hides_everything_says_so_and_names_the_ray_opt_out(fake_smi: FakeSmi, mask: str) -> None:
    found = backend(fake_smi("atlas800t_a2_910b3_x8.txt"), mask=mask).detect([])
    assert isinstance(found, hwplace.NoDevices)
    assert found == []
    assert found.reason.startswith(f"ASCEND_RT_VISIBLE_DEVICES={mask!r} hides every NPU from this process")
    assert "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1" in found.reason


def test_an_absurdly_long_mask_is_refused_before_anything_is_built(fake_smi: FakeSmi) -> None:
    found = backend(fake_smi("atlas800t_a2_910b3_x8.txt"), mask="0," * 100_000).detect([])
    assert isinstance(found, hwplace.NoDevices)
    assert "has 100001 entries; a node has at most 4096 NPUs" in found.reason
    assert len(found.reason) < 300


# -- when npu-smi fails: device files ----------------------------------------------------------------------------


def test_a_hanging_npu_smi_is_killed_with_its_children_and_device_files_stand_in(
    fake_smi: FakeSmi, device_tree: DeviceTree
) -> None:
    tool = fake_smi(hang=True)
    devices = backend(tool, device_tree(range(8)), timeout=0.5).detect([])
    assert summary(devices) == [(i, i, True) for i in range(8)]
    assert devices[0].properties["npu_smi"] == f"{tool} info did not answer within 0.5 s and was killed"
    for pid in map(int, (tool.parent / "children.pid").read_text().split()):  # the sleeps holding the pipes
        assert _gone(pid), f"npu-smi's child {pid} still runs"


def _gone(pid: int) -> bool:
    """The process has ended (a zombie nobody has reaped yet counts as ended)."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_a_hanging_npu_smi_stays_within_the_cores_detect_bound(
    fake_smi: FakeSmi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HWPLACE_DETECT_TIMEOUT", "2")
    hanging = NpuBackend("/nonexistent-root", fake_smi(hang=True), environ={})
    assert hanging.smi_timeout() == 1.0
    manager = PluginManager(load_entry_points=False)
    manager.register(backend_plugin(hanging), name="npu-hanging")
    detection = manager.detect("npu")
    assert detection.error is None
    assert detection.seconds < 2
    assert detection.absent is not None
    assert "info did not answer within 1 s and was killed; and no /dev/davinci* found" in detection.absent


def test_npu_smi_exiting_with_an_error_falls_back_to_device_files(fake_smi: FakeSmi, device_tree: DeviceTree) -> None:
    tool = fake_smi(status=255, stderr="dcmi model initialized failed, because the device is used. ret is -8020")
    devices = backend(tool, device_tree([0, 1])).detect([])
    assert summary(devices) == [(0, 0, True), (1, 1, True)]
    assert devices[0].properties["npu_smi"] == (
        f"{tool} info exited with status 255: dcmi model initialized failed, because the device is used. ret is -8020")
    assert devices[1].model == "Ascend NPU (model unknown)"
    assert devices[1].properties["device_file"] == "/dev/davinci1"


def test_garbled_npu_smi_output_falls_back_to_device_files_and_says_why(
    fake_smi: FakeSmi, device_tree: DeviceTree
) -> None:
    devices = backend(fake_smi("garbled.txt"), device_tree(range(8))).detect([])
    assert len(devices) == 8
    assert all(d.healthy and d.properties["source"] == "device-files" for d in devices)
    assert "printed no table hwplace can read (line 11: 'dcmi get device memory info failed" in (
        devices[0].properties["npu_smi"])


def test_without_npu_smi_device_files_are_counted_and_the_model_is_unknown(device_tree: DeviceTree,
                                                                           tmp_path: Path) -> None:
    devices = backend(tmp_path / "no-such-npu-smi", device_tree(range(4))).detect([])
    assert summary(devices) == [(i, i, True) for i in range(4)]
    assert {d.model for d in devices} == {"Ascend NPU (model unknown)"}
    assert devices[0].properties["npu_smi"] == f"npu-smi not found: not at {tmp_path / 'no-such-npu-smi'}"


def test_a_device_file_name_with_a_final_newline_is_not_a_device(device_tree: DeviceTree, tmp_path: Path) -> None:
    root = device_tree(range(2))
    (root / "dev" / "davinci7\n").touch()  # "$" matched before the newline: it counted as chip 7
    devices = backend(tmp_path / "no-such-npu-smi", root).detect([])
    assert summary(devices) == [(0, 0, True), (1, 1, True)]
    assert smi.BUS_ID.match("0000:C1:00.0") is not None  # the bus id column is stripped: only the pattern shows it
    assert smi.BUS_ID.match("0000:C1:00.0\n") is None


def test_device_files_without_the_manager_are_unhealthy(device_tree: DeviceTree) -> None:
    devices = backend("no-such-npu-smi", device_tree([0, 1], manager=False)).detect([])
    assert [d.healthy for d in devices] == [False, False]
    assert devices[0].reason == ("/dev/davinci_manager is missing: the Ascend driver is not loaded, or this container "
                                 "does not mount it")


def test_a_container_with_chips_4_to_7_numbers_them_from_0(device_tree: DeviceTree) -> None:
    """The runtime counts the chips it can reach: /dev/davinci4..7 are its devices 0..3."""
    root = device_tree([4, 5, 6, 7])
    devices = backend("no-such-npu-smi", root).detect([])
    assert [(d.properties["physical_id"], d.properties["device_file"]) for d in devices] == [
        (i, f"/dev/davinci{i + 4}") for i in range(4)]
    masked = backend("no-such-npu-smi", root, mask="4").detect([])
    assert [d.healthy for d in masked] == [False]
    assert "entry 0 (4) names no NPU of this node (physical ids here: 0-3)" in masked[0].reason


def test_neither_npu_smi_nor_device_files_means_no_npu_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "davinci_manager").touch()  # the driver's manager alone is no chip
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    absent = NpuBackend(tmp_path, environ={}).detect([])
    assert isinstance(absent, hwplace.NoDevices)
    assert absent.reason == "no Ascend NPU here: neither npu-smi nor /dev/davinci* found"
    named = backend("no-such-npu-smi", tmp_path).detect([])
    assert isinstance(named, hwplace.NoDevices)
    assert named.reason == ("no Ascend NPU here: neither npu-smi nor /dev/davinci* found "
                            "(npu-smi not found: no 'no-such-npu-smi' on PATH)")


def test_a_failing_npu_smi_without_device_files_says_both(fake_smi: FakeSmi, tmp_path: Path) -> None:
    found = backend(fake_smi(status=3, stderr="Error: driver not loaded"), tmp_path / "empty-root").detect([])
    assert isinstance(found, hwplace.NoDevices)
    assert found.reason.endswith("info exited with status 3: Error: driver not loaded; and no /dev/davinci* found")
    empty = backend(fake_smi("\n".join(HEADER), folder="empty"), tmp_path / "empty-root").detect([])
    assert isinstance(empty, hwplace.NoDevices)
    assert empty.reason.endswith("info lists no NPU chip; and no /dev/davinci* found")


def test_an_npu_smi_that_cannot_be_run_is_reported(tmp_path: Path, device_tree: DeviceTree) -> None:
    tool = tmp_path / "npu-smi"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o644)  # not executable
    devices = backend(tool, device_tree([0])).detect([])
    assert devices[0].properties["npu_smi"].startswith(f"{tool} info could not be started: ")
    assert "ermission denied" in devices[0].properties["npu_smi"]


def test_npu_smi_is_found_on_path_then_where_the_driver_installs_it(
    fake_smi: FakeSmi, device_tree: DeviceTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = fake_smi("atlas800t_a2_910b3_x8.txt")
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert len(NpuBackend("/nonexistent-root", environ={}, timeout=5).detect([])) == 8
    monkeypatch.setenv("PATH", "/nonexistent-bin")
    root = device_tree([0])
    (root / "usr/local/sbin").mkdir(parents=True)
    (root / "usr/local/sbin/npu-smi").write_bytes(tool.read_bytes())
    (root / "usr/local/sbin/npu-smi").chmod(0o755)
    found = NpuBackend(root, environ={}, timeout=5).detect([])
    assert [d.properties["source"] for d in found] == ["npu-smi"] * 8


def test_a_bad_timeout_is_refused_by_name() -> None:
    for bad in (0, -1, float("nan"), True, "5"):
        with pytest.raises(ValueError, match=r"NpuBackend\(timeout=\) takes seconds above 0, at most 3600"):
            NpuBackend(timeout=bad)  # type: ignore[arg-type]


def test_the_npu_smi_time_bound_follows_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPLACE_DETECT_TIMEOUT", raising=False)
    assert NpuBackend().smi_timeout() == 5.0
    monkeypatch.setenv("HWPLACE_DETECT_TIMEOUT", "3")
    assert NpuBackend().smi_timeout() == 1.5
    monkeypatch.setenv("HWPLACE_DETECT_TIMEOUT", "nonsense")
    assert NpuBackend().smi_timeout() == 5.0
    assert NpuBackend(timeout=0.25).smi_timeout() == 0.25


def test_run_all_reports_every_way_a_command_goes_wrong(tmp_path: Path) -> None:
    answers = run_all([["/bin/sh", "-c", "echo out; echo err >&2; exit 4"], [str(tmp_path / "missing")],
                       ["/bin/sh", "-c", "sleep 30"]], timeout=0.5)
    assert answers[0] == Answer(4, "out\n", "err\n")
    assert isinstance(answers[1], str)
    assert answers[1].startswith(f"{tmp_path / 'missing'} could not be started: ")
    assert answers[2] == "/bin/sh -c sleep 30 did not answer within 0.5 s and was killed"


# -- isolation and planning ----------------------------------------------------------------------------------


def test_isolation_names_physical_ids_and_falls_back_to_the_index_for_planned_devices() -> None:
    detected = [hwplace.Device(0, "Ascend 910B3", properties={"physical_id": 6}),
                hwplace.Device(1, "Ascend 910B3", properties={"physical_id": 7})]
    assert NpuBackend().isolation_env(detected) == {ISOLATION: "6,7", OPT_OUT: "1"}
    planned = [hwplace.Device(2, "planned npu"), hwplace.Device(3, "planned npu")]
    assert NpuBackend().isolation_env(planned) == {ISOLATION: "2,3", OPT_OUT: "1"}
    assert NpuBackend().isolation_env([]) == {ISOLATION: "", OPT_OUT: "1"}


@pytest.mark.parametrize("physical", ["4", -1, True, 2.0, None])
def test_a_device_with_a_bad_physical_id_is_refused_by_name(physical: object) -> None:
    device = hwplace.Device(3, "Ascend 910B3", properties={"physical_id": physical})
    with pytest.raises(ValueError, match=r"npu device 3: its physical_id is .*, not a non-negative integer"):
        NpuBackend().isolation_env([device])


def test_planning_offline_on_npu_nodes() -> None:
    cluster = fake_cluster({"num_nodes": 2}, accelerators_per_node=8, accelerator_type="npu")
    placements = hwplace.PackedPlacementStrategy(0, 15, num_accelerators_per_process=2).get_placement(cluster)
    assert len(placements) == 8
    assert placements[1].env == {ISOLATION: "2,3", OPT_OUT: "1"}
    assert placements[5].node_rank == 1
    assert placements[5].env == {ISOLATION: "2,3", OPT_OUT: "1"}
    assert {p.hardware_type for p in placements} == {"npu"}


def test_memory_per_phase_is_checked_against_each_npus_hbm(fake_smi: FakeSmi) -> None:
    devices = backend(fake_smi("atlas800t_a2_910b3_x8.txt", folder="plain")).detect([])
    capacity = devices[0].properties["memory_bytes"]
    node = hwplace.Node(0, "npu-node", "npu-node", {"npu": tuple(devices), "node": (hwplace.Device(0, "node"),)})
    cluster = hwplace.Cluster(nodes=[node])
    config: dict[str, Any] = {"cluster": {"num_nodes": 1, "component_placement": {"actor,rollout": "0-7"}},
              "resources": {"actor": {"memory": {"train": capacity - 2**30, "offloaded": "1GiB"}},
                            "rollout": {"memory": {"generate": "20GiB", "offloaded": "1GiB"}}}}
    plan = hwplace.ComponentPlacement(config, cluster)
    assert {(d.capacity, d.headroom) for d in plan.memory} == {(capacity, 0)}
    config["resources"]["rollout"]["memory"]["offloaded"] = 2**30 + 1  # one byte more than the HBM
    with pytest.raises(hwplace.PlacementError, match=r"^npu 0 of node 0 does not hold its peak: .* when actor is in "
                                                     r"phase 'train' beside rollout .*; 7 more devices do not fit"):
        hwplace.ComponentPlacement(config, cluster)


def test_detected_devices_are_plain_data_and_picklable(fake_smi: FakeSmi) -> None:
    devices = backend(fake_smi("atlas800t_a2_910b3_x8_one_alarm.txt"), mask="4,5").detect([])
    assert pickle.loads(pickle.dumps(devices)) == devices
    assert devices[1].reason.startswith("NPU 5 chip 0")


def test_the_backend_is_registered_through_its_entry_point() -> None:
    info = PluginManager().backend("npu")
    assert (info.name, info.kind, info.plugin) == ("npu", "accelerator", "npu")
    assert isinstance(info.backend, NpuBackend)
    assert [type(b) for b in npu.hwplace_hardware_backends()] == [NpuBackend]


class TestNpuConformanceOnARecordedBox(BackendConformance):
    """hwplace's conformance kit, with a fake npu-smi of the eight-chip box first on PATH."""

    plugin = npu
    backend_name = "npu"

    @pytest.fixture(autouse=True)
    def _recorded_box(self, fake_smi: FakeSmi, monkeypatch: pytest.MonkeyPatch) -> None:
        tool = fake_smi("atlas800t_a2_910b3_x8_one_alarm.txt", mapping="atlas800t_a2_910b3_x8_map.txt")
        monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}")
        monkeypatch.delenv(ISOLATION, raising=False)
