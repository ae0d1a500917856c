"""The worker's side of the Ray executor (``plugins/ray/host.py``): what a worker process loads before it answers."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import hwplace
from hwplace_plugins.ray.pytest_plugin import LocalRay

ray = pytest.importorskip("ray")
host = pytest.importorskip("hwplace_plugins.ray.host")

# The probe's class is made from source in a module of its own that no worker can import, so it travels by value:
# a worker loads only what hosting it takes, not this test module (nor pytest) with it.
PROBE = '''
import sys

import hwplace


class Probe(hwplace.Worker):
    def modules(self):
        return sorted(name for name in sys.modules if name.split(".")[0] in ("hwplace", "hwplace_plugins"))
'''

DRIVER_SIDE = [
    "hwplace_plugins.ray.runtime",  # groups and handles
    "hwplace_plugins.ray.executor",  # the cluster's discovery, leases, registry
    "hwplace.runtime.restarts",  # the supervisor of a group's ranks
    "hwplace.runtime.group",  # launching groups
    "hwplace.plugin.manager",  # hooks and detection: a worker looks its executor up only when it uses it
    "hwplace.contracts.registry",  # the registry's records
    "hwplace.config",  # parsing configs
    "hwplace.planning",  # placement
]


def probe_class() -> Any:
    namespace: dict[str, Any] = {"__name__": "hwplace_host_probe"}
    exec(compile(PROBE, "<probe>", "exec"), namespace)  # a fixed source: a class that travels by value
    return namespace["Probe"]


def test_a_worker_process_loads_the_host_and_not_the_drivers_side(hwplace_local_ray: LocalRay) -> None:
    cluster = hwplace.Cluster({"num_nodes": 1})
    group = probe_class().create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="host-probe")
    try:
        [loaded] = group.modules().wait(timeout=120)
    finally:
        group.shutdown()
    assert "hwplace_plugins.ray.host" in loaded, loaded
    assert "hwplace.runtime.hosting" in loaded, loaded
    assert "hwplace_host_probe" not in loaded  # the probe came by value: what is listed is what hosting took
    found = [name for name in loaded if any(name == m or name.startswith(f"{m}.") for m in DRIVER_SIDE)]
    assert found == [], f"a worker process loaded the driver's side: {found} (of {len(loaded)}: {loaded})"


THREADS = '''
import asyncio
import threading

import hwplace


class Threads(hwplace.Worker):
    def __init__(self):
        self.constructed_on = threading.get_ident()
        self.order = []

    def plain(self, n):
        self.order.append(n)
        ran = asyncio.run(asyncio.sleep(0, result=n))  # no event loop runs on this thread: a method may start one
        return threading.get_ident(), self.constructed_on, ran, list(self.order)

    async def meet(self, n, expected):
        self.met = getattr(self, "met", None) or asyncio.Event()
        self.count = getattr(self, "count", 0) + 1
        if self.count == expected:
            self.met.set()
        await self.met.wait()  # only calls running at once ever get here all
        return n
'''


def threads_class() -> Any:
    namespace: dict[str, Any] = {"__name__": "hwplace_host_threads"}
    exec(compile(THREADS, "<threads>", "exec"), namespace)  # a fixed source: a class that travels by value
    return namespace["Threads"]


@pytest.mark.time_limit(180)  # the async calls meet only if they run at once: else this test fails, not hangs
def test_plain_methods_run_in_order_on_the_constructors_thread_and_async_ones_at_once(
        hwplace_local_ray: LocalRay) -> None:
    cluster = hwplace.Cluster({"num_nodes": 1})
    group = threads_class().create_group().launch(cluster, hwplace.NodePlacementStrategy([0]), name="host-threads")
    try:
        handles = [group.plain(n) for n in range(5)]
        results = [handle.wait(timeout=60)[0] for handle in handles]
        meeting = [group.meet(n, 3) for n in range(3)]
        assert [handle.wait(timeout=60) for handle in meeting] == [[0], [1], [2]]
    finally:
        group.shutdown()
    assert {ident for ident, _, _, _ in results} == {results[0][1]}  # every call on the constructor's thread
    assert [ran for _, _, ran, _ in results] == [0, 1, 2, 3, 4]
    assert results[-1][3] == [0, 1, 2, 3, 4]  # one at a time, in call order


def test_async_calls_return_what_their_coroutine_returns_or_raises() -> None:
    calls = host.AsyncCalls()

    async def value() -> int:
        await asyncio.sleep(0)
        return 7

    async def failing() -> None:
        raise KeyError("k")

    assert calls.run("a", value()) == 7
    assert calls.run("", value()) == 7
    with pytest.raises(KeyError, match="k"):
        calls.run("b", failing())


@pytest.mark.time_limit(60)  # a cancel that does not reach its coroutine fails rather than hangs
def test_a_cancelled_async_call_answers_cancelled_after_its_coroutine_has_seen_it() -> None:
    calls = host.AsyncCalls()
    ledger: list[str] = []
    started = threading.Event()

    async def long(name: str) -> str:
        started.set()
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # the call answers only once the coroutine has ended, cleanup included
            ledger.append(name)
            raise
        return "finished"

    answers: list[Any] = []
    def wait_for(call: str, name: str) -> None:
        answers.append(calls.run(call, long(name)))

    waiters = [threading.Thread(target=wait_for, args=("same", f"c{i}")) for i in range(2)]
    for waiter in waiters:
        waiter.start()
        started.wait()
        started.clear()
    other = threading.Thread(target=wait_for, args=("other", "other"))
    other.start()
    started.wait()
    calls.cancel("same")  # both calls of that name, not the other
    for waiter in waiters:
        waiter.join()
    assert [type(a) for a in answers] == [host.Cancelled, host.Cancelled]  # the other still runs
    assert sorted(ledger) == ["c0", "c1"]
    calls.cancel("other")
    other.join()
    assert sorted(ledger) == ["c0", "c1", "other"]
    assert [type(a) for a in answers] == [host.Cancelled] * 3


def test_a_cancel_before_its_call_begins_cancels_it_and_only_the_latest_cancels_are_kept() -> None:
    calls = host.AsyncCalls()
    ran: list[str] = []

    async def body(name: str) -> str:
        ran.append(name)
        return name

    calls.cancel("early")
    assert isinstance(calls.run("early", body("early")), host.Cancelled)
    assert calls.run("early", body("again")) == "again"  # a cancel counts once
    for i in range(host.CANCELS_KEPT + 1):
        calls.cancel(f"gone-{i}")
    assert calls.run("gone-0", body("gone-0")) == "gone-0"  # the oldest cancel was let go
    assert isinstance(calls.run("gone-1", body("gone-1")), host.Cancelled)
    assert ran == ["again", "gone-0"]


@pytest.mark.parametrize("value", ["0", "x", "10001", "-3", "2.5"])
def test_a_bad_async_calls_variable_is_a_config_error_naming_it(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(host.ASYNC_CALLS_VARIABLE, value)
    with pytest.raises(hwplace.ConfigError, match=r"HWPLACE_ASYNC_CALLS.*a whole number from 1 to 10000"):
        host.concurrency_groups()


def test_the_async_calls_variable_sizes_the_async_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(host.ASYNC_CALLS_VARIABLE, raising=False)
    assert host.concurrency_groups() == {"watch": 1, "control": 1, "async": host.DEFAULT_ASYNC_CALLS}
    monkeypatch.setenv(host.ASYNC_CALLS_VARIABLE, " 10000 ")
    assert host.concurrency_groups()["async"] == 10000
    monkeypatch.setenv(host.ASYNC_CALLS_VARIABLE, "1")
    assert host.concurrency_groups()["async"] == 1
