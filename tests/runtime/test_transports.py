"""The weight-sync transports without Ray: the one choice of a target's transport per version (from the GPU the
tensors lie on), and a target taking same-device versions when it asks, through the CPU stand-in of the device
buckets: into a buffer it reuses, straight into a module, and an open that fails named."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

import hwplace
from hwplace.runtime.weight_sync import device_share
from hwplace.runtime.weight_sync.announcements import Announcement
from hwplace.runtime.weight_sync.device_ring import RingWriter
from hwplace.runtime.weight_sync.device_share import CPU, ShareKind
from hwplace.runtime.weight_sync.intake import Intake
from hwplace.runtime.weight_sync.transports import SameDevice, SameNode, choose, source_device

torch = pytest.importorskip("torch")


def on(device_type: str, index: int | None = None) -> dict[str, Any]:
    """A state dict as publish sees it: only its first value's ``device`` is looked at."""
    return {"w": SimpleNamespace(device=SimpleNamespace(type=device_type, index=index))}


def test_same_device_only_when_the_tensors_lie_on_a_gpu_the_target_holds() -> None:
    # a source holding GPUs 0 and 1 of its node, its state dict on its cuda:0; a target holding GPU 1
    device = source_device(on("cuda", 0), (0, 1))
    assert device == 0
    assert choose("same-device", (1,), device) == "same-node"
    assert choose("same-device", (0,), device) == "same-device"
    assert choose("same-device", (1,), source_device(on("cuda", 1), (0, 1))) == "same-device"
    assert source_device(on("cuda", 1), (5, 3)) == 3  # through what the source sees


@pytest.mark.parametrize("device_type", ["cpu", "npu", "xpu", "mps"])
def test_tensors_anywhere_but_on_a_cuda_gpu_take_the_host_path(device_type: str) -> None:
    assert source_device(on(device_type, 0), (0,)) is None
    assert choose("same-device", (0,), None) == "same-node"
    assert source_device({"a": __import__("numpy").zeros(3)}, None) is None


def test_other_transports_are_the_plans() -> None:
    assert choose("same-node", (0,), 0) == "same-node"
    assert choose("other-node", (0,), 0) == "other-node"


class Mailbox:
    """A receiver stand-in: the newest announcement, as the link's thread keeps it."""

    def __init__(self) -> None:
        self.note: Announcement | None = None

    def newest(self, after: int, timeout: float | None, early: int | None = None) -> Any:
        return (self.note, None) if self.note is not None and self.note.version > after else None

    def close(self) -> None:
        self.note = None


@pytest.fixture
def target() -> tuple[RingWriter, Mailbox, Intake]:
    writer, mailbox = RingWriter(), Mailbox()
    return writer, mailbox, Intake("policy", mailbox, SameDevice(None), SameNode("x"))  # type: ignore[arg-type]


def publish(writer: RingWriter, mailbox: Mailbox, version: int) -> None:
    mailbox.note = Announcement(version, writer.write(version, {"w": torch.full((64,), float(version))}))


def test_a_target_copies_nothing_until_it_asks_and_reuses_its_buffer(target: Any) -> None:
    writer, mailbox, intake = target
    publish(writer, mailbox, 1)
    publish(writer, mailbox, 2)
    assert intake.same_device.reader is None  # announced, not copied
    first = intake.latest(0, 0)
    assert first.version == 2
    buffer = first.tensors["w"].untyped_storage().data_ptr()
    publish(writer, mailbox, 3)
    held = intake.latest(0, 0)  # the caller still holds version 2: a new buffer
    assert (held.version, float(first.tensors["w"][0])) == (3, 2.0)
    assert held.tensors["w"].untyped_storage().data_ptr() != buffer
    buffer = held.tensors["w"].untyped_storage().data_ptr()
    del first, held
    publish(writer, mailbox, 4)
    again = intake.latest(0, 0)  # nothing holds version 3 any more: its buffer is reused
    assert again.version == 4
    assert torch.equal(again.tensors["w"], torch.full((64,), 4.0))
    assert again.tensors["w"].untyped_storage().data_ptr() == buffer


def test_a_version_that_cannot_be_taken_keeps_the_previous_one_in_the_reused_buffer(target: Any) -> None:
    writer, mailbox, intake = target
    publish(writer, mailbox, 1)
    assert intake.latest(0, 0).version == 1
    publish(writer, mailbox, 2)
    publish(writer, mailbox, 3)
    mailbox.note = Announcement(5, replace(mailbox.note.where, version=5))  # its buckets hold 3: skipped
    kept = intake.latest(0, 0)
    assert kept.version == 1
    assert torch.equal(kept.tensors["w"], torch.full((64,), 1.0))


def test_load_into_copies_from_the_buckets_straight_into_the_module(target: Any) -> None:
    writer, mailbox, intake = target
    module = torch.nn.Module()
    module.register_buffer("w", torch.zeros(64))
    publish(writer, mailbox, 1)
    assert intake.load_into(module, 1, 0) == 1
    assert torch.equal(module.w, torch.full((64,), 1.0))
    assert intake._buffer is None  # no copy of the target's own
    assert intake.latest(1, 0).version == 1  # asked for afterwards: copied then


def test_a_bucket_that_cannot_be_mapped_reaches_latest_naming_the_cause(target: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    writer, mailbox, intake = target

    def refused(handle: Any, index: int) -> Any:
        raise RuntimeError("pidfd_getfd: Operation not permitted")

    monkeypatch.setitem(device_share.KINDS, "cpu", ShareKind("cpu", CPU.share, refused))
    publish(writer, mailbox, 1)
    with pytest.raises(hwplace.WeightSyncError, match=r"cannot map bucket 0 .* pidfd_getfd: Operation not permitted"):
        intake.latest(1, 0)  # not a TimeoutError without a cause
