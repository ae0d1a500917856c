"""NCCL between two processes on the same GPU (issue 26 points 1 and 5): hwplace's messaging pair driven without
an executor (its key-value store is files), raw torch.distributed as the baseline, two large sends crossing at
once, and a peer killed mid-transfer. On CPU the pair runs over gloo alone (the stand-in), which is also the
baseline for the killed peer on a GPU.

NCCL's ``work.wait()`` only orders the current CUDA stream after the transfer, so a peer reads every received
tensor (a device sync) within its time cap before it counts it as received.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import shutil
import signal
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

from gpu_checks.harness import CheckFailed, CheckHung, check
from gpu_checks.peers import FileKV, answer, finish, pair, start, within

MiB = 2**20
NCCL_ENV = {"NCCL_DEBUG": "WARN"}  # NCCL's own reason ("Duplicate GPU detected") lands in the check's log
CAP = 45.0  # seconds one peer's operations may take, together, before it reports them as still waiting
SLACK = 40.0  # more seconds the check waits for a peer's answer: spawning, importing torch, meeting the other
FILL = {"a": 1.0, "b": 2.0}


def _prepare(gpu: bool) -> Any:
    import torch

    if gpu:
        torch.cuda.set_device(0)
    else:
        torch.set_num_threads(1)
    return torch


def _exchange(connection: Connection, kv_root: str, me: str, peer: str, gpu: bool, send_bytes: int,
              receive_too: bool) -> dict[str, Any]:
    """Build the pair, meet the peer, then send ``send_bytes`` (async) and/or receive one tensor, at once."""
    torch = _prepare(gpu)
    kv = FileKV(kv_root)
    messages = pair(kv_root, me, peer, gpu)
    comm = messages.connected()
    found: dict[str, Any] = {"device_groups": [type(group).__name__ for group in comm.devices],
                             "path": messages.path}
    tensor = torch.full((send_bytes // 4,), FILL[me], device="cuda:0" if gpu else "cpu") if send_bytes else None
    kv.barrier("start", me, (me, peer))
    started = time.monotonic()

    def left() -> float:
        return max(0.1, started + CAP - time.monotonic())

    handle = None
    if tensor is not None:
        status, value = within(lambda: messages.send(tensor, async_op=True), left())
        if status == "ok":
            handle = value
        else:
            found["send"] = {"status": status, "error": value}
    if receive_too:
        status, got = within(lambda: messages.claim().result(left()), left())
        if status == "ok":
            status, right = within(lambda: bool((got == FILL[peer]).all()), left())  # a sync: the bytes are there
            found["recv"] = {"status": status, "device": str(got.device), "bytes": got.numel() * got.element_size(),
                             "contents_right": right if status == "ok" else None,
                             "seconds": round(time.monotonic() - started, 3),
                             **({"error": f"reading the received tensor: {right}"} if status != "ok" else {})}
        else:
            found["recv"] = {"status": status, "error": got}
    if handle is not None:
        status, value = within(lambda: handle.wait(left()), left())
        if status == "ok" and gpu:
            status, value = within(lambda: torch.cuda.synchronize(0), left())
        found["send"] = {"status": status, "seconds": round(time.monotonic() - started, 3),
                         **({"error": value} if status != "ok" else {})}
    status, value = within(lambda: kv.barrier("done", me, (me, peer), left()), left())
    found["end_barrier"] = status if status == "ok" else value
    return found


def _pair_run(gpu: bool, sends: dict[str, int], receives: dict[str, bool]) -> dict[str, Any]:
    """Run :func:`_exchange` in peers ``a`` and ``b``; each one's findings and exit code."""
    kv_root = tempfile.mkdtemp(prefix="gpu-check-kv-")
    env = NCCL_ENV if gpu else None
    peers = {me: start(_exchange, kv_root, me, peer, gpu, sends[me], receives[me], env=env)
             for me, peer in (("a", "b"), ("b", "a"))}
    deadline = time.monotonic() + CAP + SLACK
    try:
        found = {me: answer(connection, max(1.0, deadline - time.monotonic()), f"peer {me}", process)
                 for me, (process, connection) in peers.items()}
    finally:
        codes = finish(*(process for process, _ in peers.values()), timeout=5)
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
            if isinstance(part, dict) and (part["status"] != "ok" or part.get("contents_right") is False):
                problems.append(f"peer {me} {op}: {part.get('error') or 'wrong contents'}")
    return problems


def _verdict(found: dict[str, Any], what: str, gpu: bool) -> dict[str, Any]:
    problems = _problems(found)
    paths = sorted({str(r.get("path")) for r in found.values() if r.get("ok")})
    details = {"peers": found, "transport": f"the pair's path {', '.join(paths)} (two ranks on cuda:0)" if gpu
               else "gloo (CPU stand-in)"}
    if gpu and any(r.get("ok") and r.get("path") != "host" for r in found.values()):  # NCCL refuses one GPU twice
        problems.append(f"the pair took {paths} for two workers on one GPU; NCCL refuses that (Duplicate GPU): "
                        "it must go through the host")
    errors = [p for p in problems if "still waiting" not in p and "did not answer" not in p]
    if errors:  # an error explains the other side's wait
        duplicate = any("Duplicate GPU" in p for p in problems)
        raise CheckFailed(f"{what}: {errors[0]}" + (" (NCCL refuses two ranks on one GPU: issue 26 point 1)"
                                                    if duplicate else ""), details)
    if problems:
        raise CheckHung(f"{what}: {problems[0]}", details)
    details["summary"] = f"{what}: delivered over {details['transport']}"
    return details


def _raw_rank(connection: Connection, init: str, rank: int) -> dict[str, Any]:
    import datetime

    import torch.distributed as dist

    torch = _prepare(True)
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=CAP))
    tensor = torch.full((1024,), rank + 1.0, device="cuda:0")

    def all_reduce() -> float:
        dist.all_reduce(tensor)
        return float(tensor[0])

    status, value = within(all_reduce, CAP)
    found: dict[str, Any] = {"result": value} if status == "ok" else {"status": status, "error": value}
    status, value = within(dist.destroy_process_group, 10)
    found["destroy"] = status if status == "ok" else value
    return found


@check("nccl_raw_same_gpu", 120, cpu=False, known_defect=True,
       issue="26 point 1 (baseline, no hwplace): raw torch.distributed NCCL, two ranks on cuda:0")
def nccl_raw_same_gpu(gpu: bool) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="gpu-check-nccl-")
    peers = [start(_raw_rank, os.path.join(folder, "init"), rank, env=NCCL_ENV) for rank in (0, 1)]
    deadline = time.monotonic() + CAP + SLACK
    try:
        found = {f"rank{r}": answer(c, max(1.0, deadline - time.monotonic()), f"rank {r}", p)
                 for r, (p, c) in enumerate(peers)}
    finally:
        codes = finish(*(p for p, _ in peers), timeout=5)
        shutil.rmtree(folder, ignore_errors=True)
    details = {"ranks": found, "exit_codes": codes}
    errors = [str(r.get("error")) for r in found.values() if r.get("error")]
    if errors:
        duplicate = any("Duplicate GPU" in e for e in errors)
        hung = all(r.get("hung") or r.get("status") == "timeout" for r in found.values() if r.get("error"))
        outcome = CheckHung if hung and not duplicate else CheckFailed
        raise outcome(f"all_reduce of two ranks on cuda:0: {errors[0]}", details)
    if any(r.get("result") != 3.0 for r in found.values()):
        raise CheckFailed(f"all_reduce gave {[r.get('result') for r in found.values()]}, not 3.0", details)
    details["summary"] = "NCCL accepted two ranks on one GPU (all_reduce = 3.0)"
    return details


@check("nccl_pair_same_gpu", 120, issue="26 point 1: hwplace's messaging Pair, two workers on one GPU (the host "
       "path, since NCCL refuses one GPU twice)")
def nccl_pair_same_gpu(gpu: bool) -> dict[str, Any]:
    found = _pair_run(gpu, {"a": 4 * MiB, "b": 0}, {"a": False, "b": True})
    return _verdict(found, "a 4 MiB tensor from a to b", gpu)


def _stream(connection: Connection, kv_root: str, me: str, peer: str, gpu: bool, nbytes: int) -> dict[str, Any]:
    """Send one large tensor after another until killed."""
    torch = _prepare(gpu)
    messages = pair(kv_root, me, peer, gpu)
    tensor = torch.full((nbytes // 4,), FILL[me], device="cuda:0" if gpu else "cpu")
    for count in range(10**6):
        messages.send(tensor, async_op=False)
        if gpu:
            torch.cuda.synchronize(0)  # one transfer at a time, as for gloo
        if count == 0:
            connection.send({"sent_first": True})
    return {}


def _survivor(connection: Connection, kv_root: str, me: str, peer: str, gpu: bool, cap: float) -> dict[str, Any]:
    """Receive (and read) the stream; after the first message, say so, and go on until a receive fails or waits
    ``cap`` s."""
    torch = _prepare(gpu)
    messages = pair(kv_root, me, peer, gpu)
    received = 0

    def read_next(wait: float) -> float:
        return float(messages.claim().result(wait).reshape(-1)[0])  # a sync: the bytes are there

    while True:
        wait = CAP + SLACK / 2 if received == 0 else cap  # the first: the pair meets, the sender starts
        status, value = within(functools.partial(read_next, wait), wait)
        if status != "ok" and received == 0:
            return {"first": status, "error": value}
        if status != "ok":
            at = time.monotonic()
            if status == "timeout":  # where its threads wait, into the check's log
                faulthandler.dump_traceback(all_threads=True)
            found = {"received": received, "outcome": status, "error": value, "at": at}
            if gpu:  # a CUDA stream still waiting for the dead peer's transfer blocks this process's next sync
                done, text = within(lambda: torch.cuda.synchronize(0), 15)
                found["device_sync_after"] = "ok" if done == "ok" else text
            return found
        received += 1
        if received == 1:
            connection.send({"got_first": time.monotonic()})


def _killed_run(gpu: bool, nbytes: int, cap: float) -> dict[str, Any]:
    """Kill the sender of a stream of ``nbytes`` tensors 50 ms after the first arrived; how the survivor ends."""
    kv_root = tempfile.mkdtemp(prefix="gpu-check-kv-")
    env = NCCL_ENV if gpu else None
    sender, to_sender = start(_stream, kv_root, "a", "b", gpu, nbytes, env=env)
    survivor, to_survivor = start(_survivor, kv_root, "b", "a", gpu, cap, env=env)
    found: dict[str, Any] = {"transport": "nccl (cuda:0 twice)" if gpu else "gloo", "tensor_bytes": nbytes,
                             "cap_s": cap}
    try:
        first = answer(to_survivor, CAP + SLACK, "the survivor", survivor)
        if "got_first" not in first:
            stuck = first.get("first") == "timeout" or first.get("hung")
            found.update(outcome="still waiting" if stuck else "refused", survivor=first,
                         sender=answer(to_sender, 10, "the sender", sender))
            return found
        time.sleep(0.05)  # the next send is on the wire
        killed = time.monotonic()
        os.kill(sender.pid, signal.SIGKILL)
        end = answer(to_survivor, cap + 20, "the survivor after the kill", survivor)
        found["survivor"] = end
        if end.get("outcome") == "timeout" or end.get("hung"):
            found["outcome"] = "still waiting"
        else:
            found["outcome"] = "raised"
            found["survivor_wait_s"] = round(end.get("at", killed) - killed, 3)
    finally:
        found["exit_codes"] = finish(sender, survivor, timeout=5)
        shutil.rmtree(kv_root, ignore_errors=True)
    return found


@check("peer_killed", 240,
       issue="26 point 5: a peer SIGKILLed mid-transfer; how long the survivor waits and what it raises")
def peer_killed(gpu: bool) -> dict[str, Any]:
    # gloo (the host path, and the CPU stand-in): the kill lands in the middle of a message, whose receive gloo
    # never releases; the pair's watcher sees the connection close and fails the pair (GRACE s later)
    details: dict[str, Any] = {"gloo": _killed_run(False, 256 * MiB if gpu else 128 * MiB, 30 if gpu else 20)}
    if gpu:
        details["nccl"] = _killed_run(True, 256 * MiB, 60)
    waiting = [k for k in ("gloo", "nccl") if details.get(k, {}).get("outcome") == "still waiting"]
    if waiting:
        caps = ", ".join(f"{k} {details[k]['cap_s']:g} s" for k in waiting)
        received = {k: details[k].get("survivor", {}).get("received") for k in waiting}
        raise CheckHung(f"the survivor was still waiting after its peer was killed mid-stream ({caps}; messages it "
                        f"read: {received})", details)
    refused = [k for k in ("gloo", "nccl") if details.get(k, {}).get("outcome") == "refused"]
    if refused:
        raise CheckFailed(f"over {refused[0]} nothing was transferred before the kill: "
                          f"{details[refused[0]]['survivor'].get('error')}", details)
    waits = {k: details[k]["survivor_wait_s"] for k in ("gloo", "nccl") if k in details}
    details["summary"] = f"the survivor raised {waits} s after the kill"
    return details


@check("nccl_concurrent_large", 120,
       issue="26 point 5: two 256 MiB sends crossing at once between two workers on one GPU")
def nccl_concurrent_large(gpu: bool) -> dict[str, Any]:
    size = 256 * MiB if gpu else 32 * MiB
    found = _pair_run(gpu, {"a": size, "b": size}, {"a": True, "b": True})
    try:
        details = _verdict(found, f"two {size // MiB} MiB tensors crossing", gpu)
    except (CheckFailed, CheckHung) as outcome:
        if gpu:
            outcome.details["single_gpu_cannot_show"] = "a received CUDA tensor lands on device 0 whatever the " \
                                                        "receiver's device (needs two GPUs)"
        raise
    return details
