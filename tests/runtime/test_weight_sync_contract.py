"""SPEC §9's weight sync guarantees as written, end to end on two nodes of each executor (tests/runtime_clusters.py):
``same-node`` targets read the node's one copy in place (the tensors ``latest()`` returns lie in a copy-on-write
mapping of the source's own segment, with no page of their own until written), ``latest()`` never returns a mix of
two versions while the source publishes (read concurrently, on the source's node and through another node's relay),
and a version spoiled in the node's segment after its digests were taken is a ``WeightSyncError`` on every target,
the previous version kept and the next one arriving whole."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest

import hwplace
from hwplace.planning.sync_plan import SAME_NODE
from hwplace.runtime.weight_sync import buckets, segments
from hwplace.runtime.weight_sync.links import ANNOUNCED_BYTES
from hwplace.runtime.weight_sync.segments import SegmentRef

torch = pytest.importorskip("torch")

BUCKET_BYTES = 4096  # small: each version below is several buckets


def state_dict(version: int) -> dict[str, Any]:
    """Every value of every tensor equals the version (exact in each dtype up to 256), so a mix of two shows."""
    return {"embed": torch.full((1000,), float(version)), "norm": torch.full((300,), float(version)),
            "head": torch.full((40, 40), version, dtype=torch.bfloat16),
            "steps": torch.full((200,), version, dtype=torch.int64),
            "scale": torch.full((150,), float(version), dtype=torch.float64)}


def values(weights: hwplace.Weights) -> list[float]:
    return sorted({float(v) for t in weights.tensors.values() for v in torch.unique(t.float())})


def mapping_of(address: int) -> tuple[str, dict[str, int]]:
    """The line of ``/proc/self/maps`` whose range holds ``address``, and that mapping's ``smaps`` figures (kB)."""
    line, figures = None, {}
    with open("/proc/self/smaps") as smaps:
        for row in smaps:
            fields = row.split()
            if not fields[0].endswith(":"):  # a mapping's first row: its line of /proc/self/maps
                if line is not None:
                    break
                start, end = (int(bound, 16) for bound in fields[0].split("-"))
                if start <= address < end:
                    line = row.rstrip("\n")
            elif line is not None and len(fields) == 3 and fields[2] == "kB":
                figures[fields[0][:-1]] = int(fields[1])
    assert line is not None, f"no mapping of this process holds address {address:#x}"
    return line, figures


class Source(hwplace.Worker):
    def publish(self, sync: hwplace.WeightSync, version: int) -> int:
        return sync.publish(state_dict(version))

    def publish_many(self, sync: hwplace.WeightSync, count: int) -> list[int]:
        return [sync.publish(state_dict(version)) for version in range(1, count + 1)]

    def where_newest_lies(self, sync: hwplace.WeightSync) -> tuple[int, dict[str, int]]:
        """The inode of the segment that holds the newest version on this node, and where in it each tensor lies."""
        source = sync._state().source
        assert source is not None
        newest = source.newest(SAME_NODE)
        assert newest is not None
        note = newest[0]
        assert isinstance(note.where, SegmentRef), note.where
        return note.where.inode, {str(e.name): note.where.offsets[e.bucket] + e.offset for e in note.entries}

    def publish_spoiled(self, sync: hwplace.WeightSync, version: int, how: str) -> tuple[int, int]:
        """Publish ``version`` with its bucket 1 spoiled in the node's segment just after the source hashed it:
        ``flipped``, one byte flipped; ``cut short``, its second half not written (it keeps what the segment held).
        Returns the version and how many buckets were spoiled."""
        real, calls, spoiled = segments._copy_hashed, [0], [0]

        def spoiling(into: Any, source: Any, written: Any) -> str:
            index, calls[0] = calls[0], calls[0] + 1
            before = into[len(into) // 2 :].copy()
            found = real(into, source, written)  # the digest of what was published
            if index == 1:
                spoiled[0] += 1
                if how == "flipped":
                    into[len(into) // 2] ^= 0xFF
                else:
                    into[len(into) // 2 :] = before
            return found

        with mock.patch.object(segments, "_copy_hashed", spoiling):
            return sync.publish(state_dict(version)), spoiled[0]


class Target(hwplace.Worker):
    def latest(self, sync: hwplace.WeightSync, min_version: int) -> tuple[int, list[float]]:
        weights = sync.latest(min_version=min_version, timeout=60)
        return weights.version, values(weights)

    def latest_or_error(self, sync: hwplace.WeightSync, min_version: int) -> str:
        try:
            return f"version {sync.latest(min_version=min_version, timeout=60).version}"
        except (hwplace.HwplaceError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def where_latest_lies(self, sync: hwplace.WeightSync, version: int) -> dict[str, Any]:
        """Where the tensors ``latest()`` returns lie in this process: for each, the maps line of the mapping that
        holds its first byte (permissions, inode, path) and the offset in the mapped file of that byte; and that
        mapping's anonymous (private) kB once every value was read, then once the tensors were written."""
        weights = sync.latest(min_version=version, timeout=60)
        assert weights.version == version, weights.version
        assert values(weights) == [float(version)]  # every page of every tensor read
        found: dict[str, Any] = {}
        lines = set()
        for name, tensor in weights.tensors.items():
            line, _ = mapping_of(tensor.data_ptr())
            bounds, perms, offset, _device, inode, *path = line.split(maxsplit=5)
            lines.add(line)
            file_offset = tensor.data_ptr() - int(bounds.split("-")[0], 16) + int(offset, 16)
            found[str(name)] = (perms, int(inode), path[0] if path else "", file_offset)
        [line] = lines  # one mapping holds the whole version
        read = mapping_of(int(line.split("-")[0], 16))[1]
        with torch.no_grad():
            for tensor in weights.tensors.values():
                tensor.add_(1)  # a caller's write: copy-on-write, its own pages from now on
        written = mapping_of(int(line.split("-")[0], 16))[1]
        return {"tensors": found, "read": (read["Rss"], read["Anonymous"]), "written": written["Anonymous"],
                "kept": values(sync.latest(timeout=60))}

    def read_until(self, sync: hwplace.WeightSync, last: int, seconds: float) -> list[tuple[int, list[float], int]]:
        """Call ``latest(0)`` over and over until it returns version ``last`` (or ``seconds`` pass): the ledger of
        what it returned, in order, each reading as (version, every value of its tensors, times in a row)."""
        ledger: list[tuple[int, list[float], int]] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                weights = sync.latest(min_version=0, timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
            reading = (weights.version, values(weights))
            del weights
            if ledger and ledger[-1][:2] == reading:
                ledger[-1] = (*reading, ledger[-1][2] + 1)
            else:
                ledger.append((*reading, 1))
            if reading[0] >= last:
                break
        return ledger


@contextmanager
def launched(cluster: hwplace.Cluster, name: str, nodes: list[int]) -> Any:
    """A source on node 0, targets on ``nodes``, and a weight sync of small buckets between them."""
    source = Source.create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name=f"{name}-source")
    target = Target.create_group().launch(cluster, hwplace.NodePlacementStrategy(nodes), name=f"{name}-target")
    try:
        sync = hwplace.WeightSync.create(name, source=f"{name}-source", targets=(f"{name}-target",),
                                         bucket_bytes=BUCKET_BYTES)
        assert [(t.node, t.transport) for t in sync.plan] == [
            (node, "same-node" if node == 0 else "other-node") for node in nodes]
        yield source, target, sync
    finally:
        source.shutdown()
        target.shutdown()


def test_each_version_here_is_several_buckets_too_large_to_travel_in_its_announcement() -> None:
    entries, _ = buckets.pack(state_dict(1), BUCKET_BYTES)
    assert len({entry.bucket for entry in entries}) >= 3
    assert sum(entry.nbytes for entry in entries) > ANNOUNCED_BYTES  # so it lies in the node's segment


@pytest.mark.time_limit(180)
def test_same_node_targets_read_the_source_segment_in_place(cluster: hwplace.Cluster) -> None:
    with launched(cluster, "in-place", [0, 0]) as (source, target, sync):
        waiting = target.where_latest_lies(sync, 1)
        assert source.publish(sync, 1).wait(timeout=60) == [1]
        found = waiting.wait(timeout=60)
        [(inode, offsets)] = source.where_newest_lies(sync).wait(timeout=60)
        for rank in found:
            for name, (perms, mapped, path, offset) in rank["tensors"].items():
                # a mapping of the source's own segment (its memfd), where the source wrote that tensor
                assert path.startswith("/memfd:hwplace-wsync-"), (name, path)
                assert (mapped, offset) == (inode, offsets[name]), (name, mapped, offset)
                assert perms == "rw-p", (name, perms)  # writable, private: copy-on-write, as docs/rl.md says
            rss, anonymous = rank["read"]
            assert rss > 0, rank  # every page read ...
            assert anonymous == 0, rank  # ... yet not a byte of its own: the node's one copy
            assert rank["written"] > 0, rank  # written pages became the caller's own ...
            assert rank["kept"] == [1.0], rank  # ... and the version stays as it was


@pytest.mark.time_limit(300)
def test_latest_never_returns_a_mix_of_two_versions_while_versions_are_published(cluster: hwplace.Cluster) -> None:
    count = 150
    # two targets on the source's node (same-node), two on the other (its relay, and a rank reading the relay's)
    with launched(cluster, "no-mix", [0, 0, 1, 1]) as (source, target, sync):
        readers = target.read_until(sync, count, 180)  # reading before the first version, and on while they come
        assert source.publish_many(sync, count).wait(timeout=240) == [list(range(1, count + 1))]
        ledgers = readers.wait(timeout=240)
        for rank, ledger in enumerate(ledgers):
            for version, seen, _ in ledger:
                assert seen == [float(version)], (rank, version, seen, ledger)  # one version, whole
            versions = [version for version, _, _ in ledger]
            assert versions == sorted(versions), (rank, versions)  # never back
            assert versions[-1] == count, (rank, versions)  # and the last one arrived


@pytest.mark.parametrize("how", ["flipped", "cut short"])
@pytest.mark.time_limit(240)
def test_a_version_spoiled_in_the_node_segment_is_an_error_and_the_previous_stays(cluster: hwplace.Cluster,
                                                                                   how: str) -> None:
    # two targets on the source's node read its segment; the other node's relay gets the buckets from that segment
    with launched(cluster, f"spoiled-{how.replace(' ', '-')}", [0, 0, 1, 1]) as (source, target, sync):
        waiting = target.latest(sync, 1)
        assert source.publish(sync, 1).wait(timeout=60) == [1]
        assert waiting.wait(timeout=60) == [(1, [1.0])] * 4
        asking = target.latest_or_error(sync, 2)  # waiting for it while it is published
        assert source.publish_spoiled(sync, 2, how).wait(timeout=60) == [(2, 1)]
        entries, _ = buckets.pack(state_dict(2), BUCKET_BYTES)
        count = len({entry.bucket for entry in entries})
        for answer in asking.wait(timeout=120):
            assert answer == (f"WeightSyncError: weight sync version 2: bucket 1 of {count} does not match its "
                              "digest (corrupted or partial); the previous version stays the latest"), answer
        assert target.latest(sync, 0).wait(timeout=60) == [(1, [1.0])] * 4  # the previous version, intact
        waiting = target.latest(sync, 3)
        assert source.publish(sync, 3).wait(timeout=60) == [3]
        assert waiting.wait(timeout=60) == [(3, [3.0])] * 4
