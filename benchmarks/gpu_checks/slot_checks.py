"""The same-device ring across processes (issue 26 points 2, 3, 5): a writer process (``RingWriter``, the source's
ring of device buckets) and a reader process (``RingReader``) on GPU 0, every bucket's digest checked by the
reader and its contents compared with the writer's at checkpoints; the same with the writer under
``expandable_segments``; 300 versions of a model twice the ring's size with both processes' GPU memory measured
(the writer's bounded by the ring); and the device digest on odd lengths. On CPU the same buckets share through
/dev/shm (the stand-in the CPU suite uses).
"""

from __future__ import annotations

import hashlib
from multiprocessing.connection import Connection
from typing import Any

from gpu_checks.harness import CheckFailed, check, error_text, traceback_tail
from gpu_checks.peers import finish, memory, receive, start

MiB = 2**20


def _state(torch: Any, version: int, device: str, nbytes: int) -> dict[str, Any]:
    """A state dict whose every byte depends on the version: float32 bulk, an odd-length bf16 tensor, a 0-dim
    step, an empty tensor and a non-contiguous int16 one."""
    bulk = torch.arange(nbytes // 4, dtype=torch.float32, device=device)
    return {"w": bulk.mul_(1e-3).add_(version), "half": torch.full((33,), version, dtype=torch.bfloat16, device=device),
            "step": torch.tensor(version, device=device), "empty": torch.zeros(0, 3, device=device),
            "t": (torch.arange(6, dtype=torch.int16, device=device).reshape(2, 3) * version).t()}


def _reference(torch: Any, tensors: dict[str, Any]) -> str:
    """A host-side hash of every tensor's dtype, shape and bytes, in name order."""
    digest = hashlib.blake2b()
    for name in sorted(tensors):
        value = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)};".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _ready(torch: Any, gpu: bool) -> None:
    if gpu:
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda:0")
    else:
        torch.set_num_threads(1)  # three processes of torch threads spinning on a few cores starve each other


def _writer(connection: Connection, gpu: bool, nbytes: int, ring: tuple[int, int]) -> dict[str, Any]:
    import torch

    from hwplace.runtime.weight_sync.device_ring import RingWriter

    _ready(torch, gpu)
    writer = RingWriter(None, *ring)
    connection.send({"ready": True, "memory": memory(torch, gpu)})
    while (message := connection.recv()) is not None:
        version, want_reference, want_memory = message
        tensors = _state(torch, version, "cuda:0" if gpu else "cpu", nbytes)
        try:
            reply: dict[str, Any] = {"descriptor": writer.write(version, tensors),
                                     "reference": _reference(torch, tensors) if want_reference else None}
        except Exception as exc:
            reply = {"error": error_text(exc), "traceback": traceback_tail(exc, 1500)}
        del tensors  # the slots stay: what the source holds between versions
        if want_memory:
            reply["memory"] = {**memory(torch, gpu), "ring": writer.device_bytes, "host_buckets": writer.host_bytes}
        connection.send(reply)
    return {"memory": memory(torch, gpu)}


def _reader(connection: Connection, gpu: bool) -> dict[str, Any]:
    import torch

    from hwplace.runtime.weight_sync.device_ring import RingReader
    from hwplace.runtime.weight_sync.device_share import TornRead

    _ready(torch, gpu)
    reader, kept = RingReader(), None
    connection.send({"ready": True, "memory": memory(torch, gpu)})
    while (message := connection.recv()) is not None:
        descriptor, want_reference, want_memory = message
        try:
            got = reader.read(descriptor)
            reply: dict[str, Any] = {"read": True, "devices": sorted({v.device.type for v in got.values()}),
                                     "reference": _reference(torch, got) if want_reference else None}
            kept = got  # a target keeps the newest version it read
        except Exception as exc:
            reply = {"read": False, "error": error_text(exc), "torn": isinstance(exc, TornRead),
                     "traceback": traceback_tail(exc, 1500)}
        if want_memory:
            reply["memory"] = memory(torch, gpu)
        connection.send(reply)
    del kept
    return {"memory": memory(torch, gpu)}


def _slots(gpu: bool, versions: int, nbytes: int, writer_env: dict[str, str] | None = None,
           memory_at: tuple[int, ...] = (), reference_every: int = 25, torn: bool = False,
           ring: tuple[int, int] = (64 * MiB, 8)) -> dict[str, Any]:
    """Write ``versions`` versions in one process (a ring of ``ring``: bucket bytes, buckets) and read each in
    another; what happened, in numbers."""
    writer, to_writer = start(_writer, gpu, nbytes, ring, env=writer_env)
    reader, to_reader = start(_reader, gpu)
    found: dict[str, Any] = {"versions": versions, "state_bytes": nbytes, "writer_env": writer_env or {},
                             "ring": {"bucket_bytes": ring[0], "device_buckets": ring[1]},
                             "read": 0, "verified": 0, "writer_errors": [], "reader_errors": [], "memory": {}}
    try:
        ready = {"writer": receive(to_writer, 120, "the writer", writer),
                 "reader": receive(to_reader, 120, "the reader", reader)}
        if not all(r.get("ready") for r in ready.values()):
            raise CheckFailed("a slot process did not start", {"started": ready, **found})
        found["memory"][0] = {side: r["memory"] for side, r in ready.items()}
        descriptors = {}

        def write(version: int, reference: bool, measure: bool) -> dict[str, Any]:
            to_writer.send((version, reference, measure))
            reply: dict[str, Any] = receive(to_writer, 60, f"the writer at version {version}", writer)
            if "descriptor" in reply:
                descriptors[version] = reply["descriptor"]
            else:
                found["writer_errors"].append(f"version {version}: {reply.get('error')}")
                found.setdefault("writer_traceback", reply.get("traceback"))
            return reply

        def read(version: int, reference: bool, measure: bool) -> dict[str, Any]:
            to_reader.send((descriptors[version], reference, measure))
            reply: dict[str, Any] = receive(to_reader, 60, f"the reader at version {version}", reader)
            return reply

        for version in range(1, versions + 1):
            reference = version <= 3 or version % reference_every == 0 or version == versions
            measure = version in memory_at
            wrote = write(version, reference, measure)
            if version not in descriptors:
                if len(found["writer_errors"]) >= 3:
                    break
                continue
            got = read(version, reference, measure)
            if got.get("read"):
                found["read"] += 1
                if reference and got["reference"] == wrote["reference"]:
                    found["verified"] += 1
                elif reference:
                    found["reader_errors"].append(f"version {version}: read bytes differ from the written ones")
                found["reader_devices"] = got["devices"]
            else:
                found["reader_errors"].append(f"version {version}: {got.get('error')}")
                found.setdefault("reader_traceback", got.get("traceback"))
                if len(found["reader_errors"]) >= 3:
                    break
            if measure:
                found["memory"][version] = {"writer": wrote.get("memory"), "reader": got.get("memory")}
        if torn and not found["writer_errors"] and not found["reader_errors"]:
            for version in range(versions + 1, versions + 4):  # the buckets of versions + 1 are written again
                write(version, False, False)
            stale, newest = read(versions + 1, False, False), read(versions + 3, False, False)
            found["torn_read"] = {"stale": stale.get("error") or "read without error",
                                  "newest": "read" if newest.get("read") else newest.get("error")}
        to_writer.send(None)
        to_reader.send(None)
        found["writer_end"] = receive(to_writer, 60, "the writer's end", writer)
        found["reader_end"] = receive(to_reader, 60, "the reader's end", reader)
    finally:
        found["exit_codes"] = finish(writer, reader)
    return found


def _judge(found: dict[str, Any], what: str) -> dict[str, Any]:
    if found["writer_errors"] or found["reader_errors"] or found["read"] < found["versions"]:
        first = (found["writer_errors"] + found["reader_errors"] + ["fewer versions read than written"])[0]
        raise CheckFailed(f"{what}: {found['read']}/{found['versions']} versions read; first problem: {first}",
                          found)
    torn = found.get("torn_read")
    if torn is not None and ("overwritten" not in torn["stale"] or torn["newest"] != "read"):
        raise CheckFailed(f"{what}: a version overwritten while unread was not reported torn: {torn}", found)
    found["summary"] = f"{what}: {found['read']} versions read, {found['verified']} compared byte for byte"
    return found


@check("slots_ipc", 120, issue="26 point 2: the device ring across processes (CUDA IPC)")
def slots_ipc(gpu: bool) -> dict[str, Any]:
    return _judge(_slots(gpu, 60 if gpu else 20, 8 * MiB if gpu else 64 * 1024, torn=True),
                  "CUDA IPC" if gpu else "CPU shared memory")


@check("slots_ipc_expandable", 120, cpu=False, known_defect=True,
       issue="26 point 2: writer with expandable_segments; an open failure must not be swallowed")
def slots_ipc_expandable(gpu: bool) -> dict[str, Any]:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    found = _slots(gpu, 20, 8 * MiB, writer_env=env)
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as scope:
            found["ptrace_scope"] = scope.read().strip()
    except OSError:
        found["ptrace_scope"] = None
    return _judge(found, "CUDA IPC, writer under expandable_segments")


@check("slots_memory_300", 150, issue="26 point 3: device memory over 300 versions, bounded by the ring")
def slots_memory_300(gpu: bool) -> dict[str, Any]:
    """300 versions of 128 MiB through a ring of 4 buckets of 16 MiB (64 MiB: half the model, the rest in host
    buckets) on a GPU; on CPU (resident set sizes and the bytes the ring holds) 60 of 256 KiB through 4 of 32 KiB."""
    from hwplace.planning.sync_plan import source_ring_bytes

    nbytes, last, ring = (128 * MiB, 300, (16 * MiB, 4)) if gpu else (256 * 1024, 60, (32 * 1024, 4))
    found = _judge(_slots(gpu, last, nbytes, memory_at=(10, last), reference_every=100, ring=ring),
                   f"{last} versions")
    at10, at300, base = (found["memory"][k] for k in (10, last, 0))
    key = "allocated" if gpu else "rss"
    growth = {side: at300[side][key] - at10[side][key] for side in ("writer", "reader")}
    found["growth_10_to_300"] = growth
    bound = ring[0] * ring[1]
    held = {"ring": at300["writer"]["ring"], "host_buckets": at300["writer"]["host_buckets"]}
    found["ring_bytes"] = {**held, "bound": bound}
    if gpu:
        growth["device_used"] = at300["reader"]["device_used"] - at10["reader"]["device_used"]
        found["over_model"] = {
            "writer_allocated": round(at300["writer"]["allocated"] / nbytes, 2),  # the ring: 0.5
            "writer_allocated_over_start": round((at300["writer"]["allocated"] - base["writer"]["allocated"])
                                                 / nbytes, 2),
            "reader_allocated": round(at300["reader"]["allocated"] / nbytes, 2),  # the kept version: 1
            "reader_peak": round(at300["reader"]["max_allocated"] / nbytes, 2),  # two during a hand-over
            "device_used_over_start": round((at300["reader"]["device_used"] - base["reader"]["device_used"]) / nbytes,
                                            2)}
    limit = nbytes // 2 + (0 if gpu else 16 * MiB)  # the CPU's resident set moves with the allocator's arenas
    grown = {side: bytes_ for side, bytes_ in growth.items() if bytes_ > limit}
    if grown:
        raise CheckFailed(f"memory grows from version 10 to {last} by {grown} bytes (state {nbytes} bytes)", found)
    if held["ring"] > bound:
        raise CheckFailed(f"the ring holds {held['ring']} bytes, more than its {bound}", found)
    expected = source_ring_bytes(nbytes, *ring)  # the plan's figure (device, host) for the bulk of the state
    if gpu and at300["writer"]["allocated"] - base["writer"]["allocated"] > bound + 2 * MiB:
        raise CheckFailed(f"the writer's allocated memory grew by more than its ring ({bound} bytes)", found)
    found["summary"] = (f"flat from version 10 to {last} (growth {growth}); ring {held['ring']} of at most {bound} "
                        f"bytes, {held['host_buckets']} in host buckets (the plan: about {expected}); over the model: "
                        f"{found.get('over_model')}")
    return found


def _python_digest(data: bytes) -> str:
    """device_digest by its definition, in plain Python (as tests/runtime/test_device_share.py has it)."""
    import struct

    padded = data + b"\0" * (-len(data) % 4)
    words = struct.unpack(f"<{len(padded) // 4}i", padded)
    mask = 2**64 - 1
    return f"wsum:{sum(words) & mask:016x}:{sum(w * (i + 1) for i, w in enumerate(words)) & mask:016x}:{len(data)}"


@check("digest_odd_bf16", 90, known_defect=True, issue="26 point 5: the digest of a length not a multiple of 4")
def digest_odd_bf16(gpu: bool) -> dict[str, Any]:
    import torch

    from hwplace.runtime.weight_sync.device_ring import RingWriter
    from hwplace.runtime.weight_sync.device_share import device_digest

    device = "cuda:0" if gpu else "cpu"
    small = torch.arange(33, dtype=torch.float32, device=device).to(torch.bfloat16)  # 66 bytes
    expected = _python_digest(small.cpu().view(torch.uint8).numpy().tobytes())
    found: dict[str, Any] = {"small_odd": {"device": device_digest(small.view(torch.uint8)), "python": expected},
                             "small_offset": {"device": device_digest(small[1:].view(torch.uint8)),
                                              "python": _python_digest(small[1:].cpu().view(torch.uint8).numpy()
                                                                       .tobytes())}}
    mismatched = [k for k, v in found.items() if v["device"] != v["python"]]
    if not gpu:
        if mismatched:
            raise CheckFailed(f"device_digest differs from its definition for {mismatched}", found)
        found["summary"] = ("the small odd-length and offset digests match their definition; the copy an odd length "
                            "makes is measured on a GPU only")
        return found
    elements = 2**27  # 256 MiB of bf16
    big = torch.arange(elements + 1, dtype=torch.float32, device=device).remainder_(997).to(torch.bfloat16)

    def transient(function: Any) -> tuple[Any, int]:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = function()
        torch.cuda.synchronize()
        return out, torch.cuda.max_memory_allocated() - base

    odd, odd_extra = transient(lambda: device_digest(big.view(torch.uint8)))
    even, even_extra = transient(lambda: device_digest(big[:elements].view(torch.uint8)))
    offset, offset_extra = transient(lambda: device_digest(big[1:].view(torch.uint8)))
    host = big.cpu()
    found["big"] = {"nbytes": big.numel() * 2, "odd_matches_cpu": odd == device_digest(host.view(torch.uint8)),
                    "even_matches_cpu": even == device_digest(host[:elements].view(torch.uint8)),
                    "offset_matches_cpu": offset == device_digest(host[1:].view(torch.uint8)),
                    "transient_bytes": {"odd": odd_extra, "even": even_extra, "odd_offset_2": offset_extra}}
    slot_extra = {}
    for tail in (33, 34):  # the slot's used bytes end odd / on a multiple of 4
        state = {"w": torch.ones(32 * MiB, dtype=torch.float32, device=device),
                 "tail": torch.ones(tail, dtype=torch.bfloat16, device=device)}
        writer = RingWriter()
        descriptor, peak = transient(lambda state=state, writer=writer: writer.write(1, state))
        slot_extra[f"tail_{tail}_bf16"] = peak - writer.device_bytes
        found.setdefault("slot_used_bytes", {})[f"tail_{tail}_bf16"] = descriptor.nbytes
        del writer, state
    found["slot_write_transient_bytes"] = slot_extra
    mismatched += [k for k in ("odd_matches_cpu", "even_matches_cpu", "offset_matches_cpu") if not found["big"][k]]
    if mismatched:
        raise CheckFailed(f"the GPU digest differs from the CPU digest or its definition for {mismatched}", found)
    copied = odd_extra - even_extra
    if copied > found["big"]["nbytes"] // 2:
        raise CheckFailed(f"digests agree, but an odd length copies the whole buffer first (torch.cat): "
                          f"+{copied / MiB:.0f} MiB transient for a {found['big']['nbytes'] / MiB:.0f} MiB tensor "
                          f"(even length: {even_extra / MiB:.0f} MiB); a slot write whose used bytes end odd: "
                          f"{slot_extra['tail_33_bf16'] / MiB:.0f} MiB vs {slot_extra['tail_34_bf16'] / MiB:.0f} MiB",
                          found)
    found["summary"] = (f"digests agree; transient {odd_extra / MiB:.0f} MiB (odd) vs {even_extra / MiB:.0f} MiB "
                        "(even)")
    return found
