"""hwplace.WeightSync under odd input and faults, on two nodes of each executor (tests/runtime_clusters.py): what a
state dict may hold and how it arrives, bad timeouts, a corrupted version nobody read, a target that waits long
for its first version, segments the source let go, and tensors a target writes into."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

import hwplace
from hwplace.config.weight_sync import DEFAULT_BUCKET_BYTES
from hwplace.runtime.messaging import communicator
from hwplace.runtime.weight_sync import buckets, transports
from hwplace.runtime.weight_sync import source as source_module
from hwplace.runtime.weight_sync import sync as sync_module
from hwplace.runtime.weight_sync.segments import SegmentRef

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytestmark = pytest.mark.time_limit(180)

# trainer rank 0 holds accelerator 0 of node 0; rollout 0 shares it, rollout 1 is on node 0, rollout 2 on node 1
CONFIG = {"cluster": {"num_nodes": 2, "component_placement": {"trainer": "0", "rollout": "0,2,4"}}}
CLUSTER = CONFIG["cluster"]


def filled(version: int, size: int = 64) -> dict[str, Any]:
    return {"w": torch.full((size,), float(version)), "b": torch.full((3,), float(version))}


def values(weights: hwplace.Weights) -> list[float]:
    return sorted({float(v) for t in weights.tensors.values() for v in torch.unique(torch.as_tensor(t).float())})


class Patient(hwplace.Worker):
    def lower_connect_timeout(self, seconds: float) -> None:
        """Lower, in this process, the bound a new communicator's members used to have to meet (300 s)."""
        communicator.CONNECT_TIMEOUT = seconds


class Source(Patient):
    def publish(self, sync: hwplace.WeightSync, version: int, size: int = 64) -> int:
        return sync.publish(filled(version, size))

    def publish_state(self, sync: hwplace.WeightSync, state: dict[Any, Any]) -> int | str:
        try:
            return sync.publish(state)
        except hwplace.WeightSyncError as exc:
            return f"WeightSyncError: {exc}"

    def segments(self) -> set[int]:
        """The inodes of the segments this source process holds now, and of their pools' boards, for every weight
        sync it publishes."""
        nodes = [state.source.same_node for state in sync_module._states().values() if state.source is not None]
        boards = {os.fstat(node.board.fd).st_ino for node in nodes if node.board is not None}
        return boards | {segment.inode for node in nodes if node.segments is not None
                         for segment in node.segments._segments}

    def publish_corrupted(self, sync: hwplace.WeightSync, version: int, size: int = 64) -> int:
        real = buckets.pack

        def corrupting(state: Any, bucket_bytes: int) -> Any:
            entries, packed = real(state, bucket_bytes)

            def flipped() -> Any:
                for bucket, digest in packed:
                    bucket = bucket.copy()
                    bucket[0] ^= 0xFF  # after its digest was taken
                    yield bucket, digest

            return entries, flipped()

        with mock.patch.object(source_module, "pack", corrupting):
            return sync.publish(filled(version, size))


    def publish_unannounced(self, sync: hwplace.WeightSync, version: int, size: int, lose: bool = True,
                            pieces: int = 0) -> tuple[int, int]:
        """Publish (``pieces``: that many tensors of ``size`` values) with any announcement of a version in the
        node's shared memory lost on the way (unless not ``lose``); returns the version and how many targets the
        source announced it to."""
        state = {f"p{i}": torch.full((size,), float(version)) for i in range(pieces)} if pieces else \
            filled(version, size)
        real, announced = source_module.deliver, []

        def losing(links: list[Any], note: Any, copies: Any = ()) -> None:
            if isinstance(note.where, SegmentRef):
                announced.extend(links)
                if lose:
                    return
            real(links, note, copies)

        with mock.patch.object(source_module, "deliver", losing):
            return sync.publish(state), len(announced)

    def publish_mixed(self, sync: hwplace.WeightSync, through_slots: bool) -> int:
        """Parameters, int keys beside their string forms, a 0-dim array; ``through_slots``: as if on GPU 0, which
        target rank 0 holds (torch's CPU shared memory standing in for CUDA IPC)."""
        state = {"w": torch.nn.Parameter(torch.ones(2)), "frozen": torch.nn.Parameter(torch.ones(2),
                                                                                       requires_grad=False),
                 1: torch.full((2,), 1.0), "1": torch.full((2,), 2.0)}
        if through_slots:
            with mock.patch.object(sync_module, "source_device", return_value=0):
                return sync.publish(state)
        return sync.publish({**state, "scalar": np.array(2.5)})


    def publish_through_slots(self, sync: hwplace.WeightSync, version: int) -> int:
        with mock.patch.object(sync_module, "source_device", return_value=0):  # GPU 0, which target rank 0 holds
            return sync.publish(filled(version, 100_000))


class Target(Patient):
    def write_into(self, sync: hwplace.WeightSync, version: int) -> tuple[list[float], list[float]]:
        """Take the version into a module by assignment and train it in place; then what latest() returns."""
        model = torch.nn.Module()
        weights = sync.latest(min_version=version, timeout=60)
        for name, tensor in weights.tensors.items():
            model.register_parameter(str(name), torch.nn.Parameter(tensor, requires_grad=False))
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.5)  # an optimizer step, in place
        written = sorted({float(v) for p in model.parameters() for v in torch.unique(p)})
        return written, values(sync.latest(timeout=60))

    def mapped_segments(self) -> set[int]:
        """The inodes of the weight sync's shared-memory files this process maps."""
        with open("/proc/self/maps") as maps:
            return {int(line.split()[4]) for line in maps if "hwplace-wsync" in line}

    def describe(self, sync: hwplace.WeightSync, min_version: int) -> dict[str, tuple[str, tuple[int, ...], bool]]:
        """Each received entry, by its key's repr: its type, shape and requires_grad."""
        weights = sync.latest(min_version=min_version, timeout=60)
        return {repr(key): (type(value).__name__, tuple(value.shape), bool(getattr(value, "requires_grad", False)))
                for key, value in weights.tensors.items()}

    def latest(self, sync: hwplace.WeightSync, min_version: int, timeout: Any = 60) -> tuple[int, list[float]]:
        weights = sync.latest(min_version=min_version, timeout=timeout)
        return weights.version, values(weights)

    def latest_once_forewarned(self, sync: hwplace.WeightSync, version: int) -> tuple[int, list[float]]:
        """``latest()`` asking for no version in particular, once this target's link has brought the Writing note of
        ``version`` (within a minute)."""
        receiver = sync._state().intake.receiver  # type: ignore[union-attr]
        for _ in range(6000):
            if receiver._writing is not None and receiver._writing.version >= version:
                break
            time.sleep(0.01)
        return self.latest(sync, 0)

    def latest_or_error(self, sync: hwplace.WeightSync, min_version: int, timeout: Any = 60) -> str:
        try:
            return f"version {sync.latest(min_version=min_version, timeout=timeout).version}"
        except (hwplace.HwplaceError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def groups(cluster: hwplace.Cluster):
    placement = hwplace.ComponentPlacement(CONFIG, cluster)
    source = Source.create_group().launch(cluster, placement.get_strategy("trainer"), name="source")
    target = Target.create_group().launch(cluster, placement.get_strategy("rollout"), name="target")
    yield source, target
    source.shutdown()
    target.shutdown()


@contextlib.contextmanager
def one_node(cluster: hwplace.Cluster, name: str,
             bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[tuple[Any, Any, hwplace.WeightSync]]:
    """A source and two targets on node 0, and a weight sync between them (its two targets ``same-node``)."""
    source = Source.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name=f"{name}-source")
    target = Target.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 0]), name=f"{name}-target")
    try:
        sync = hwplace.WeightSync.create(name, source=f"{name}-source", targets=(f"{name}-target",),
                                         bucket_bytes=bucket_bytes)
        assert [p.transport for p in sync.plan] == ["same-node", "same-node"]
        yield source, target, sync
    finally:
        source.shutdown()
        target.shutdown()


def test_a_bad_timeout_is_a_clear_error_and_inf_waits_without_end(groups) -> None:
    source, target = groups
    sync = hwplace.WeightSync.create("timeouts", source="source", targets=("target",))
    for bad in (float("nan"), "1", -1.0):
        [answer] = target.execute_on(1).latest_or_error(sync, 1, bad).wait(timeout=60)
        assert answer.startswith("ConfigError: timeout"), answer
        assert "allowed: None or float('inf')" in answer, answer
    waiting = target.latest(sync, 1, math.inf)
    assert source.publish(sync, 1).wait(timeout=60) == [1]
    assert waiting.wait(timeout=60) == [(1, [1.0])] * 3


@pytest.mark.parametrize("size", [64, 400_000], ids=["small", "large"])
def test_a_corrupted_version_nobody_read_gives_way_to_the_next(groups, size: int) -> None:
    source, target = groups
    sync = hwplace.WeightSync.create(f"superseded-{size}", source="source", targets=("target",))
    waiting = target.latest(sync, 1)
    assert source.publish(sync, 1, size).wait(timeout=60) == [1]
    assert waiting.wait(timeout=60) == [(1, [1.0])] * 3
    assert source.publish_corrupted(sync, 2, size).wait(timeout=60) == [2]  # nobody reads it
    asking = target.latest(sync, 3)  # while the corrupted version is the newest the targets know
    time.sleep(1.0)
    assert source.publish(sync, 3, size).wait(timeout=60) == [3]
    assert asking.wait(timeout=60) == [(3, [3.0])] * 3
    assert source.publish_corrupted(sync, 4, size).wait(timeout=60) == [4]
    assert source.publish(sync, 5, size).wait(timeout=60) == [5]
    assert target.latest(sync, 5).wait(timeout=60) == [(5, [5.0])] * 3  # asked once it was superseded


def test_a_corrupted_version_is_refused_by_every_target_of_the_node_that_one_of_them_checked(cluster) -> None:
    # two targets on the source's node wait for a version large enough to be checked once for the node while it
    # is written: whichever checks it, both refuse the corrupted one and keep the version before
    size = transports.EARLY_BYTES // 4 + 1000
    with one_node(cluster, "node-check") as (source, target, sync):
        waiting = target.latest(sync, 1)
        assert source.publish(sync, 1, size).wait(timeout=60) == [1]
        assert waiting.wait(timeout=60) == [(1, [1.0])] * 2
        asking = target.latest_or_error(sync, 2)
        assert source.publish_corrupted(sync, 2, size).wait(timeout=60) == [2]
        for answer in asking.wait(timeout=120):
            assert answer.startswith("WeightSyncError: "), answer
            assert "does not match its digest" in answer, answer
        assert target.latest(sync, 1).wait(timeout=60) == [(1, [1.0])] * 2  # the version before stays
        waiting = target.latest(sync, 3)
        assert source.publish(sync, 3, size).wait(timeout=60) == [3]
        assert waiting.wait(timeout=60) == [(3, [3.0])] * 2


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a Writing note goes ahead only with a core to spare")
def test_targets_a_writing_note_reached_take_the_version_from_its_seal_and_get_no_announcement(cluster) -> None:
    # the source seals a version on its board once it is written and noted, and announces it to none of the
    # targets its Writing note reached (announcements are lost here besides): a target waiting for it takes it
    # from the seal, and so does one that asks later for whatever is newest; the next version comes as before
    size = transports.EARLY_BYTES // 4 + 1000
    with one_node(cluster, "sealed") as (source, target, sync):
        waiting = target.latest(sync, 1)
        assert source.publish(sync, 1, size).wait(timeout=60) == [1]
        assert waiting.wait(timeout=60) == [(1, [1.0])] * 2  # both linked: later versions are forewarned
        waiting = target.latest(sync, 2)
        assert source.publish_unannounced(sync, 2, size).wait(timeout=60) == [(2, 0)]
        assert waiting.wait(timeout=120) == [(2, [2.0])] * 2
        assert source.publish_unannounced(sync, 3, size).wait(timeout=60) == [(3, 0)]  # nobody waiting for it
        assert target.latest_once_forewarned(sync, 3).wait(timeout=120) == [(3, [3.0])] * 2
        waiting = target.latest(sync, 4)
        assert source.publish(sync, 4, size).wait(timeout=60) == [4]
        assert waiting.wait(timeout=60) == [(4, [4.0])] * 2


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a Writing note goes ahead only with a core to spare")
def test_a_version_whose_digests_do_not_fit_on_the_board_is_announced_as_before(cluster) -> None:
    # 900 tensors of 10.4 KB, each a bucket of its own: 900 digests, more than half a board holds (about 800)
    pieces, size = 900, 2600
    assert pieces * size * 4 >= transports.EARLY_BYTES  # large enough to go with a Writing note
    with one_node(cluster, "unsealed", bucket_bytes=4096) as (source, target, sync):
        waiting = target.latest(sync, 1)
        assert source.publish(sync, 1).wait(timeout=60) == [1]
        assert waiting.wait(timeout=60) == [(1, [1.0])] * 2  # both linked: later versions are forewarned
        waiting = target.latest(sync, 2)
        assert source.publish_unannounced(sync, 2, size, False, pieces).wait(timeout=60) == [(2, 2)]
        assert waiting.wait(timeout=60) == [(2, [2.0])] * 2


def test_what_cannot_travel_exactly_is_refused_by_key_and_nothing_is_sent(groups) -> None:
    source, target = groups
    sync = hwplace.WeightSync.create("refused", source="source", targets=("target",))
    quantized = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    [answer] = source.publish_state(sync, {"ok": torch.ones(2), "q": quantized}).wait(timeout=60)
    assert answer.startswith("WeightSyncError: state dict entry 'q' is a quantized tensor (torch.qint8)"), answer
    waiting = target.latest(sync, 1)
    assert source.publish(sync, 1).wait(timeout=60) == [1]  # the refused one took no version
    assert waiting.wait(timeout=60) == [(1, [1.0])] * 3


@pytest.mark.parametrize("through_slots", [False, True], ids=["host", "slots"])
def test_parameters_and_int_keys_arrive_as_they_left(groups, through_slots: bool) -> None:
    source, target = groups
    sync = hwplace.WeightSync.create(f"kinds-{through_slots}", source="source", targets=("target",))
    waiting = target.describe(sync, 1)
    assert source.publish_mixed(sync, through_slots).wait(timeout=60) == [1]
    expected: dict[str, tuple[str, tuple[int, ...], bool]] = {
        "'w'": ("Parameter", (2,), True), "'frozen'": ("Parameter", (2,), False),
        "1": ("Tensor", (2,), False), "'1'": ("Tensor", (2,), False)}
    if not through_slots:
        expected["'scalar'"] = ("ndarray", (), False)
    assert waiting.wait(timeout=60) == [expected] * 3


@pytest.mark.parametrize("first", ["target", "source"])
def test_a_long_wait_for_the_first_version_is_bounded_only_by_the_caller(cluster: hwplace.Cluster,
                                                                          first: str) -> None:
    source = Source.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name=f"early-{first}")
    target = Target.create_group().launch(cluster, hwplace.NodePlacementStrategy([0, 1]), name=f"late-{first}")
    try:
        for group in (source, target):
            group.lower_connect_timeout(1.0).wait(timeout=60)  # the former bound, as a setting: 1 s here
        sync = hwplace.WeightSync.create("patient", source=f"early-{first}", targets=(f"late-{first}",))
        if first == "target":  # a rollout that starts long before the trainer's first step
            waiting = target.latest(sync, 1, 60)
            time.sleep(3.0)  # three times the former bound
            assert source.publish(sync, 1).wait(timeout=60) == [1]
        else:  # a trainer that publishes long before a rollout first asks
            assert source.publish(sync, 1).wait(timeout=60) == [1]
            time.sleep(3.0)
            waiting = target.latest(sync, 1, 60)
        assert waiting.wait(timeout=90) == [(1, [1.0])] * 2
    finally:
        source.shutdown()
        target.shutdown()


@pytest.mark.parametrize("how", ["segment", "announced", "slots"])
def test_tensors_from_latest_can_be_written_and_the_kept_version_stays(groups, how: str) -> None:
    source, target = groups
    sync = hwplace.WeightSync.create(f"written-{how}", source="source", targets=("target",))
    waiting = target.write_into(sync, 1)
    published = source.publish_through_slots(sync, 1) if how == "slots" else \
        source.publish(sync, 1, 100_000 if how == "segment" else 64)
    assert published.wait(timeout=60) == [1]
    # ranks 0 and 1 on the source's node: a device copy for rank 0 with the slots, else the node's segment (a
    # large version) or the announcement (a small one); rank 2 on the other node: the buckets it received
    assert waiting.wait(timeout=60) == [([1.5], [1.0])] * 3


def test_a_target_maps_no_segment_its_source_let_go(groups) -> None:
    source, target = groups
    sync = hwplace.WeightSync.create("growing", source="source", targets=("target",))
    for version, size in enumerate((100_000, 400_000, 1_600_000, 6_400_000), start=1):
        waiting = target.execute_on(1).latest(sync, version)  # the rank on the source's node reads segments
        assert source.publish(sync, version, size).wait(timeout=60) == [version]
        assert waiting.wait(timeout=60) == [(version, [float(version)])]
    # each version outgrew the segments before it, which the source let go; the target keeps the newest open (its
    # lock), and besides the tensors of a version it maps only the segments it checked last (one read-only mapping
    # each, kept for the next versions there): never one the source let go
    [live] = source.segments().wait(timeout=60)  # this sync's two, and those of the syncs of earlier tests
    [mapped] = target.execute_on(1).mapped_segments().wait(timeout=60)
    assert mapped <= live
