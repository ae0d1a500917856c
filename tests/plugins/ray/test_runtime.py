"""The Ray group runtime (``plugins/ray/runtime.py``): arguments and results that cannot be pickled."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import hwplace
from hwplace_plugins.ray.pytest_plugin import LocalRay

ray = pytest.importorskip("ray")

CONFIG = {"cluster": {"num_nodes": 1, "component_placement": {"pair": {"node_group": "node", "placement": "0:0-1"}}}}


class Echo(hwplace.Worker):
    def __init__(self, extra: Any = None) -> None:
        self.extra = extra

    def echo(self, value: Any, other: Any = None) -> Any:
        return value

    def lock(self) -> dict[str, Any]:
        return {"held": threading.Lock()}

    def exception(self) -> Any:
        return ray.exceptions.RayActorError()  # a value like any other


@pytest.fixture(scope="module")
def placement(hwplace_local_ray: LocalRay) -> hwplace.ComponentPlacement:
    return hwplace.ComponentPlacement(CONFIG, hwplace.Cluster(CONFIG["cluster"]))


@pytest.fixture
def group(placement: hwplace.ComponentPlacement) -> Any:
    group = Echo.create_group().launch(placement.cluster, placement.get_strategy("pair"), name="pickling")
    yield group
    group.shutdown()


def test_an_argument_that_does_not_pickle_names_the_method_the_ranks_and_its_type(group: Any) -> None:
    with pytest.raises(hwplace.WorkerError, match=r"^group 'pickling': echo\(\) was not sent to ranks 0, 1: "
                       r"argument 'other', a _thread\.lock, cannot be pickled \(cannot pickle '_thread\.lock' "
                       r"object\); pass plain data") as info:
        group.echo(1, other=threading.Lock())
    assert len(str(info.value).splitlines()) == 1  # not Ray's page of serialisation diagnostics
    with pytest.raises(hwplace.WorkerError, match=r"^group 'pickling' rank 1: echo\(\) was not sent: argument 0, "
                       r"a _thread\.RLock, cannot be pickled"):
        group.execute_on(1).echo(threading.RLock())
    assert group.echo("fine").wait() == ["fine", "fine"]  # nothing was sent, the group lives on


def test_a_result_that_does_not_pickle_names_the_method_the_rank_and_the_type(group: Any) -> None:
    with pytest.raises(hwplace.WorkerError, match=r"^group 'pickling' rank 0 on node 0: lock\(\) returned a value "
                       r"that cannot be pickled \(a _thread\.lock does not pickle\)"):
        group.execute_on(0).lock().wait()
    assert group.echo(2).wait() == [2, 2]


def test_a_constructor_argument_that_does_not_pickle_fails_the_launch_and_frees_the_name(
    placement: hwplace.ComponentPlacement,
) -> None:
    with pytest.raises(hwplace.WorkerError, match=r"^group 'ctor': the constructor was not sent to ranks 0, 1: "
                       r"argument 'extra', a _thread\.lock, cannot be pickled"):
        Echo.create_group(extra=threading.Lock()).launch(placement.cluster, placement.get_strategy("pair"),
                                                         name="ctor")
    group = Echo.create_group(extra=1).launch(placement.cluster, placement.get_strategy("pair"), name="ctor")
    group.shutdown()


def test_a_method_that_returns_one_of_rays_exceptions_returns_it(group: Any) -> None:
    results = group.exception().wait(timeout=60)
    assert [type(r) for r in results] == [ray.exceptions.RayActorError] * 2
    assert group.echo(3).wait(timeout=60) == [3, 3]  # the workers are alive
