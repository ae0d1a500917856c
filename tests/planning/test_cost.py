"""The cost model on planned placements (``predict``): colocated components serialize and pay their turns,
apart ones pipeline, weight syncs cost their bytes over their slowest transport, memory follows the rule of
``resources:``."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest

from hwplace.config.job_config import parse_job_config
from hwplace.foundation.errors import ConfigError
from hwplace.inventory.offline import fake_cluster
from hwplace.planning.component import ComponentPlacement
from hwplace.planning.cost import expected_longest, predict
from hwplace.planning.profile import NotMeasured, Profile, parse_profile

GIB = 2**30


def profile(trainer_memory: dict[str, Any] | None = None, swap: bool = True, sync: bool = True) -> Profile:
    trainer: dict[str, Any] = {"processes": 2, "stages": {"train": {"seconds": 3.0}},
                               "memory": trainer_memory or {"train": "50GiB", "offloaded": "1GiB"}}
    if swap:
        trainer.update(offload={"seconds": 0.25}, onload={"seconds": 0.5})
    return parse_profile({"version": 1, "components": {
        "trainer": {"points": [trainer, {**trainer, "processes": 1}]},
        "rollout": {"points": [{"processes": p, "stages": {"generate": {"seconds": 4.0 / p}}} for p in (1, 2, 4)]}},
        "weight_sync": {"policy": {"bytes": "2GB"}} if sync else {},
        "bandwidth": {"same-device": "200GB", "same-node": "20GB", "other-node": "4GB"}})


def plan(placement: dict[str, Any], num_nodes: int = 1, per_node: int = 4, **extra: Any) -> ComponentPlacement:
    job = parse_job_config({"cluster": {"num_nodes": num_nodes, "component_placement": placement},
                            "weight_sync": {"policy": {"source": "trainer", "targets": ["rollout"]}}, **extra})
    return ComponentPlacement(job, fake_cluster(job.cluster, accelerators_per_node=per_node))


def test_colocated_components_serialize_and_pay_their_turns() -> None:
    prediction = predict(plan({"trainer,rollout": "0-1"}), profile())
    (cell,) = prediction.cells
    assert cell.components == ("trainer", "rollout")
    # trainer 3 + its offload and onload 0.75 + rollout 2 (it declares no offloaded phase: no turn cost)
    # + the sync: 2 GB over same-node (rollout rank 1 is on accelerator 1) at 20 GB/s = 0.1
    assert cell.parts == (("trainer", 3.0), ("trainer offload+onload", 0.75), ("rollout", 2.0),
                          ("weight sync policy (same-node)", 0.1))
    assert prediction.step_seconds == pytest.approx(5.85)
    assert prediction.syncs[0].transport == "same-node"


def test_apart_components_pipeline_bounded_by_the_slowest() -> None:
    prediction = predict(plan({"trainer": "0-1", "rollout": "2-3"}), profile())
    trainer, rollout = prediction.cells
    assert trainer.seconds == pytest.approx(3.1)
    assert rollout.seconds == pytest.approx(2.1)
    assert prediction.step_seconds == pytest.approx(3.1)


def test_a_cell_is_no_faster_than_one_components_cycle_with_the_drivers_time_between_steps() -> None:
    def driven(between: float) -> Profile:
        data = profile().to_json()
        for entry in data["components"]["trainer"]["points"]:
            entry["between"] = {"seconds": between}
        return parse_profile(data)

    apart = predict(plan({"trainer": "0-1", "rollout": "2-3"}), driven(1.5))
    assert apart.cells[0].parts == (("trainer", 3.0), ("trainer between steps (driver)", 1.5),
                                    ("weight sync policy (same-node)", 0.1))
    assert apart.step_seconds == pytest.approx(4.6)
    # colocated, the rollout works while the driver does: the turns' 3 + 0.75 + 2 outlast the trainer's 4.5
    assert predict(plan({"trainer,rollout": "0-1"}), driven(1.5)).step_seconds == pytest.approx(5.85)
    # a driver slower between steps than the rollout's turn: the trainer's cycle, 3 + 3, binds the cell
    colocated = predict(plan({"trainer,rollout": "0-1"}), driven(3.0))
    assert colocated.cells[0].parts == (("trainer", 3.0), ("trainer between steps (driver)", 3.0),
                                        ("weight sync policy (same-node)", 0.1))
    assert colocated.step_seconds == pytest.approx(6.1)


def test_cells_whose_times_vary_take_the_expected_longest_of_them() -> None:
    assert expected_longest([]) == 0.0
    assert expected_longest([(3.0, 0.0), (2.0, 0.0), (1.0, 0.0)]) == 3.0  # nothing varies: the longest
    # two alike, each varying by s: the longer of the two is s / sqrt(pi) longer on average
    assert expected_longest([(2.0, 0.3), (2.0, 0.3)]) == pytest.approx(2.0 + 0.3 / math.sqrt(math.pi))
    # max(X, 0) of X ~ N(1, 1): Phi(1) + phi(1), the exact mean (means apart, so the normal CDF is taken off 0)
    assert expected_longest([(1.0, 1.0), (0.0, 0.0)]) == pytest.approx(0.5 * (1 + math.erf(1 / math.sqrt(2)))
                                                                    + math.exp(-0.5) / math.sqrt(2 * math.pi))
    assert expected_longest([(1.0, 1.0), (0.0, 0.0)]) == pytest.approx(1.0833154705876864)
    # one far longer than the other: the other does not count
    assert expected_longest([(10.0, 0.1), (1.0, 0.1)]) == pytest.approx(10.0)
    # one varying by 0.5 against one that does not: E[max(X, 2)] for X ~ N(2, 0.5) = 2 + 0.5 * phi(0)
    assert expected_longest([(2.0, 0.5), (2.0, 0.0)]) == pytest.approx(2.0 + 0.5 / math.sqrt(2 * math.pi))
    data = profile().to_json()
    for entry in data["components"]["trainer"]["points"]:
        entry["spread"] = {"seconds": 0.4}
    apart = predict(plan({"trainer": "0-1", "rollout": "2-3"}), parse_profile(data))
    assert apart.cells[0].spread == 0.4
    assert apart.cells[1].spread == 0.0
    assert apart.step_seconds == pytest.approx(expected_longest([(3.1, 0.4), (2.1, 0.0)]))
    assert 3.1 < apart.step_seconds < 3.1 + 0.4


def test_a_sync_costs_by_its_slowest_transport() -> None:
    same_device = predict(plan({"trainer,rollout": "0"}), profile())
    assert same_device.syncs[0].transport == "same-device"
    assert same_device.syncs[0].seconds == pytest.approx(0.01)
    other_node = predict(plan({"trainer": "0-1", "rollout": "2-3"}, num_nodes=2, per_node=2), profile())
    assert other_node.syncs[0].transport == "other-node"
    assert other_node.syncs[0].seconds == pytest.approx(0.5)


def test_memory_measured_or_declared_follows_the_rule_of_resources() -> None:
    prediction = predict(plan({"trainer,rollout": "0-1"}, resources={"rollout": {"memory": {"generate": "30GiB"}}}),
                         profile())
    # trainer works: 50 GiB + rollout, which declares no turn figure, keeps its 30 GiB
    assert prediction.peak == 80 * GIB
    assert prediction.fits
    over = predict(plan({"trainer,rollout": "0-1"}, resources={"rollout": {"memory": {"generate": "31GiB"}}}),
                   profile())
    assert not over.fits


def test_what_the_profile_cannot_say_is_refused() -> None:
    with pytest.raises(NotMeasured, match=r"^trainer was measured on 1 and 2 processes, not on 4 processes; "
                                          r"profile a run with 4 processes$"):
        predict(plan({"trainer": "0-3", "rollout": "0-3"}), profile())
    with pytest.raises(NotMeasured, match=r"trainer offloads .* but its profile at 2 processes has no offload and "
                                          r"onload seconds"):
        predict(plan({"trainer,rollout": "0-1"}), profile(swap=False))
    # apart, the offload is never paid: no need to have measured it
    assert predict(plan({"trainer": "0-1", "rollout": "2-3"}), profile(swap=False)).step_seconds == pytest.approx(3.1)
    with pytest.raises(NotMeasured, match="no bytes for weight sync 'policy'") as caught:
        predict(plan({"trainer": "0-1", "rollout": "2-3"}), profile(sync=False))
    again = pickle.loads(pickle.dumps(caught.value))
    assert (type(again), str(again), again.component) == (NotMeasured, str(caught.value), "policy")


def test_components_the_profile_lacks_are_listed_not_predicted() -> None:
    prediction = predict(plan({"trainer": "0-1", "rollout": "2-3", "reward": "3"}), profile())
    assert prediction.unprofiled == ("reward",)
    assert [c.components for c in prediction.cells] == [("trainer",), ("rollout",)]


def test_a_component_whose_processes_hold_different_numbers_of_accelerators_is_not_predicted() -> None:
    with pytest.raises(NotMeasured, match=r"^trainer's processes hold different numbers of accelerators \(\[1, 2\]\): "
                                          r"the cost model predicts components whose processes are alike$") as caught:
        predict(plan({"trainer": "0-1:0,2:1", "rollout": "3"}), profile())
    assert caught.value.component == "trainer"


def test_a_process_without_accelerators_counts_as_one_device_per_process() -> None:
    on_nodes = {"trainer": "0-1", "rollout": {"node_group": "node", "placement": "0:0-1"}}
    prediction = predict(plan(on_nodes), profile())
    assert (prediction.points["rollout"].processes, prediction.points["rollout"].devices_per_process) == (2, 1)


def test_a_weight_sync_whose_source_rank_the_source_lacks_is_refused_by_key() -> None:
    sync = {"policy": {"source": "trainer", "targets": ["rollout"], "source_rank": 1}}
    assert predict(plan({"trainer": "0-1", "rollout": "2-3"}, weight_sync=sync), profile()).syncs[0].name == "policy"
    sync["policy"]["source_rank"] = 2
    with pytest.raises(ConfigError, match="has ranks") as caught:
        predict(plan({"trainer": "0-1", "rollout": "2-3"}, weight_sync=sync), profile())
    assert (caught.value.path, caught.value.problem, caught.value.value) == (
        "weight_sync.policy.source_rank", "component 'trainer' has ranks 0-1", 2)


def test_an_unprofiled_component_s_declared_memory_still_counts() -> None:
    layout = {"trainer": "0-1", "rollout": "2-3", "reward": "0"}  # reward shares accelerator 0 with the trainer
    assert predict(plan(layout, resources={"reward": {"memory": {"score": "20GiB"}}}), profile()).fits
    prediction = predict(plan(layout, resources={"reward": {"memory": {"score": "40GiB"}}}), profile())
    assert prediction.unprofiled == ("reward",)
    assert not prediction.fits  # the trainer's measured 50 GiB and reward's declared 40 GiB on 80 GiB
    assert prediction.peak == 90 * GIB


def test_the_expected_longest_of_three_cells_is_near_the_exact_one() -> None:
    # three independent N(0, 1): the exact mean of the longest is 3 / (2 sqrt(pi)); folding by Clark's moments
    # approximates it within a few tenths of a percent
    assert expected_longest([(0.0, 1.0)] * 3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=5e-3)
    assert expected_longest([(5.0, 1.0)] * 3) == pytest.approx(5 + 3 / (2 * math.sqrt(math.pi)), rel=5e-3)


def test_a_spread_too_small_to_tell_from_rounding_counts_as_none() -> None:
    """The spreads count as none below 1e-12 of the larger mean (and never above 1e-21 s): the longest mean,
    exactly; a spread above that threshold is taken as it is, however small the means."""
    assert expected_longest([(1000.0, 1e-10), (1000.0, 0.0)]) == 1000.0  # 1e-10 is below 1e-12 of 1000 s
    assert expected_longest([(0.0, 1e-22), (0.0, 0.0)]) == 0.0  # below the floor of 1e-21 s
    # above it: E[max(X, 0)] for X ~ N(0, 1e-15) = 1e-15 * phi(0)
    assert expected_longest([(0.0, 1e-15), (0.0, 0.0)]) == pytest.approx(1e-15 / math.sqrt(2 * math.pi),
                                                                         rel=1e-9, abs=0)
