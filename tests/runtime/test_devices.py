"""A pair's GPU side without a GPU (hwplace.runtime.messaging.devices): the device received tensors land on,
the GPU behind a device, the NCCL groups' settings, and a transfer whose peer died."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

import hwplace
from hwplace.contracts.records import Placement
from hwplace.runtime.messaging import devices
from hwplace.runtime.messaging.devices import chosen_device, nccl_groups, own_device, physical_id, wait_work

SECTION = {"num_nodes": 1, "component_placement": {"four": "0-3"}}


def placements(isolate: bool) -> dict[str, list[Placement]]:
    cluster = hwplace.testing.fake_cluster(SECTION, accelerators_per_node=4)
    plan = hwplace.ComponentPlacement({"cluster": SECTION}, cluster)
    return {name: plan.get_strategy(name).get_placement(cluster, isolate_accelerator=isolate)
            for name in ("four",)}


def test_received_tensors_land_on_the_device_the_worker_chose_else_on_its_first_own() -> None:
    isolated, shared = placements(True), placements(False)
    assert own_device(isolated["four"][2], None) == 0  # GPU 2, seen as cuda:0
    assert own_device(shared["four"][2], None) == 2  # all four seen: its own is cuda:2
    assert own_device(shared["four"][3], None) == 3
    assert own_device(isolated["four"][2], 1) == 1  # torch.cuda.set_device(1) in the worker
    assert own_device(shared["four"][2], 0) == 0


def fake_torch(initialized: bool, current: int = 0, **props: Any) -> Any:
    cuda = SimpleNamespace(is_initialized=lambda: initialized, current_device=lambda: current,
                           get_device_properties=lambda device: SimpleNamespace(**props))
    return SimpleNamespace(cuda=cuda)


def test_the_chosen_device_is_read_only_once_cuda_is_in_use() -> None:
    assert chosen_device(fake_torch(False, 1)) is None  # asking would initialize CUDA
    assert chosen_device(fake_torch(True, 1)) == 1


def test_a_gpu_is_named_by_its_node_and_pci_address_which_its_mig_slices_share() -> None:
    slice_a = fake_torch(True, pci_domain_id=0, pci_bus_id=0x17, pci_device_id=0, uuid="MIG-a")
    slice_b = fake_torch(True, pci_domain_id=0, pci_bus_id=0x17, pci_device_id=0, uuid="MIG-b")
    assert physical_id(slice_a, 0) == physical_id(slice_b, 0)
    assert physical_id(slice_a, 0).endswith("/pci 0000:17:00")
    assert physical_id(fake_torch(True, uuid="GPU-1"), 0).endswith("/GPU-1")  # no PCI address: the UUID
    assert physical_id(fake_torch(True), 0) == ""


def test_nccl_groups_take_hwplaces_timeout_and_clean_up_instead_of_ending_the_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, int, int, float, str | None]] = []

    class Options:
        _timeout: Any = None

    class Group:
        def __init__(self, store: str, index: int, size: int, options: Options) -> None:
            seen.append((store, index, size, options._timeout.total_seconds(), os.environ.get(devices.ERROR_HANDLING)))

    dist = SimpleNamespace(ProcessGroupNCCL=Group, PrefixStore=lambda prefix, store: prefix)
    Group.Options = Options  # type: ignore[attr-defined]
    monkeypatch.setenv(devices.ERROR_HANDLING, "3")
    groups = nccl_groups(dist, object(), "msg/k", 1, 2, 300.0)
    assert len(groups) == 2  # one per direction: each communicator used by one thread of each end
    assert seen == [("msg/k/nccl0/", 1, 2, 300.0, "2"), ("msg/k/nccl1/", 1, 2, 300.0, "2")]
    assert os.environ[devices.ERROR_HANDLING] == "3"  # the user's setting, back


class Work:
    def __init__(self, polls: int, error: Exception | None = None) -> None:
        self.polls, self.error = polls, error

    def is_completed(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def wait(self) -> None:
        if self.error:
            raise self.error


class Group:
    aborted = 0

    def abort(self) -> None:
        self.aborted += 1


def test_a_transfer_waits_until_done_and_a_dead_peer_aborts_it_with_the_pairs_error() -> None:
    group = Group()
    wait_work(Work(3), lambda: None, (group,))
    assert group.aborted == 0
    dead = hwplace.WorkerError("the connection to it broke", group="rollout", rank=1)
    calls = iter([None, None, dead])
    with pytest.raises(hwplace.WorkerError, match="group 'rollout' rank 1"):
        wait_work(Work(10**9), lambda: next(calls), (group,))
    assert group.aborted == 1
    with pytest.raises(RuntimeError, match="timed out"):
        wait_work(Work(0, RuntimeError("Watchdog caught collective operation timeout: timed out")), lambda: None,
                  (group,))
