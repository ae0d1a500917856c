"""The executor's narrow core and its optional capabilities: checked where a feature starts, documented from the
classes themselves; and the process's one session."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import hwplace
from hwplace.executor import (
    CORE_METHODS,
    ChannelHosting,
    Executor,
    GroupRuntime,
    Handle,
    Leases,
    LocalClusters,
    Rendezvous,
    Restarts,
    TurnArbitration,
    capabilities_of,
    check_executor,
    require,
)
from hwplace.testing import Session, fake_cluster, registered_plugin, swapped_session

DOCS = Path(__file__).resolve().parents[2] / "docs"
CAPABILITIES = (ChannelHosting, Rendezvous, Leases, TurnArbitration, LocalClusters, Restarts)


class Bare(Executor):
    """The core alone: discovers a fake cluster, starts no group."""

    name = "bare"

    def discover(self, config: Any, plugin_manager: Any) -> list[hwplace.Node]:
        return list(fake_cluster(num_nodes=config.num_nodes, accelerators_per_node=2).nodes)

    def free_port(self, node: hwplace.Node) -> int:
        return 29500

    def start_group(self, request: Any) -> GroupRuntime:
        raise AssertionError("never reached: launch checks the leases first")

    def find_group(self, name: str) -> None:
        return None

    def where(self) -> str:
        return "nowhere in particular"


class BarePlugin:
    @hwplace.hookimpl
    def hwplace_executors(self) -> list[Executor]:
        return [Bare()]


def documented(text: str, cls: type) -> set[str]:
    """The methods ``text`` names as ``Class.method`` for ``cls``, and those listed after it in a ``/`` chain."""
    found: set[str] = set()
    for match in re.finditer(rf"`{cls.__name__}\.([a-z_]+)(?:\([^`)]*\))?((?: / [a-z_]+(?:\([^`)]*\))?)*)", text):
        found.add(match.group(1))
        found.update(re.findall(r" / ([a-z_]+)", match.group(2)))
    return found


def public_methods(cls: type, base: type) -> set[str]:
    """What ``cls`` declares for implementers beyond ``base`` (``object`` or ``Capability``)."""
    return {name for name in vars(cls) if not name.startswith("_") and callable(getattr(cls, name))
            and name not in vars(base)} | {name for name, value in vars(cls).items()
                                           if isinstance(value, property) and not name.startswith("_")}


def test_the_plugin_guide_lists_exactly_the_methods_of_the_core_and_of_each_capability() -> None:
    text = (DOCS / "plugins.md").read_text()
    assert documented(text, Executor) == set(CORE_METHODS) == public_methods(Executor, object)
    assert documented(text, GroupRuntime) == public_methods(GroupRuntime, object)
    assert documented(text, Handle) == public_methods(Handle, object)
    for capability in CAPABILITIES:
        assert documented(text, capability) == set(capability.methods), capability.__name__
        declared = {name for name in vars(capability) if not name.startswith("_") and callable(vars(capability)[name])}
        assert declared == set(capability.methods), capability.__name__


def test_the_api_reference_names_the_core_and_every_capability_s_methods() -> None:
    text = (DOCS / "api.md").read_text()
    section = text[text.index("### `Executor`"):]
    section = section[: section.index("\n### ", 5)]
    first_line = section.splitlines()[2]
    assert set(re.findall(r"`([a-z_]+)`", first_line)) - {"name"} == set(CORE_METHODS)
    for capability in CAPABILITIES:
        listed = re.search(rf"`{capability.__name__}` \(([^)]*)\)", section)
        assert listed is not None, capability.__name__
        assert set(re.findall(r"`([a-z_]+)`", listed.group(1))) == set(capability.methods)


def test_an_executor_missing_a_core_method_is_refused_naming_it() -> None:
    class Half(Executor):
        name = "half"

        def discover(self, config: Any, plugin_manager: Any) -> list[hwplace.Node]:
            return []

    assert check_executor(Half()) == "Half does not implement free_port, start_group, find_group, where " \
                                     "(every executor's core)"
    assert check_executor(Bare()) is None


def test_require_names_the_executor_the_capability_and_its_methods() -> None:
    with pytest.raises(hwplace.PluginError, match="cannot host channels") as raised:
        require(Bare(), ChannelHosting, "Channel.create")
    assert str(raised.value) == ("Channel.create: the executor 'bare' cannot host channels (hwplace.Channel): it does "
                                 "not implement hwplace.executor.ChannelHosting (create_channel, connect_channel)")
    assert raised.value.plugins == ("bare",)
    assert capabilities_of(Bare()) == ()


def test_the_ray_executor_offers_every_capability() -> None:
    ray_executor = hwplace.get_plugin_manager().executor("ray")
    assert capabilities_of(ray_executor) == tuple(c.__name__ for c in CAPABILITIES)


@pytest.fixture
def bare_cluster() -> Any:
    manager = hwplace.PluginManager()
    with registered_plugin(BarePlugin(), "test-bare", plugin_manager=manager), \
            swapped_session(Session(plugin_manager=manager)) as session:
        cluster = hwplace.Cluster({"num_nodes": 1, "executor": "bare"}, plugin_manager=manager)
        assert session.executor is cluster.executor()  # the cluster fills the session
        yield cluster


def test_channels_on_an_executor_that_cannot_host_them_fail_at_create(bare_cluster: hwplace.Cluster) -> None:
    with pytest.raises(hwplace.PluginError, match=r"^Channel.create: the executor 'bare' cannot host channels"):
        hwplace.Channel.create("c")
    with pytest.raises(hwplace.PluginError, match=r"^Channel.connect: the executor 'bare' cannot host channels"):
        hwplace.Channel.connect("c", cluster=bare_cluster)


def test_a_weight_sync_without_a_rendezvous_fails_at_create(bare_cluster: hwplace.Cluster) -> None:
    with pytest.raises(hwplace.PluginError, match=r"^WeightSync.create: the executor 'bare' cannot sync weights .* "
                                                  r"hwplace.executor.Rendezvous \(kv_put, kv_wait\)"):
        hwplace.WeightSync.create("policy", source="trainer", targets=("rollout",), cluster=bare_cluster)


def test_a_launch_without_leases_fails_before_anything_starts(bare_cluster: hwplace.Cluster) -> None:
    class Member(hwplace.Worker):
        pass

    strategy = hwplace.PackedPlacementStrategy(0, 1)
    with pytest.raises(hwplace.PluginError, match=r"^launching group 'crew': the executor 'bare' cannot lease "
                                                  r"devices .* hwplace.executor.Leases \(register_group, "
                                                  r"deregister_group, update_workers, cluster_status\)"):
        Member.create_group().launch(bare_cluster, placement_strategy=strategy, name="crew")


def test_cluster_arguments_must_be_clusters() -> None:
    with pytest.raises(hwplace.ConfigError, match=r"cluster: 'here' is not a hwplace.Cluster"):
        hwplace.Channel.create("c", cluster="here")  # type: ignore[arg-type]
    with pytest.raises(hwplace.ConfigError, match=r"cluster: 3 is not a hwplace.Cluster"):
        hwplace.WeightSync.create("w", "trainer", cluster=3)  # type: ignore[arg-type]


def test_a_swapped_session_is_used_inside_its_block_and_the_previous_one_after() -> None:
    before = hwplace.executor.session()
    with swapped_session() as inner:
        assert hwplace.executor.session() is inner is not before
        with pytest.raises(hwplace.ConfigError, match="no running cluster in this process"):
            inner.executor  # noqa: B018 (the property raises)
        with pytest.raises(hwplace.HwplaceError, match=r"WeightSync\.latest runs inside a worker"):
            inner.worker_context("WeightSync.latest")
        made: list[int] = inner.state("x", list)
        again: object = inner.state("x", dict)
        assert again is made  # made once
    assert hwplace.executor.session() is before
    with pytest.raises(RuntimeError, match="the block fails"), swapped_session():
        raise RuntimeError("the block fails")
    assert hwplace.executor.session() is before
