"""NCCL between two processes on the same GPU (issue 26 points 1 and 5): hwplace's messaging pair driven without
an executor (its key-value store is files), raw torch.distributed as the baseline, two large sends crossing at
once, and a peer killed mid-transfer. On CPU the pair runs over gloo alone (the stand-in), which is also the
baseline for the killed peer on a GPU.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

from gpu_checks.harness import CheckFailed, CheckHung, check, error_text
from gpu_checks.peers import FileKV, finish, pair, receive, start

MiB = 2**20
NCCL_ENV = {"NCCL_DEBUG": "WARN"}  # NCCL's own reason ("Duplicate GPU detected") lands in the check's log
CAP = 60.0  # seconds a peer waits for one operation before it reports it as still waiting
FILL = {"a": 1.0, "b": 2.0}


def _outcome(function: Any, cap: float = CAP) -> tuple[str, Any]:
    """``("ok", value)``, ``("timeout", text)`` or ``("error", text)`` of calling ``function()``, which waits at
    most ``cap`` s."""
    try:
        return "ok", function()
    except TimeoutError as exc:
        return "timeout", f"still waiting after {cap:g} s ({exc})"
    except Exception as exc:
        return "error", error_text(exc)


def _exchange(connection: Connection, kv_root: str, me: str, peer: str, gpu: bool, send_bytes: int,
              receive_too: bool) -> dict[str, Any]:
    """Build the pair, meet the peer, then send ``send_bytes`` (async) and/or receive one tensor at once."""
    import torch

    if gpu:
        torch.cuda.set_device(0)
    kv = FileKV(kv_root)
    messages = pair(kv_root, me, peer, gpu)
    comm = messages.connected()
    found: dict[str, Any] = {"device_group": type(comm.device).__name__ if comm.device is not None else None}
    device = "cuda:0" if gpu else "cpu"
    tensor = torch.full((send_bytes // 4,), FILL[me], device=device) if send_bytes else None
    kv.barrier("start", me, (me, peer))
    started = time.monotonic()
    handle = None
    if tensor is not None:
        status, value = _outcome(lambda: messages.send(tensor, async_op=True))
        if status == "ok":
            handle = value
        else:
            found["send"] = {"status": status, "error": value}
    if receive_too:
        status, got = _outcome(lambda: messages.claim().result(CAP))
        if status == "ok":
            expected = FILL[peer]
            good = bool((got == expected).all()) if got.numel() else True
            found["recv"] = {"status": "ok", "device": str(got.device), "bytes": got.numel() * got.element_size(),
                             "contents_right": good, "seconds": round(time.monotonic() - started, 3)}
        else:
            found["recv"] = {"status": status, "error": got}
    if handle is not None:
        status, value = _outcome(lambda: handle.wait(CAP))
        found["send"] = {"status": status, "seconds": round(time.monotonic() - started, 3),
                         **({"error": value} if status != "ok" else {})}
    status, value = _outcome(lambda: kv.barrier("done", me, (me, peer), CAP))
    found["end_barrier"] = status if status == "ok" else value
    return found


def _pair_run(gpu: bool, sends: dict[str, int], receives: dict[str, bool], wait: float) -> dict[str, Any]:
    """Run :func:`_exchange` in peers ``a`` and ``b``; each one's findings and exit code."""
    kv_root = tempfile.mkdtemp(prefix="gpu-check-kv-")
    env = NCCL_ENV if gpu else None
    peers = {me: start(_exchange, kv_root, me, peer, gpu, sends[me], receives[me], env=env)
             for me, peer in (("a", "b"), ("b", "a"))}
    try:
        found = {me: receive(connection, wait, f"peer {me}", process) for me, (process, connection) in peers.items()}
    finally:
        codes = finish(*(process for process, _ in peers.values()))
        shutil.rmtree(kv_root, ignore_errors=True)
    for result, code in zip(found.values(), codes, strict=True):
        result["exit_code"] = code
    return found


def _problems(found: dict[str, Any]) -> list[str]:
    """Every side's failed operation, as text."""
    problems = []
    for me, result in found.items():
        if not result.get("ok"):
            problems.append(f"peer {me}: {result.get('error')}")
            continue
        for op in ("send", "recv"):
            part = result.get(op)
            if isinstance(part, dict) and (part["status"] != "ok" or not part.get("contents_right", True)):
                problems.append(f"peer {me} {op}: {part.get('error') or 'wrong contents'}")
    return problems


def _verdict(found: dict[str, Any], what: str, gpu: bool) -> dict[str, Any]:
    problems = _problems(found)
    details = {"peers": found, "transport": "nccl (two ranks on cuda:0)" if gpu else "gloo (CPU stand-in)"}
    if gpu and any(r.get("ok") and r.get("device_group") is None for r in found.values()):
        problems.append("the pair has no NCCL group although both placements are on a cuda GPU")
    stuck = [p for p in problems if "still waiting" in p]
    if stuck:
        raise CheckHung(f"{what}: {stuck[0]}", details)
    if problems:
        duplicate = any("Duplicate GPU" in p for p in problems)
        raise CheckFailed(f"{what}: {problems[0]}" + (" (NCCL refuses two ranks on one GPU: issue 26 point 1)"
                                                      if duplicate else ""), details)
    details["summary"] = f"{what}: delivered over {details['transport']}"
    return details


@check("nccl_raw_same_gpu", 90, cpu=False, known_defect=True,
       issue="26 point 1 (baseline, no hwplace): raw torch.distributed NCCL, two ranks on cuda:0")
def nccl_raw_same_gpu(gpu: bool) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="gpu-check-nccl-")
    peers = [start(_raw_rank, os.path.join(folder, "init"), rank, env=NCCL_ENV) for rank in (0, 1)]
    try:
        found = {f"rank{r}": receive(c, 75, f"rank {r}", p) for r, (p, c) in enumerate(peers)}
    finally:
        codes = finish(*(p for p, _ in peers))
        shutil.rmtree(folder, ignore_errors=True)
    details = {"ranks": found, "exit_codes": codes}
    errors = [r.get("error") for r in found.values() if not r.get("ok") or r.get("error")]
    if errors:
        raise CheckFailed(f"all_reduce of two ranks on cuda:0: {errors[0]}", details)
    if any(r.get("result") != 3.0 for r in found.values()):
        raise CheckFailed(f"all_reduce gave {[r.get('result') for r in found.values()]}, not 3.0", details)
    details["summary"] = "NCCL accepted two ranks on one GPU (all_reduce = 3.0)"
    return details


def _raw_rank(connection: Connection, init: str, rank: int) -> dict[str, Any]:
    import datetime

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    tensor = torch.full((1024,), rank + 1.0, device="cuda:0")
    found: dict[str, Any] = {}
    try:
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        found["result"] = float(tensor[0])
    except Exception as exc:
        found["error"] = error_text(exc)
    status, value = _outcome(dist.destroy_process_group)
    found["destroy"] = status if status == "ok" else value
    return found


@check("nccl_pair_same_gpu", 90, issue="26 point 1: hwplace's messaging Pair, two workers on one GPU",
       known_defect=True)
def nccl_pair_same_gpu(gpu: bool) -> dict[str, Any]:
    found = _pair_run(gpu, {"a": 4 * MiB, "b": 0}, {"a": False, "b": True}, CAP + 30)
    return _verdict(found, "a 4 MiB tensor from a to b", gpu)


@check("nccl_concurrent_large", 120, known_defect=True,
       issue="26 point 5: two 256 MiB sends crossing at once (send and recv on two threads of one communicator)")
def nccl_concurrent_large(gpu: bool) -> dict[str, Any]:
    size = 256 * MiB if gpu else 32 * MiB
    found = _pair_run(gpu, {"a": size, "b": size}, {"a": True, "b": True}, CAP * 2 + 30)
    details = _verdict(found, f"two {size // MiB} MiB tensors crossing", gpu)
    if gpu:
        details["single_gpu_cannot_show"] = "a received CUDA tensor allocated on device 0 whatever the receiver's"
    return details


def _stream(connection: Connection, kv_root: str, me: str, peer: str, gpu: bool, nbytes: int) -> dict[str, Any]:
    """Send one large tensor after another until killed."""
    import torch

    if gpu:
        torch.cuda.set_device(0)
    messages = pair(kv_root, me, peer, gpu)
    tensor = torch.full((nbytes // 4,), FILL[me], device="cuda:0" if gpu else "cpu")
    for count in range(10**6):
        messages.send(tensor, async_op=False)
        if count == 0:
            connection.send({"sent_first": True})
    return {}


def _survivor(connection: Connection, kv_root: str, me: str, peer: str, gpu: bool, cap: float) -> dict[str, Any]:
    """Receive the stream; after the first message, say so, and go on until receiving fails or waits ``cap`` s."""
    import torch

    if gpu:
        torch.cuda.set_device(0)
    messages = pair(kv_root, me, peer, gpu)
    status, value = _outcome(lambda: messages.claim().result(CAP))  # the pair meets and the first one arrives
    if status != "ok":
        return {"first": status, "error": value}
    connection.send({"got_first": time.monotonic()})
    received = 1
    while True:
        status, value = _outcome(lambda: messages.claim().result(cap), cap)
        if status != "ok":
            if status == "timeout":  # where its threads wait, into the check's log
                faulthandler.dump_traceback(all_threads=True)
            return {"received": received, "outcome": status, "error": value, "at": time.monotonic()}
        received += 1


def _killed_run(gpu: bool, nbytes: int, cap: float) -> dict[str, Any]:
    """Kill the sender of a stream of ``nbytes`` tensors 50 ms after the first arrived; how the survivor ends."""
    kv_root = tempfile.mkdtemp(prefix="gpu-check-kv-")
    env = NCCL_ENV if gpu else None
    sender, to_sender = start(_stream, kv_root, "a", "b", gpu, nbytes, env=env)
    survivor, to_survivor = start(_survivor, kv_root, "b", "a", gpu, cap, env=env)
    found: dict[str, Any] = {"transport": "nccl (cuda:0 twice)" if gpu else "gloo", "tensor_bytes": nbytes,
                             "cap_s": cap}
    try:
        first = receive(to_survivor, CAP + 30, "the survivor", survivor)
        if "got_first" not in first:
            try:
                said = receive(to_sender, 10, "the sender", sender)
            except CheckHung as exc:
                said = {"note": exc.message}
            stuck = first.get("first") == "timeout"
            found.update(outcome="still waiting" if stuck else "refused", survivor=first, sender=said)
            return found
        time.sleep(0.05)  # the next send is on the wire
        killed = time.monotonic()
        os.kill(sender.pid, signal.SIGKILL)
        end = receive(to_survivor, cap + 20, "the survivor after the kill", survivor)
        found["survivor"] = end
        if end.get("outcome") == "timeout":
            found["outcome"] = "still waiting"
        else:
            found["outcome"] = "raised"
            found["survivor_wait_s"] = round(end.get("at", killed) - killed, 3)
    except CheckHung as exc:
        found.update(outcome="still waiting", note=exc.message)
    finally:
        found["exit_codes"] = finish(sender, survivor, timeout=5)
        shutil.rmtree(kv_root, ignore_errors=True)
    return found


@check("peer_killed", 210, known_defect=True,
       issue="26 point 5: a peer SIGKILLed mid-transfer; how long the survivor waits and what it raises")
def peer_killed(gpu: bool) -> dict[str, Any]:
    # gloo (the host path, and the CPU stand-in): a dead peer is seen at once or not for a day (its timeout)
    details: dict[str, Any] = {"gloo": _killed_run(False, 256 * MiB if gpu else 128 * MiB, 30 if gpu else 20)}
    if gpu:
        details["nccl"] = _killed_run(True, 256 * MiB, CAP)
    waiting = [k for k in ("gloo", "nccl") if details.get(k, {}).get("outcome") == "still waiting"]
    if waiting:
        caps = ", ".join(f"{k} {details[k]['cap_s']:g} s" for k in waiting)
        received = {k: details[k].get("survivor", {}).get("received") for k in waiting}
        raise CheckHung(f"the survivor was still waiting after its peer was killed mid-stream ({caps}; messages it "
                        f"got: {received})", details)
    refused = [k for k in ("gloo", "nccl") if details.get(k, {}).get("outcome") == "refused"]
    if refused:
        raise CheckFailed(f"over {refused[0]} nothing was transferred before the kill: "
                          f"{details[refused[0]]['survivor'].get('error')}", details)
    waits = {k: details[k]["survivor_wait_s"] for k in ("gloo", "nccl") if k in details}
    details["summary"] = f"the survivor raised {waits} s after the kill"
    return details
