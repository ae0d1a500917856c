"""Worker groups without a cluster (SPEC section 6): the torch variables, worker specs, launch's checks and
WorkerGroup's dispatch over a small in-process executor runtime."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

import hwplace
from hwplace import ConfigError, PlacementError, Worker, WorkerError
from hwplace.config.records import NodeGroup
from hwplace.contracts.records import WorkerContext
from hwplace.executor import GroupRequest, GroupRuntime, Handle, Leases
from hwplace.runtime.group import GroupLauncher, WorkerGroup, torch_env, worker_specs
from hwplace.runtime.hosting import RemoteFailure, run_method, start_worker
from hwplace.testing import backend_plugin, fake_cluster, registered_plugin

TORCH_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"}
ROBOT_GROUP = {
    "label": "robot",
    "node_ranks": 1,
    "hardware": {"type": "fake-robot", "configs": [{"node_rank": 1, "name": "arm0"}]},
}


def planned(
    section: dict[str, Any], name: str, isolate: bool = True
) -> tuple[hwplace.Cluster, list[hwplace.Placement]]:
    cluster = fake_cluster(section, accelerators_per_node=4)
    strategy = hwplace.ComponentPlacement({"cluster": section}, cluster).get_strategy(name)
    return cluster, strategy.get_placement(cluster, isolate_accelerator=isolate)


def placed(placement: str | dict[str, Any], isolate: bool = True, **section: Any) -> list[hwplace.Placement]:
    return planned({"num_nodes": 2, "component_placement": {"c": placement}, **section}, "c", isolate)[1]


def local_ranks(placements: list[hwplace.Placement]) -> list[str]:
    return [torch_env(p, len(placements), "head", 1234)["LOCAL_RANK"] for p in placements]


# -- torch_env ---------------------------------------------------------------------------------------


def test_torch_env_has_all_seven_variables_as_strings() -> None:
    placements = placed("0-7")
    env = torch_env(placements[5], 8, "10.0.0.1", 29500)
    assert env == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "1",
                   "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert all(isinstance(value, str) for value in env.values())


def test_local_rank_is_zero_when_isolated() -> None:
    assert local_ranks(placed("2-7")) == ["0"] * 6


def test_local_rank_is_the_accelerator_id_when_not_isolated() -> None:
    placements = placed("2-7", isolate=False)
    assert [p.local_rank for p in placements] == [0, 1, 0, 1, 2, 3]  # not what LOCAL_RANK must be
    assert local_ranks(placements) == ["2", "3", "0", "1", "2", "3"]


def test_local_rank_is_the_first_own_accelerator() -> None:
    assert local_ranks(placed("0-7:0-3", isolate=False)) == ["0", "2", "0", "2"]
    assert local_ranks(placed("0-7:0-3")) == ["0", "0", "0", "0"]


def test_processes_sharing_an_accelerator_get_its_local_rank() -> None:
    assert local_ranks(placed("1-2:0-3", isolate=False)) == ["1", "1", "2", "2"]
    assert local_ranks(placed("1-2:0-3")) == ["0", "0", "0", "0"]


@pytest.mark.parametrize("isolate", [True, False])
def test_process_without_accelerator_gets_its_process_local_rank(isolate: bool) -> None:
    placements = placed({"node_group": "node", "placement": "0-1:0-3"}, isolate)
    assert [p.local_accelerator_id for p in placements] == [-1] * 4
    assert local_ranks(placements) == ["0", "1", "0", "1"]
    envs = [torch_env(p, 4, "head", 1) for p in placements]
    assert [(e["NODE_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [("0", "2"), ("0", "2"), ("1", "2"), ("1", "2")]


@pytest.mark.parametrize("isolate", [True, False])
def test_device_process_gets_its_process_local_rank(isolate: bool) -> None:
    placements = placed({"node_group": "robot", "placement": "0:0-1"}, isolate, node_groups=[ROBOT_GROUP])
    assert placements[0].visible_accelerators == (() if isolate else (0, 1, 2, 3))
    assert local_ranks(placements) == ["0", "1"]


# -- worker_specs ------------------------------------------------------------------------------------


GPU_SECTION = {
    "num_nodes": 2,
    "node_groups": [{
        "label": "gpu",
        "node_ranks": "all",
        "env_configs": [
            {"node_ranks": "all", "env_vars": {"SHARED": "1"}},
            {"node_ranks": 1, "env_vars": {"ONLY_ON_ONE": "yes"}, "python_interpreter_path": "/opt/one/bin/python"},
        ],
    }],
    "component_placement": {"actor": {"node_group": "gpu", "placement": "2-5"}},
}


def test_worker_specs_per_node_env_and_interpreter() -> None:
    cluster, placements = planned(GPU_SECTION, "actor")
    specs = worker_specs(cluster, placements, 29500)
    assert [s.placement for s in specs] == placements
    assert [s.node for s in specs] == [cluster.nodes[0]] * 2 + [cluster.nodes[1]] * 2
    assert [dict(s.process_env) for s in specs] == [{"SHARED": "1"}] * 2 + [{"SHARED": "1", "ONLY_ON_ONE": "yes"}] * 2
    assert [s.python_interpreter_path for s in specs] == [None, None, "/opt/one/bin/python", "/opt/one/bin/python"]


@pytest.mark.parametrize("isolate", [True, False])
def test_worker_specs_env_has_isolation_and_torch_variables(isolate: bool) -> None:
    cluster, placements = planned(GPU_SECTION, "actor", isolate)
    specs = worker_specs(cluster, placements, 29500)
    for spec, placement in zip(specs, placements, strict=True):
        assert set(spec.env) == TORCH_VARIABLES | {"FAKE_VISIBLE_DEVICES"} | set(spec.process_env)
        assert spec.env["FAKE_VISIBLE_DEVICES"] == placement.env["FAKE_VISIBLE_DEVICES"]
        assert spec.env == {**spec.process_env, **placement.env, **torch_env(placement, 4, "fake-node-0", 29500)}
        assert spec.env["SHARED"] == "1"  # env_configs are set again in the process, after the runtime's own
    assert [s.env["FAKE_VISIBLE_DEVICES"] for s in specs] == (["2", "3", "0", "1"] if isolate else ["0,1,2,3"] * 4)


def test_master_addr_is_rank_zeros_node() -> None:
    cluster, placements = planned({"num_nodes": 2, "component_placement": {"c": "4-7"}}, "c")
    assert {p.node_rank for p in placements} == {1}
    specs = worker_specs(cluster, placements, 4242)
    assert {(s.env["MASTER_ADDR"], s.env["MASTER_PORT"], s.env["WORLD_SIZE"]) for s in specs} == {
        ("fake-node-1", "4242", "4")}


def test_master_addr_follows_rank_zero_not_the_lowest_node() -> None:
    cluster = fake_cluster(None, num_nodes=2, accelerators_per_node=4)
    placements = hwplace.FlexiblePlacementStrategy([[4], [0]]).get_placement(cluster)
    assert [s.env["MASTER_ADDR"] for s in worker_specs(cluster, placements, 1)] == ["fake-node-1"] * 2


def test_worker_specs_for_a_group_unknown_to_the_config() -> None:
    cluster = fake_cluster(GPU_SECTION, accelerators_per_node=4)
    strategy = hwplace.PackedPlacementStrategy(0, 1, node_group=NodeGroup("adhoc", (1,)))
    placements = strategy.get_placement(cluster)
    specs = worker_specs(cluster, placements, 1, {g.label: g for g in strategy.groups(cluster)})
    assert [(dict(s.process_env), s.python_interpreter_path) for s in specs] == [({}, None)] * 2
    assert [s.env["NODE_RANK"] for s in specs] == ["1", "1"]
    with pytest.raises(hwplace.ConfigError, match="there is no node group 'adhoc'"):
        worker_specs(cluster, placements, 1)  # never silently without its env_configs


def test_worker_specs_take_env_configs_from_the_strategys_own_groups() -> None:
    """A ComponentPlacement of another config than the cluster's brings its own groups and their env_configs."""
    cluster = fake_cluster({"num_nodes": 2}, accelerators_per_node=4)
    strategy = hwplace.ComponentPlacement({"cluster": GPU_SECTION}, cluster).get_strategy("actor")
    specs = worker_specs(cluster, strategy.get_placement(cluster), 1, {g.label: g for g in strategy.groups(cluster)})
    assert [s.process_env.get("SHARED") for s in specs] == ["1"] * 4


# -- GroupLauncher.launch: its checks ----------------------------------------------------------------


class Adder(Worker):
    limit = 10

    def add(self, x: int) -> int:
        return x + self.rank

    def fail(self) -> None:
        raise ValueError(f"rank {self.rank} failed")


@pytest.fixture
def offline() -> tuple[hwplace.Cluster, hwplace.PlacementStrategy]:
    section = {"num_nodes": 1, "component_placement": {"c": "0-1"}}
    cluster = fake_cluster(section, accelerators_per_node=2)
    return cluster, hwplace.ComponentPlacement({"cluster": section}, cluster).get_strategy("c")


def test_launch_refuses_what_is_not_a_cluster(offline: tuple[hwplace.Cluster, hwplace.PlacementStrategy]) -> None:
    with pytest.raises(ConfigError, match=r"^cluster: \{'num_nodes': 1\} is not a hwplace\.Cluster"):
        Adder.create_group().launch({"num_nodes": 1}, offline[1], name="g")  # type: ignore[arg-type]


def test_launch_refuses_what_is_not_a_strategy(offline: tuple[hwplace.Cluster, hwplace.PlacementStrategy]) -> None:
    with pytest.raises(PlacementError, match=r"placement_strategy must be a hwplace placement strategy .*got '0-1'"):
        Adder.create_group().launch(offline[0], "0-1", name="g")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "-lead", ".hidden", "with space", "a/b", "x" * 101, "trailing\n", None, 3])
def test_launch_refuses_bad_group_names(
    offline: tuple[hwplace.Cluster, hwplace.PlacementStrategy], name: Any
) -> None:
    with pytest.raises(ConfigError, match=r"^name: .* is not a usable group name; 1 to 100 letters"):
        Adder.create_group().launch(offline[0], offline[1], name=name)


@pytest.mark.parametrize("name", ["actor", "A.b_c-1", "0", "x" * 100])
def test_offline_cluster_cannot_launch(offline: tuple[hwplace.Cluster, hwplace.PlacementStrategy], name: str) -> None:
    with pytest.raises(ConfigError, match=r"^cluster: this cluster was built from a given inventory .* can plan "
                                          r"but not run workers"):
        Adder.create_group().launch(offline[0], offline[1], name=name)


def test_launcher_copies_its_kwargs() -> None:
    kwargs = {"a": 1}
    launcher = GroupLauncher(Adder, (1,), kwargs)
    kwargs["a"] = 2
    assert launcher.kwargs == {"a": 1}


# -- WorkerGroup over an in-process runtime ----------------------------------------------------------


class DoneHandle(Handle):
    """Results computed at call time; a RemoteFailure becomes the WorkerError an executor raises."""

    def __init__(self, group: str, ranks: Sequence[int], results: list[Any], nodes: Sequence[int]) -> None:
        self.group, self.ranks, self.results, self.nodes = group, list(ranks), results, nodes

    def wait(self, timeout: float | None = None) -> list[Any]:
        for rank, result in zip(self.ranks, self.results, strict=True):
            if isinstance(result, RemoteFailure):
                raise result.error("a method", group=self.group, rank=rank, node_rank=self.nodes[rank])
        return list(self.results)

    def done(self) -> bool:
        return True


class InProcessRuntime(GroupRuntime):
    """One real worker per placement, hosted in this process with start_worker and called with run_method."""

    def __init__(self, name: str, worker_class: type[Worker], placements: Sequence[hwplace.Placement]) -> None:
        self.name = name
        self.nodes = [p.node_rank for p in placements]
        self.workers = [start_worker(lambda: worker_class, WorkerContext(name, p.rank, len(placements), p, {}), (), {})
                        for p in placements]
        self.calls: list[tuple[tuple[int, ...], str]] = []
        self.shutdowns = 0

    def call(self, ranks: Sequence[int], method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Handle:
        self.calls.append((tuple(ranks), method))
        results = [run_method(self.workers[rank], method, args, kwargs) for rank in ranks]  # type: ignore[arg-type]
        return DoneHandle(self.name, ranks, results, self.nodes)

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def group() -> WorkerGroup:
    placements = tuple(placed("0-7:0-3"))
    return WorkerGroup("adders", Adder, placements, InProcessRuntime("adders", Adder, placements))


def runtime_of(group: WorkerGroup) -> InProcessRuntime:
    runtime = group._runtime
    assert isinstance(runtime, InProcessRuntime)
    return runtime


def test_call_reaches_every_rank_in_rank_order(group: WorkerGroup) -> None:
    assert group.world_size == 4
    assert group.ranks == (0, 1, 2, 3)
    assert group.add(10).wait() == [10, 11, 12, 13]
    assert runtime_of(group).calls == [((0, 1, 2, 3), "add")]


def test_execute_on_narrows_to_the_ranks_given_in_order(group: WorkerGroup) -> None:
    view = group.execute_on(3, 1)
    assert view.add(0).wait() == [3, 1]
    assert group.add(0).wait() == [0, 1, 2, 3]  # the group itself is not narrowed
    assert runtime_of(group).calls == [((3, 1), "add"), ((0, 1, 2, 3), "add")]
    assert (view.name, view.world_size, view.placements) == (group.name, 4, group.placements)


def test_execute_on_needs_a_rank(group: WorkerGroup) -> None:
    with pytest.raises(WorkerError, match=r"^group 'adders': execute_on needs at least one rank$"):
        group.execute_on()


@pytest.mark.parametrize("rank", [4, -1, True, "1", 1.0, None])
def test_execute_on_refuses_bad_ranks(group: WorkerGroup, rank: Any) -> None:
    with pytest.raises(WorkerError, match=r"execute_on got rank .*; the group has ranks 0-3$") as exc:
        group.execute_on(0, rank)
    assert exc.value.group == "adders"


def test_failing_method_raises_worker_error(group: WorkerGroup) -> None:
    with pytest.raises(WorkerError, match=r"^group 'adders' rank 2 on node 1: a method raised ValueError: rank 2 "
                                          r"failed") as exc:
        group.execute_on(2, 3).fail().wait()
    assert exc.value.rank == 2
    assert "in fail" in (exc.value.remote_traceback or "")


def test_unknown_method_suggests_a_close_one(group: WorkerGroup) -> None:
    with pytest.raises(AttributeError, match=r"^Adder has no method 'ad'; did you mean 'add'\?$"):
        group.ad(1)
    with pytest.raises(AttributeError, match=r"^Adder has no method 'zzz'$"):
        group.zzz(1)
    assert runtime_of(group).calls == []


def test_attribute_that_is_not_a_method_is_not_callable(group: WorkerGroup) -> None:
    with pytest.raises(AttributeError, match=r"^Adder has no method 'limit'"):
        group.limit()


@pytest.mark.parametrize("name", ["_private", "__len__", "__deepcopy__"])
def test_private_names_are_refused(group: WorkerGroup, name: str) -> None:
    with pytest.raises(AttributeError, match=f"^{name}$"):
        getattr(group, name)
    assert not hasattr(group, name)


def test_calls_after_shutdown_raise(group: WorkerGroup) -> None:
    view = group.execute_on(0)
    group.shutdown()
    for target in (group, view, group.execute_on(1)):
        with pytest.raises(WorkerError, match=r"^group 'adders': cannot call 'add': the group was shut down$"):
            target.add(1)
    assert runtime_of(group).calls == []


def test_shutting_down_a_view_shuts_down_the_group(group: WorkerGroup) -> None:
    group.execute_on(1).shutdown()
    with pytest.raises(WorkerError, match="the group was shut down"):
        group.add(1)
    assert runtime_of(group).shutdowns == 1


def test_shutdown_is_idempotent(group: WorkerGroup) -> None:
    group.shutdown()
    group.shutdown()
    group.execute_on(0).shutdown()
    assert runtime_of(group).shutdowns == 1


def test_repr(group: WorkerGroup) -> None:
    assert repr(group) == "<WorkerGroup 'adders': 4 workers of Adder, running>"
    group.shutdown()
    assert repr(group) == "<WorkerGroup 'adders': 4 workers of Adder, shut down>"
    one = WorkerGroup("solo", Adder, group.placements[:1], InProcessRuntime("solo", Adder, group.placements[:1]))
    assert repr(one) == "<WorkerGroup 'solo': 1 worker of Adder, running>"


# -- GroupLauncher.launch over an in-process executor plugin ------------------------------------------


class SlowReady(Handle):
    """The constructors' handle: answers after ``polls`` timed-out waits, or raises a constructor's failure."""

    def __init__(self, runtime: LaunchedRuntime, polls: int) -> None:
        self.runtime, self.polls = runtime, polls

    def wait(self, timeout: float | None = None) -> list[Any]:
        if timeout is not None and self.polls > 0:
            self.polls -= 1
            raise TimeoutError("still starting")
        for spec, outcome in zip(self.runtime.request.workers, self.runtime.workers, strict=True):
            if isinstance(outcome, RemoteFailure):
                raise outcome.error("the constructor", group=self.runtime.request.name, rank=spec.placement.rank,
                                    node_rank=spec.placement.node_rank)
        return [None] * len(self.runtime.workers)

    @property
    def num_done(self) -> int:
        return len(self.runtime.workers) // 2


class LaunchedRuntime(InProcessRuntime):
    def __init__(self, request: GroupRequest, polls: int) -> None:
        self.request = request
        self.name = request.name
        self.nodes = [s.placement.node_rank for s in request.workers]
        self.workers = [start_worker(lambda: request.worker_class,
                                     WorkerContext(request.name, s.placement.rank, len(request.workers),
                                                   s.placement, s.env), request.args, request.kwargs)
                        for s in request.workers]
        self.calls, self.shutdowns, self.polls = [], 0, polls

    def ready(self) -> Handle:
        return SlowReady(self, self.polls)


class InProcessExecutor(hwplace.Executor, Leases):
    """Nodes from an offline inventory; workers hosted in this process. Records what launch asked of it."""

    name = "in-process"

    def __init__(self) -> None:
        self.ports: list[str] = []
        self.started: list[LaunchedRuntime] = []
        self.polls = 0
        self.registered: list[Any] = []
        self.deregistered: list[str] = []

    def discover(self, config: Any, plugin_manager: Any) -> list[hwplace.Node]:
        return list(fake_cluster(config, accelerators_per_node=4, plugin_manager=plugin_manager).nodes)

    def free_port(self, node: hwplace.Node) -> int:
        self.ports.append(node.node_id)
        return 29400 + node.rank

    def find_group(self, name: str) -> None:
        return None

    def where(self) -> str:
        return "this process"

    def register_group(self, record: Any) -> None:
        self.registered.append(record)

    def deregister_group(self, group: str) -> None:
        self.deregistered.append(group)

    def start_group(self, request: GroupRequest) -> GroupRuntime:
        runtime = LaunchedRuntime(request, self.polls)
        self.started.append(runtime)
        return runtime


class Greeter(Worker):
    def __init__(self, greeting: str, *, punctuation: str = "!") -> None:
        if greeting == "boom" and self.rank == 1:
            raise RuntimeError("rank 1 cannot greet")
        self.text = f"{greeting} from {self.rank}{punctuation}"

    def greet(self) -> str:
        return self.text


LAUNCH_SECTION = {
    "num_nodes": 2, "executor": "in-process",
    "node_groups": [{"label": "gpus", "node_ranks": "0-1",
                     "env_configs": [{"node_ranks": 1, "env_vars": {"ONLY_ON_ONE": "yes"},
                                      "python_interpreter_path": "/opt/py"}]}],
    "component_placement": {"greeters": {"node_group": "gpus", "placement": "5-7"}},
}


@pytest.fixture
def launching() -> Iterator[tuple[InProcessExecutor, hwplace.Cluster, hwplace.PlacementStrategy]]:
    executor = InProcessExecutor()
    with registered_plugin(backend_plugin(executor), name="in-process-plugin"):
        cluster = hwplace.Cluster(LAUNCH_SECTION)
        strategy = hwplace.ComponentPlacement({"cluster": LAUNCH_SECTION}, cluster).get_strategy("greeters")
        yield executor, cluster, strategy


def test_launch_asks_the_executor_with_every_workers_spec(launching: Any) -> None:
    executor, cluster, strategy = launching
    group = Greeter.create_group("hi", punctuation="?").launch(cluster, strategy, name="greeters")
    assert group.greet().wait() == ["hi from 0?", "hi from 1?", "hi from 2?"]
    assert (group.name, group.worker_class, group.world_size) == ("greeters", Greeter, 3)
    assert group.placements == tuple(strategy.get_placement(cluster))
    assert executor.ports == [cluster.nodes[1].node_id]  # MASTER_PORT is picked on rank 0's node
    request = executor.started[0].request
    assert (request.name, request.worker_class, request.args, dict(request.kwargs)) == (
        "greeters", Greeter, ("hi",), {"punctuation": "?"})
    assert [s.node for s in request.workers] == [cluster.nodes[1]] * 3
    assert [dict(s.process_env) for s in request.workers] == [{"ONLY_ON_ONE": "yes"}] * 3
    assert [s.python_interpreter_path for s in request.workers] == ["/opt/py"] * 3
    assert [s.env["MASTER_PORT"] for s in request.workers] == ["29401"] * 3
    assert [s.env["FAKE_VISIBLE_DEVICES"] for s in request.workers] == ["1", "2", "3"]
    assert executor.started[0].shutdowns == 0


def test_launch_without_isolation_shows_every_accelerator(launching: Any) -> None:
    executor, cluster, strategy = launching
    Greeter.create_group("hi").launch(cluster, strategy, name="open", isolate_accelerator=False)
    assert {s.env["FAKE_VISIBLE_DEVICES"] for s in executor.started[0].request.workers} == {"0,1,2,3"}


def test_a_failed_constructor_stops_the_group_and_names_its_rank(launching: Any) -> None:
    executor, cluster, strategy = launching
    with pytest.raises(WorkerError, match=r"^group 'greeters' rank 1 on node 1: the constructor raised "
                                          r"RuntimeError: rank 1 cannot greet"):
        Greeter.create_group("boom").launch(cluster, strategy, name="greeters")
    assert executor.started[0].shutdowns == 1


class NoProcesses(hwplace.PlacementStrategy):
    """A strategy of one's own that places nothing (the built-in ones refuse an empty list when made)."""

    def resource_lists(self, space: Any) -> list[list[int]]:
        return []


def test_a_strategy_placing_nothing_is_refused(launching: Any) -> None:
    executor, cluster, _ = launching
    with pytest.raises(PlacementError, match=r"^group 'empty': the strategy places no process$"):
        Greeter.create_group("hi").launch(cluster, NoProcesses(), name="empty")
    assert executor.started == []


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("count", "shown"), [(7, False), (8, True)])
def test_launch_shows_progress_on_a_terminal_from_eight_workers(
    launching: Any, monkeypatch: pytest.MonkeyPatch, count: int, shown: bool
) -> None:
    executor, cluster, _ = launching
    executor.polls = 2
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    strategy = hwplace.NodePlacementStrategy([0] * count)
    Greeter.create_group("hi").launch(cluster, strategy, name=f"g{count}")
    lines = terminal.getvalue().split("\r")
    if not shown:
        assert terminal.getvalue() == ""
        return
    assert lines[1:] == [
        f"hwplace: launching group 'g8': {count // 2}/8 workers ready (0 s)",
        f"hwplace: launching group 'g8': {count // 2}/8 workers ready (0 s)",
        "hwplace: launched group 'g8': 8/8 workers ready (0.0 s)\n",
    ]


def test_a_failed_constructor_ends_the_progress_line(launching: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    executor, cluster, _ = launching
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with pytest.raises(WorkerError, match="rank 1 cannot greet"):
        Greeter.create_group("boom").launch(cluster, hwplace.NodePlacementStrategy([0] * 8), name="g")
    assert terminal.getvalue() == "\n"
    assert executor.started[0].shutdowns == 1


def test_rank_zero_s_node_picks_the_port_and_the_strategy_s_own_groups_give_the_env(launching: Any) -> None:
    executor, _, _ = launching
    cluster = hwplace.Cluster({"num_nodes": 2, "executor": "in-process"})  # its config knows no group 'gpus'
    cfg = {"cluster": {**LAUNCH_SECTION, "component_placement": {"across": {"node_group": "gpus",
                                                                            "placement": "3-4"}}}}
    strategy = hwplace.ComponentPlacement(cfg, cluster).get_strategy("across")
    Greeter.create_group("hi").launch(cluster, strategy, name="across")
    assert executor.ports == [cluster.nodes[0].node_id]  # rank 0 is on node 0, rank 1 on node 1
    workers = executor.started[0].request.workers
    assert [s.placement.node_rank for s in workers] == [0, 1]
    assert [dict(s.process_env) for s in workers] == [{}, {"ONLY_ON_ONE": "yes"}]


def test_a_bad_name_is_quoted(offline: tuple[hwplace.Cluster, hwplace.PlacementStrategy]) -> None:
    with pytest.raises(ConfigError, match=r"^name: 'with space' is not a usable group name"):
        Adder.create_group().launch(offline[0], offline[1], name="with space")


def test_a_bad_rank_is_quoted(group: WorkerGroup) -> None:
    with pytest.raises(WorkerError, match=r"execute_on got rank 7; the group has ranks 0-3$"):
        group.execute_on(7)


@pytest.mark.parametrize("name", ["limt", "init"])
def test_only_public_methods_are_suggested(group: WorkerGroup, name: str) -> None:
    with pytest.raises(AttributeError, match=rf"^Adder has no method '{name}'$"):
        getattr(group, name)
