"""Restart in place (SPEC §12), on both executors: a dead worker process is started again on its own placement
with the same rank, environment and constructor arguments; ``on_restart`` runs after ``__init__``; a call the
death ended is a ``WorkerError`` with ``restarted``; later calls reach the new process through the same handle;
``scope="group"`` starts every rank again; restarts used up end the group with the last cause; ``status()``
says each rank's state. Waits have no timeout of their own: the module's limit is around them."""

from __future__ import annotations

import ctypes
import faulthandler
import io
import os
import signal
import threading
import time
from typing import Any

import pytest

import hwplace
from hwplace.application.status import print_status
from hwplace.executor import current_executor

pytestmark = pytest.mark.time_limit(240)

CLUSTER = {"num_nodes": 2, "component_placement": {"svc": "0-3", "pair": "4-5", "other": "6-7"}}


class Service(hwplace.Worker):
    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.restarted_with: tuple[int, int, str] | None = None

    def on_restart(self, info: Any) -> None:
        self.restarted_with = (info.rank, info.attempt, info.cause)

    def who(self) -> dict[str, Any]:
        env = {k: os.environ.get(k, "") for k in ("RANK", "FAKE_VISIBLE_DEVICES", "HWPLACE_NODE_RANK")}
        return {"pid": os.getpid(), "tag": self.tag, "rank": self.rank, "env": env,
                "restarted_with": self.restarted_with}

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def sleep_then_answer(self, seconds: float) -> str:
        time.sleep(seconds)
        return "answered"


def serving(group: hwplace.WorkerGroup) -> list[hwplace.RankStatus]:
    """The group's status once no rank is restarting (polled; the module's limit bounds it)."""
    while True:
        status = group.status()
        if all(s.state != "restarting" for s in status):
            return status
        time.sleep(0.05)


def restarted(group: hwplace.WorkerGroup, rank: int, restarts: int = 1) -> list[hwplace.RankStatus]:
    """The group's status once ``rank`` has used ``restarts`` restarts and no rank is restarting (polled)."""
    while group.status()[rank].restarts < restarts:
        time.sleep(0.05)
    return serving(group)


def launch(cluster: hwplace.Cluster, component: str, restart: hwplace.Restart | None) -> hwplace.WorkerGroup:
    strategy = hwplace.ComponentPlacement(cluster.config, cluster).get_strategy(component)
    return Service.create_group("t").launch(cluster, strategy, name=component, restart=restart)


def test_a_killed_rank_comes_back_in_place_and_the_call_it_ended_says_so(cluster: hwplace.Cluster) -> None:
    group = launch(cluster, "svc", hwplace.Restart(max_restarts=2))
    try:
        before = group.who().wait()
        in_flight = group.execute_on(1).sleep_then_answer(60)
        os.kill(before[1]["pid"], signal.SIGKILL)
        with pytest.raises(hwplace.WorkerError, match=r"has died.*it is being restarted") as caught:
            in_flight.wait()
        assert caught.value.restarted is True
        assert caught.value.rank == 1
        status = serving(group)
        after = group.who().wait()  # the same handle reaches the new process
        assert after[1]["pid"] != before[1]["pid"]
        assert [a["pid"] for a in after[:1] + after[2:]] == [b["pid"] for b in before[:1] + before[2:]]
        assert after[1]["env"] == before[1]["env"]  # the same placement
        assert after[1]["tag"] == "t"  # the same constructor arguments
        rank, attempt, cause = after[1]["restarted_with"]
        assert (rank, attempt) == (1, 1)
        assert "died" in cause
        assert [(s.state, s.restarts) for s in status] == [("serving", 0), ("serving", 1), ("serving", 0),
                                                           ("serving", 0)]
        assert "died" in status[1].cause
        assert status[1].node_rank == group.placements[1].node_rank
        shown = cluster.executor().cluster_status(None)  # type: ignore[attr-defined]  # hwplace status's source
        svc = next(g for g in shown["groups"] if g["group"] == "svc")
        assert [(w["state"], w["restarts"]) for w in svc["workers"]] == [("serving", 0), ("serving", 1),
                                                                          ("serving", 0), ("serving", 0)]
        assert "died" in svc["workers"][1]["cause"]
        assert sorted(lease["ranks"][0] for lease in shown["leases"] if lease["group"] == "svc") == [0, 1, 2, 3]
        text = io.StringIO()
        print_status(shown, text)
        assert "svc rank 1: serving, 1 restart used; last cause: the worker process died" in text.getvalue()
    finally:
        group.shutdown()


def test_a_rank_that_dies_idle_is_restarted_too_and_restarts_used_up_end_the_group(cluster: hwplace.Cluster) -> None:
    group = launch(cluster, "pair", hwplace.Restart(max_restarts=1))
    try:
        pid = group.who().wait()[0]["pid"]
        os.kill(pid, signal.SIGKILL)  # no call in flight: the executor's watch sees it
        restarted(group, 0)
        second = group.execute_on(0).who().wait()[0]
        assert second["pid"] != pid
        assert second["restarted_with"][1] == 1
        with pytest.raises(hwplace.WorkerError, match="has died") as caught:
            group.execute_on(0).die().wait()
        assert caught.value.restarted is False  # its one restart is used
        status = group.status()
        assert (status[0].state, status[0].restarts) == ("dead", 1)
        assert "died" in status[0].cause
        assert status[1].state == "serving"
        with pytest.raises(hwplace.WorkerError, match=r"restarts are used up \(1 of 1\)"):
            group.execute_on(1).who()  # the group has ended: every call says why
    finally:
        group.shutdown()


def test_scope_group_starts_every_rank_again(cluster: hwplace.Cluster) -> None:
    group = launch(cluster, "pair", hwplace.Restart(max_restarts=1, scope="group"))
    try:
        before = [w["pid"] for w in group.who().wait()]
        survivor_call = group.execute_on(1).sleep_then_answer(60)
        with pytest.raises(hwplace.WorkerError, match="it is being restarted") as died:
            group.execute_on(0).die().wait()
        assert died.value.restarted is True
        with pytest.raises(hwplace.WorkerError, match="it is being restarted") as stopped:
            survivor_call.wait()  # the living rank was stopped for the group's restart
        assert stopped.value.restarted is True
        assert stopped.value.rank == 1
        status = serving(group)
        after = group.who().wait()
        assert all(a["pid"] != b for a, b in zip(after, before, strict=True))
        assert [a["restarted_with"][1] for a in after] == [1, 1]
        assert [(s.state, s.restarts) for s in status] == [("serving", 1), ("serving", 1)]
    finally:
        group.shutdown()


def test_without_a_policy_a_dead_rank_stays_dead_and_the_others_serve(cluster: hwplace.Cluster) -> None:
    group = launch(cluster, "other", None)
    try:
        with pytest.raises(hwplace.WorkerError, match="has died") as caught:
            group.execute_on(0).die().wait()
        assert caught.value.restarted is False
        assert group.execute_on(1).who().wait()[0]["rank"] == 1  # today's rule: the other rank serves
        while group.status()[0].state != "dead":
            time.sleep(0.05)
        with pytest.raises(hwplace.WorkerError, match="has died"):
            group.execute_on(0).who().wait()
    finally:
        group.shutdown()


def test_a_bad_policy_is_refused_by_key(cluster: hwplace.Cluster) -> None:
    with pytest.raises(hwplace.ConfigError, match=r"restart\.max_restarts"):
        hwplace.Restart(max_restarts=-1)
    with pytest.raises(hwplace.ConfigError, match=r"restart\.scope.*did you mean 'group'"):
        hwplace.Restart(max_restarts=1, scope="grop")
    with pytest.raises(hwplace.ConfigError, match="is not a restart policy"):
        launch(cluster, "other", {"max_restarts": 1})  # type: ignore[arg-type]


class Talker(hwplace.Worker):
    """Sends to and receives from a peer; tells whether it is a restarted process."""

    def __init__(self) -> None:
        self.attempt = 0

    def on_restart(self, info: Any) -> None:
        self.attempt = info.attempt

    def pid(self) -> int:
        return os.getpid()

    def send_to(self, group: str, rank: int, message: Any) -> None:
        self.send((self.attempt, message), group, rank)

    def recv_from(self, group: str, rank: int) -> Any:
        return self.recv(group, rank)  # no timeout: the module's limit is around it


def test_a_survivor_s_recv_waits_for_its_restarting_peer_and_talks_to_the_new_process(
        cluster: hwplace.Cluster) -> None:
    plan = hwplace.ComponentPlacement(cluster.config, cluster)
    peers = Talker.create_group().launch(cluster, plan.get_strategy("svc"), name="peers",
                                         restart=hwplace.Restart(max_restarts=1))
    try:
        first = peers.execute_on(0).recv_from("peers", 1)  # a pair connects once both ends use it
        peers.execute_on(1).send_to("peers", 0, "before").wait()
        assert first.wait() == [(0, "before")]
        waiting = peers.execute_on(0).recv_from("peers", 1)  # waits through the peer's death and restart
        os.kill(peers.execute_on(1).pid().wait()[0], signal.SIGKILL)
        restarted(peers, 1)
        peers.execute_on(1).send_to("peers", 0, "after").wait()  # the new process: a new pair, built on first use
        assert waiting.wait() == [(1, "after")]
        back = peers.execute_on(1).recv_from("peers", 0)
        peers.execute_on(0).send_to("peers", 1, "back").wait()  # and the survivor's sends reach it too
        assert back.wait() == [(0, "back")]
    finally:
        peers.shutdown()


def test_a_recv_from_a_peer_that_died_for_good_is_a_worker_error_naming_it(cluster: hwplace.Cluster) -> None:
    plan = hwplace.ComponentPlacement(cluster.config, cluster)
    peers = Talker.create_group().launch(cluster, plan.get_strategy("pair"), name="mortal")
    try:
        first = peers.execute_on(0).recv_from("mortal", 1)
        peers.execute_on(1).send_to("mortal", 0, "hello").wait()
        assert first.wait() == [(0, "hello")]
        waiting = peers.execute_on(0).recv_from("mortal", 1)
        os.kill(peers.execute_on(1).pid().wait()[0], signal.SIGKILL)
        with pytest.raises(hwplace.WorkerError, match=r"group 'mortal' rank 0.*group 'mortal' rank 1"):
            waiting.wait()
    finally:
        peers.shutdown()


class Doomed(Talker):
    """Its restarted processes cannot come back: ``on_restart`` raises."""

    def on_restart(self, info: Any) -> None:
        raise RuntimeError("the checkpoint it reloads is gone")


def test_a_rank_whose_last_restart_fails_is_dead_to_its_peers_too(cluster: hwplace.Cluster) -> None:
    plan = hwplace.ComponentPlacement(cluster.config, cluster)
    doomed = Doomed.create_group().launch(cluster, plan.get_strategy("pair"), name="doomed",
                                          restart=hwplace.Restart(max_restarts=1))
    peer = Talker.create_group().launch(cluster, plan.get_strategy("other"), name="peer")
    try:
        first = peer.execute_on(0).recv_from("doomed", 1)
        doomed.execute_on(1).send_to("peer", 0, "hello").wait()
        assert first.wait() == [(0, "hello")]
        os.kill(doomed.execute_on(1).pid().wait()[0], signal.SIGKILL)
        while doomed.status()[1].state != "dead":  # restarting, then its restart fails with none left
            time.sleep(0.05)
        status = doomed.status()[1]
        assert status.restarts == 1
        assert "its restart failed" in status.cause
        assert "the checkpoint it reloads is gone" in status.cause
        # the group entry the peers read says so too (it said "serving", of the process that failed to start)
        while current_executor().find_group("doomed").state(1) != "dead":  # type: ignore[union-attr]
            time.sleep(0.05)
        with pytest.raises(hwplace.WorkerError, match=r"group 'peer' rank 0.*group 'doomed' rank 1"):
            peer.execute_on(0).recv_from("doomed", 1).wait()  # at once: no wait for a process that will not come
    finally:
        doomed.shutdown()
        peer.shutdown()


class Taker(Talker):
    def take(self, channel: hwplace.Channel, count: int) -> list[Any]:
        return channel.get_batch(count, ack=False)  # type: ignore[no-any-return]  # held until acknowledged

    def take_and_ack(self, channel: hwplace.Channel, count: int) -> list[Any]:
        taken = channel.get_batch(count, ack=False)
        channel.ack(taken)
        return taken  # type: ignore[no-any-return]


def test_a_rank_killed_holding_taken_items_gives_them_back_and_its_new_process_takes_them(
        cluster: hwplace.Cluster) -> None:
    plan = hwplace.ComponentPlacement(cluster.config, cluster)
    takers = Taker.create_group().launch(cluster, plan.get_strategy("pair"), name="takers",
                                         restart=hwplace.Restart(max_restarts=1))
    channel = hwplace.Channel.create("held-by-a-restarted-rank")
    try:
        for item in range(6):
            channel.put(f"item {item}", weight=1, version=item)
        assert takers.execute_on(1).take(channel, 3).wait() == [["item 0", "item 1", "item 2"]]
        assert channel.stats().held == 3
        os.kill(takers.execute_on(1).pid().wait()[0], signal.SIGKILL)
        restarted(takers, 1)
        while channel.stats().held:  # the host sees the dead taker's connection close on its own loop
            time.sleep(0.05)
        # back at the head, in order, with their versions: the new process takes the same items again
        assert takers.execute_on(1).take_and_ack(channel, 3).wait() == [["item 0", "item 1", "item 2"]]
        assert takers.execute_on(0).take_and_ack(channel, 3).wait() == [["item 3", "item 4", "item 5"]]
        stats = channel.stats()
        assert (stats.redelivered, stats.held, stats.size) == (3, 0, 0)
    finally:
        channel.close()
        takers.shutdown()


class Gated(Talker):
    """Its restarted processes come back only once the test lets them: ``on_restart`` waits for a file."""

    def __init__(self, gate: str) -> None:
        super().__init__()
        self.gate = gate

    def on_restart(self, info: Any) -> None:
        while not os.path.exists(self.gate):  # the module's limit bounds it
            time.sleep(0.02)
        super().on_restart(info)

    def recv_within(self, group: str, rank: int, timeout: float) -> tuple[str, Any]:
        try:
            return "received", self.recv(group, rank, timeout=timeout)
        except TimeoutError as exc:
            return "TimeoutError", str(exc)


def test_a_rank_coming_back_is_restarting_holds_its_lease_and_a_recv_from_it_waits_within_its_timeout(
        cluster: hwplace.Cluster, tmp_path: Any) -> None:
    gate = str(tmp_path / "gate")
    plan = hwplace.ComponentPlacement(cluster.config, cluster)
    gated = Gated.create_group(gate).launch(cluster, plan.get_strategy("pair"), name="gated",
                                            restart=hwplace.Restart(max_restarts=1))
    try:
        first = gated.execute_on(0).recv_from("gated", 1)  # a pair connects once both ends use it
        gated.execute_on(1).send_to("gated", 0, "before").wait()
        assert first.wait() == [(0, "before")]
        os.kill(gated.execute_on(1).pid().wait()[0], signal.SIGKILL)
        while gated.status()[1].state != "restarting":  # and it stays so: its on_restart waits for the gate
            time.sleep(0.05)
        status = gated.status()
        assert (status[0].state, status[1].state) == ("serving", "restarting")
        assert "died" in status[1].cause
        shown = cluster.executor().cluster_status(None)  # type: ignore[attr-defined]  # hwplace status's source
        text = io.StringIO()
        print_status(shown, text)
        assert "gated rank 1: restarting" in text.getvalue()
        # its devices stay leased to this job while it comes back
        assert sorted(lease["ranks"][0] for lease in shown["leases"] if lease["group"] == "gated") == [0, 1]
        # a recv from it waits for it within its timeout: a TimeoutError naming the peer, not a WorkerError
        [(outcome, message)] = gated.execute_on(0).recv_within("gated", 1, 1.0).wait()
        assert outcome == "TimeoutError"
        assert "recv from group 'gated' rank 1" in message
        assert gated.status()[1].state == "restarting"
        open(gate, "w").close()
        restarted(gated, 1)
        waiting = gated.execute_on(0).recv_within("gated", 1, 120.0)
        gated.execute_on(1).send_to("gated", 0, "after").wait()  # the new process
        assert waiting.wait() == [("received", (1, "after"))]
    finally:
        gated.shutdown()


class Crashing(Service):
    def exit_badly(self) -> None:
        os._exit(3)

    def segfault(self) -> None:
        faulthandler.disable()  # no traceback dump: the process ends on the signal itself
        ctypes.string_at(0)  # reads address 0: SIGSEGV


def test_a_rank_that_exits_or_crashes_comes_back_in_place_as_a_killed_one_does(cluster: hwplace.Cluster) -> None:
    strategy = hwplace.ComponentPlacement(cluster.config, cluster).get_strategy("other")
    group = Crashing.create_group("t").launch(cluster, strategy, name="crashing",
                                              restart=hwplace.Restart(max_restarts=2))
    try:
        before = group.execute_on(0).who().wait()[0]
        for used, end in enumerate(("exit_badly", "segfault"), start=1):
            with pytest.raises(hwplace.WorkerError, match=r"has died.*it is being restarted") as caught:
                getattr(group.execute_on(0), end)().wait()
            assert caught.value.restarted is True
            restarted(group, 0, used)
            after = group.execute_on(0).who().wait()[0]
            assert after["pid"] != before["pid"]
            assert after["env"] == before["env"]  # the same placement
            assert after["restarted_with"][:2] == (0, used)
            before = after
        status = group.status()
        assert [(s.state, s.restarts) for s in status] == [("serving", 2), ("serving", 0)]
    finally:
        group.shutdown()


def test_a_call_made_while_its_rank_is_being_replaced_is_not_a_second_death(
        cluster: hwplace.Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call made in the moment a restart replaces its rank's process (the new process's number given out, the
    process itself not yet started) reaches the new process: it never goes to the old one while blaming the new
    one, which made the old process's death, already being restarted, a second death that restarted it again.
    The executor's own start of the new process is slowed here, so that the call lands in that moment."""
    group = launch(cluster, "pair", hwplace.Restart(max_restarts=3))
    runtime = type(group._runtime)  # the executor's runtime: its start of a process is slowed
    starting = "_start" if hasattr(runtime, "_start") else "_start_message"  # Ray's; the process executor's
    start = getattr(runtime, starting)
    replacing = threading.Event()

    def slow_start(self: Any, rank: int, attempt: int = 0, cause: str = "") -> Any:
        if attempt:  # a restart: its new process is numbered, not yet started
            replacing.set()
            time.sleep(2)  # the moment, widened: the test's call is made in it
        return start(self, rank, attempt, cause)

    monkeypatch.setattr(runtime, starting, slow_start)
    try:
        before = group.execute_on(1).who().wait()[0]
        os.kill(before["pid"], signal.SIGKILL)  # no call in flight: the executor's watch sees it and restarts
        replacing.wait()
        answer = group.execute_on(1).who().wait()[0]  # made once the restart had begun: the new process answers,
        assert isinstance(answer, dict), answer  # once it is constructed
        assert answer["pid"] != before["pid"], answer
        status = restarted(group, 1)
        assert [(s.state, s.restarts) for s in status] == [("serving", 0), ("serving", 1)], status
        after = group.execute_on(1).who().wait()[0]
        assert after["restarted_with"][:2] == (1, 1)
    finally:
        group.shutdown()


class SlowToStart(hwplace.Worker):
    """A constructor that takes a moment: a call sent meanwhile must wait for it, not find no worker there."""

    def __init__(self) -> None:
        time.sleep(1)

    async def pid(self) -> int:
        return os.getpid()


def test_an_async_call_sent_while_its_rank_s_new_process_is_constructed_waits_for_the_constructor(
        cluster: hwplace.Cluster) -> None:
    strategy = hwplace.ComponentPlacement(cluster.config, cluster).get_strategy("other")
    group = SlowToStart.create_group().launch(cluster, strategy, name="slow", restart=hwplace.Restart(max_restarts=2))
    try:
        before = group.execute_on(0).pid().wait()[0]
        os.kill(before, signal.SIGKILL)
        while group.status()[0].restarts < 1:  # the restart has begun: the new process's constructor runs (for a
            time.sleep(0.01)  # second at least, unless this thread was held up that long)
        after = group.execute_on(0).pid().wait()[0]  # an async method: on a thread apart from the constructor's
        assert isinstance(after, int), after
        assert after != before
        assert [(s.state, s.restarts) for s in serving(group)] == [("serving", 1), ("serving", 0)]
    finally:
        group.shutdown()
