"""Huawei Ascend NPUs: found through the driver's tool ``npu-smi``, or its device files ``/dev/davinciN``.

Detection runs ``npu-smi info`` (models, health, HBM) and ``npu-smi info -m`` (which runtime device id each
chip has) side by side, under a hard time bound. When npu-smi is missing, fails, hangs or prints something
that is not its table, the device files stand in (model unknown, and the properties say why), and when
there are neither, ``detect`` says so. A mask the node already has (``ASCEND_RT_VISIBLE_DEVICES``) is
honoured: devices are numbered in its (logical) order and keep their physical ids, which is what isolation
writes back (see :mod:`hwplace_plugins.npu.mask`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import hwplace
from hwplace_plugins.npu import mask, smi
from hwplace_plugins.npu.command import Answer, run_all
from hwplace_plugins.npu.mask import MASK_VARIABLE, RAY_OPT_OUT, Chip

__all__ = ["MASK_VARIABLE", "RAY_OPT_OUT", "NpuBackend", "hwplace_hardware_backends"]

DEFAULT_TIMEOUT = 5.0  # seconds for npu-smi; at most half the core's detect bound (HWPLACE_DETECT_TIMEOUT)
SMI_LOCATIONS = ("usr/local/sbin/npu-smi", "usr/local/bin/npu-smi")  # where the driver installs it, off PATH
DEVICE_FILE = re.compile(r"^davinci(\d{1,6})\Z")
MANAGER_FILE = "davinci_manager"
UNKNOWN_MODEL = "Ascend NPU (model unknown)"


def _model(name: str) -> str:
    return name if name.lower().startswith("ascend") else f"Ascend {name}"


class NpuBackend(hwplace.HardwareBackend):
    """Ascend NPUs of this node.

    ``root`` is where ``dev/`` is looked for (``/`` on a node, a folder in tests); ``npu_smi`` the tool to
    run (by default ``npu-smi`` on ``PATH``, else the driver's install location under ``root``);
    ``timeout`` the seconds npu-smi gets (default: 5, or half of ``HWPLACE_DETECT_TIMEOUT`` if less);
    ``environ`` where the inherited mask is read (default ``os.environ``, read at each detection).
    """

    name = "npu"
    kind = "accelerator"
    collective_backend = "hccl"

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        npu_smi: str | os.PathLike[str] | None = None,
        *,
        timeout: float | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                    or not 0 < timeout <= 3600):
            raise ValueError(f"NpuBackend(timeout=) takes seconds above 0, at most 3600, got {timeout!r}")
        self.root = Path(root)
        self.npu_smi = None if npu_smi is None else os.fspath(npu_smi)
        self.timeout = timeout
        self.environ = environ

    # -- detection -----------------------------------------------------------------------------------------

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        environ = os.environ if self.environ is None else self.environ
        chips, smi_problem = self._from_npu_smi()
        if chips is None:
            files, files_problem = self._from_device_files(smi_problem)
            if not files:
                if smi_problem.startswith("npu-smi not found") and not files_problem:
                    return hwplace.NoDevices("no Ascend NPU here: neither npu-smi nor /dev/davinci* found"
                                             + ("" if self.npu_smi is None else f" ({smi_problem})"))
                return hwplace.NoDevices(f"no Ascend NPU here: {smi_problem}; "
                                         f"{files_problem or 'and no /dev/davinci* found'}")
            chips = files
        return mask.apply_mask(chips, environ.get(MASK_VARIABLE))

    def smi_timeout(self) -> float:
        """The seconds npu-smi gets: ``timeout``, else 5 or half the core's detect bound, whichever is less."""
        if self.timeout is not None:
            return float(self.timeout)
        try:
            bound = hwplace.executor.detect_timeout()
        except hwplace.PluginError:  # a bad HWPLACE_DETECT_TIMEOUT: the core reports it; npu-smi keeps its default
            return DEFAULT_TIMEOUT
        return min(DEFAULT_TIMEOUT, bound / 2)

    def _find_smi(self) -> tuple[str | None, str]:
        """The npu-smi to run, or ``None`` and where it was looked for."""
        if self.npu_smi is not None:
            if os.sep in self.npu_smi:
                return (self.npu_smi, "") if os.path.exists(self.npu_smi) else (None, f"not at {self.npu_smi}")
            return shutil.which(self.npu_smi), f"no {self.npu_smi!r} on PATH"
        found = shutil.which("npu-smi")
        if found:
            return found, ""
        places = [self.root / p for p in SMI_LOCATIONS]
        return next((str(p) for p in places if p.is_file()), None), "not on PATH, nor in /usr/local/{sbin,bin}"

    def _from_npu_smi(self) -> tuple[list[Chip] | None, str]:
        """The chips npu-smi lists, or ``None`` and why npu-smi cannot be used ("npu-smi not found ..." if absent)."""
        tool, looked = self._find_smi()
        if tool is None:
            return None, f"npu-smi not found: {looked}"
        info, table = run_all([[tool, "info"], [tool, "info", "-m"]], self.smi_timeout())
        if isinstance(info, str):
            return None, info
        if info.returncode != 0:
            return None, f"{tool} info exited with status {info.returncode}: {info.first_words()}"
        try:
            found = smi.parse_info(info.stdout)
        except smi.SmiFormatError as exc:
            return None, f"{tool} info printed no table hwplace can read ({exc})"
        if not found:
            return None, f"{tool} info lists no NPU chip"
        logic, id_source = self._logic_ids(found, table, tool)
        return [self._chip(c, logic[i], id_source) for i, c in enumerate(found)], ""

    @staticmethod
    def _logic_ids(found: list[smi.SmiChip], table: Answer | str, tool: str) -> tuple[list[int], str]:
        """Each chip's runtime device id, and where it came from.

        ``npu-smi info -m`` (Chip Logic ID) when it answers for every chip; else the ``Device`` column of
        ``npu-smi info`` where the table has one; else the chip's position in the table, which is how the
        runtime numbers the chips it can reach.
        """
        if isinstance(table, str):
            why = table
        elif table.returncode != 0:
            why = f"{tool} info -m exited with status {table.returncode}: {table.first_words()}"
        else:
            try:
                mapping = smi.parse_map(table.stdout)
            except smi.SmiFormatError as exc:
                mapping, why = {}, f"{tool} info -m printed no table hwplace can read ({exc})"
            else:
                missing = next((c for c in found if (c.npu_id, c.chip_id) not in mapping), None)
                if missing is None:
                    return [mapping[(c.npu_id, c.chip_id)] for c in found], "npu-smi info -m (Chip Logic ID)"
                why = f"{tool} info -m gives no Chip Logic ID for NPU {missing.npu_id} chip {missing.chip_id}"
        column = [c.device_id for c in found]
        if all(d is not None for d in column) and len(set(column)) == len(column):
            return [d for d in column if d is not None], f"the Device column of npu-smi info ({why})"
        return list(range(len(found))), f"position in npu-smi info ({why})"

    @staticmethod
    def _chip(found: smi.SmiChip, physical_id: int, id_source: str) -> Chip:
        properties: dict[str, Any] = {
            "source": "npu-smi", "id_source": id_source, "npu_id": found.npu_id, "chip_id": found.chip_id,
            "chip_name": found.name, "health": found.health, "bus_id": found.bus_id,
        }
        total = found.hbm_mib or found.memory_mib
        if total:
            properties["memory_bytes"] = total * smi.MIB
        if found.phy_id is not None:
            properties["chip_phy_id"] = found.phy_id
        if found.device_id is not None:
            properties["smi_device_id"] = found.device_id
        where = f"NPU {found.npu_id} chip {found.chip_id} ({found.bus_id})"
        if found.health == "OK":
            return Chip(physical_id, _model(found.name), properties=properties)
        check = f"`npu-smi info -t health -i {found.npu_id} -c {found.chip_id}` shows the alarm codes"
        if found.health in smi.HEALTHY:
            return Chip(physical_id, _model(found.name), True,
                        f"{where}: npu-smi reports health {found.health} (a minor alarm; the chip still works); "
                        f"{check}", properties)
        return Chip(physical_id, _model(found.name), False,
                    f"{where}: npu-smi reports health {found.health}; {check}", properties)

    def _from_device_files(self, smi_problem: str) -> tuple[list[Chip], str]:
        """The chips ``/dev/davinciN`` shows (physical ids by position, as the runtime numbers them), or why none."""
        dev = self.root / "dev"
        try:
            names = [entry.name for entry in os.scandir(dev)]
        except FileNotFoundError:
            return [], ""
        except OSError as exc:
            return [], f"/dev cannot be listed ({exc.strerror or exc})"
        numbers = sorted(int(m.group(1)) for m in map(DEVICE_FILE.match, names) if m)
        if not numbers:
            return [], ""
        healthy = MANAGER_FILE in names
        reason = "" if healthy else (f"/dev/{MANAGER_FILE} is missing: the Ascend driver is not loaded, or this "
                                     "container does not mount it")
        return [
            Chip(position, UNKNOWN_MODEL, healthy, reason, {
                "source": "device-files", "id_source": "position among /dev/davinci*",
                "device_file": f"/dev/davinci{number}", "npu_smi": smi_problem,
            })
            for position, number in enumerate(numbers)
        ], ""

    # -- isolation -----------------------------------------------------------------------------------------

    def isolation_env(self, devices: Sequence[hwplace.Device]) -> dict[str, str]:
        """``ASCEND_RT_VISIBLE_DEVICES`` = the devices' physical ids (index for planned devices), plus
        ``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1`` so Ray does not overwrite it."""
        return mask.isolation_env(devices)


@hwplace.hookimpl
def hwplace_hardware_backends() -> list[hwplace.HardwareBackend]:
    return [NpuBackend()]
