"""The placement search equals brute force: on every fake cluster of up to 16 accelerators with nodes of one
size (and a sample of uneven ones, and of mixed capacities), each layout's best predicted step is the least
that trying every plan of that layout finds, where each plan is built as a real ``component_placement``
(``ComponentPlacement``) and predicted by ``hwplace.planning.cost.predict`` from its placements, not by the
search's own arithmetic."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import yaml

from hwplace.config.job_config import parse_job_config
from hwplace.foundation.errors import ConfigError, PlacementError
from hwplace.foundation.settings import FAKE_ACCELERATOR
from hwplace.inventory.cluster import Cluster
from hwplace.inventory.offline import fake_cluster
from hwplace.planning.component import ComponentPlacement
from hwplace.planning.cost import predict
from hwplace.planning.profile import NotMeasured, Profile, parse_profile
from hwplace.planning.search import NO_SPLIT, search_placements


def point(processes: int, stage: str, seconds: float, memory: dict[str, str], *, per: int = 1,
          swap: float | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"processes": processes, "devices_per_process": per,
                             "stages": {stage: {"seconds": seconds}}, "memory": memory}
    if swap is not None:
        entry["offload"] = {"seconds": swap / 2}
        entry["onload"] = {"seconds": swap / 2}
    return entry


TRAINER = {"scaling": "data-parallel", "points": [
    point(1, "train", 9.0, {"train": "50GiB", "offloaded": "1GiB"}, swap=0.6),
    point(4, "train", 2.6, {"train": "50GiB", "offloaded": "1GiB"}, swap=0.4),
    point(16, "train", 1.1, {"train": "50GiB", "offloaded": "1GiB"}, swap=0.3)]}
ROLLOUT = {"scaling": "data-parallel", "points": [  # two accelerators a process; it keeps 25 GiB between turns
    point(1, "generate", 7.0, {"generate": "40GiB", "idle": "25GiB"}, per=2),
    point(2, "generate", 3.9, {"generate": "40GiB", "idle": "25GiB"}, per=2),
    point(8, "generate", 1.3, {"generate": "40GiB", "idle": "25GiB"}, per=2)]}
REWARD = {"points": [  # measured only on 1 and 2 processes; it takes no turns
    point(1, "score", 2.5, {"score": "10GiB"}),
    point(2, "score", 1.5, {"score": "10GiB"})]}


def make_profile(**components: dict[str, Any]) -> Profile:
    return parse_profile({"version": 1, "components": components, "weight_sync": {"policy": {"bytes": "4GB"}},
                          "bandwidth": {"same-device": "400GB", "same-node": "20GB", "other-node": "5GB"}})


def job_of(names: Sequence[str], placement: dict[str, str] | None = None, num_nodes: int = 1,
           source_rank: int = 0) -> Any:
    placement = placement or {name: str(i) for i, name in enumerate(names)}
    return parse_job_config({"cluster": {"num_nodes": num_nodes, "component_placement": placement}, "weight_sync": {
        "policy": {"source": "trainer", "targets": ["rollout"], "source_rank": source_rank}}})


def layouts(names: Sequence[str]) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every set partition, by labelling each component with a cell number (canonical labellings only)."""
    for labels in itertools.product(range(len(names)), repeat=len(names)):
        if all(labels[i] <= max(labels[:i], default=-1) + 1 for i in range(len(labels))):
            cells = [tuple(n for n, label in zip(names, labels, strict=True) if label == k)
                     for k in range(max(labels) + 1)]
            yield tuple(cells)


def cluster_of(names: Sequence[str], counts: list[int], gib: Sequence[int] = ()) -> Cluster:
    """A fake cluster of ``counts`` accelerators per node; ``gib`` gives each accelerator's capacity in GiB, in
    rank order (80 GiB each by default)."""
    cluster = fake_cluster(job_of(names, num_nodes=len(counts)).cluster, accelerators_per_node=counts)
    if not gib:
        return cluster
    sizes = iter(gib)
    nodes = [dataclasses.replace(node, hardware={kind: tuple(
        dataclasses.replace(d, properties={"memory_bytes": next(sizes) * 2**30}) for d in devices)
        if kind == FAKE_ACCELERATOR else devices for kind, devices in node.hardware.items()})
        for node in cluster.nodes]
    return Cluster(cluster.config, nodes=nodes, plugin_manager=cluster.plugin_manager)


def brute_force(names: Sequence[str], counts: list[int], profile: Profile,
                gib: Sequence[int] = (), source_rank: int = 0) -> dict[tuple[str, ...], float]:
    """Each layout's least predicted step over every order and size of its cells, packed from accelerator 0,
    each plan built as a real placement and predicted from it; a layout without a plan is absent."""
    total = sum(counts)
    cluster = cluster_of(names, counts, gib)
    best: dict[tuple[str, ...], float] = {}
    for layout in layouts(names):
        key = tuple(",".join(cell) for cell in layout)
        for order in itertools.permutations(layout):
            for sizes in itertools.product(range(1, total + 1), repeat=len(order)):
                if sum(sizes) > total:
                    continue
                placement, first = {}, 0
                for cell, size in zip(order, sizes, strict=True):
                    span = f"{first}-{first + size - 1}"
                    for name in cell:
                        per = profile.components[name].points[0].devices_per_process
                        if size % per:
                            break
                        placement[name] = span if per == 1 else f"{span}:0-{size // per - 1}"
                    first += size
                if len(placement) < len(names):
                    continue
                try:
                    plan = ComponentPlacement(job_of(names, placement, len(counts), source_rank), cluster)
                    prediction = predict(plan, profile)
                except (NotMeasured, PlacementError):
                    continue
                except ConfigError as exc:  # a plan with fewer trainer processes than the sync's source rank
                    if exc.path != "weight_sync.policy.source_rank":
                        raise
                    continue
                if prediction.fits and prediction.step_seconds < best.get(key, math.inf):
                    best[key] = prediction.step_seconds
    return best


def shapes(most: int) -> list[list[int]]:
    """Every even cluster of up to ``most`` accelerators, and uneven ones of two and three nodes."""
    even = [[per] * nodes for nodes in range(1, most + 1) for per in range(1, most // nodes + 1)]
    uneven = [[a, b] for a in range(1, most) for b in range(1, most - a + 1) if a != b and a + b <= most]
    return even + uneven[::3] + [[4, 2, 1], [2, 3, 2], [5, 1, 6]]


def check(names: Sequence[str], counts: list[int], profile: Profile, gib: Sequence[int] = (),
          source_rank: int = 0) -> None:
    expected = brute_force(names, counts, profile, gib, source_rank)
    cluster = cluster_of(names, counts, gib)
    try:
        result = search_placements(job_of(names, num_nodes=len(counts), source_rank=source_rank), cluster, profile)
    except PlacementError:  # NotMeasured too
        assert expected == {}, counts
        return
    found = {tuple(",".join(cell) for cell in c.layout): c.step_seconds for c in result.candidates
             if c.step_seconds is not None}
    assert found.keys() == expected.keys(), counts
    for key, seconds in found.items():
        assert seconds == pytest.approx(expected[key], rel=1e-12), (counts, key)
    pasted = yaml.safe_load(result.component_placement())["component_placement"]
    prediction = predict(ComponentPlacement(job_of(names, pasted, len(counts), source_rank), cluster), profile)
    assert prediction.step_seconds == pytest.approx(result.best.step_seconds, rel=1e-12)
    assert prediction.fits


@pytest.mark.parametrize("counts", shapes(16), ids=lambda c: "x".join(map(str, c)))
def test_two_components_equal_brute_force_on_every_cluster_up_to_16(counts: list[int]) -> None:
    check(["trainer", "rollout"], counts, make_profile(trainer=TRAINER, rollout=ROLLOUT))


@pytest.mark.parametrize("counts", [c for c in shapes(8) if len(c) <= 4], ids=lambda c: "x".join(map(str, c)))
def test_three_components_equal_brute_force(counts: list[int]) -> None:
    check(["trainer", "rollout", "reward"], counts, make_profile(trainer=TRAINER, rollout=ROLLOUT, reward=REWARD))


@pytest.mark.parametrize("gib", [[40, 40, 80, 80, 80, 80, 40, 80], [80, 60, 80, 40, 80, 80, 24, 80],
                                 [60] * 8, [40] * 8], ids=lambda g: "-".join(map(str, g)))
def test_mixed_capacities_equal_brute_force(gib: list[int]) -> None:
    """Which accelerators a cell lands on decides whether it fits: the search tries every order."""
    check(["trainer", "rollout", "reward"], [4, 4], make_profile(trainer=TRAINER, rollout=ROLLOUT, reward=REWARD),
          gib)


def driven(entry: dict[str, Any], between: Sequence[float]) -> dict[str, Any]:
    """``entry`` with the driver's time between two steps at each of its points."""
    return {**entry, "points": [{**p, "between": {"seconds": b}, "spread": {"seconds": b / 2}}
                                for p, b in zip(entry["points"], between, strict=True)]}


@pytest.mark.parametrize("counts", [c for c in shapes(8) if len(c) <= 3], ids=lambda c: "x".join(map(str, c)))
def test_the_drivers_time_between_steps_equals_brute_force(counts: list[int]) -> None:
    """A cell is no faster than one component's cycle (its work and the driver's time between its steps), and the
    step is the expected longest of cells that vary: with figures where that binds apart and, for the reward,
    colocated too."""
    check(["trainer", "rollout", "reward"], counts, make_profile(
        trainer=driven(TRAINER, [1.0, 2.5, 3.0]), rollout=ROLLOUT, reward=driven(REWARD, [4.0, 4.0])))


def test_components_on_other_node_groups_keep_their_placement() -> None:
    job = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": {
        "rollout,trainer": "0-1", "env": {"node_group": "node", "placement": "0:0-1"}}},
        "weight_sync": {"policy": {"source": "trainer", "targets": ["rollout"]}}})
    cluster = fake_cluster(job.cluster, accelerators_per_node=4)
    result = search_placements(job, cluster, make_profile(trainer=TRAINER, rollout=ROLLOUT))
    pasted = yaml.safe_load(result.component_placement())["component_placement"]
    assert pasted["env"] == {"node_group": "node", "placement": "0:0-1"}
    raw = job.to_dict()
    raw["cluster"]["component_placement"] = pasted
    replanned = ComponentPlacement(parse_job_config(raw), cluster)
    assert predict(replanned, make_profile(trainer=TRAINER, rollout=ROLLOUT)).unprofiled == ("env",)
    assert result.best.label == "rollout,trainer"  # 7.1 s against 7.2 s apart; named in the config's order


def test_nothing_predictable_is_refused_naming_what_was_measured() -> None:
    only_four = {"points": [point(4, "train", 2.0, {"train": "10GiB"})]}
    job = job_of(["trainer", "rollout"])
    cluster = fake_cluster(job.cluster, accelerators_per_node=2)
    with pytest.raises(NotMeasured, match=r"^no placement of trainer, rollout on 2 accelerators can be predicted"):
        search_placements(job, cluster, make_profile(trainer=only_four, rollout=ROLLOUT))
    with pytest.raises(NotMeasured, match=r"trainer \| rollout: no count of accelerators up to 2 predicts trainer "
                                          r"\(measured on 4 processes\)"):
        search_placements(job, cluster, make_profile(trainer=only_four, rollout=ROLLOUT))
    with pytest.raises(NotMeasured, match="the profile has no entry for component 'rollout'"):
        search_placements(job, cluster, make_profile(trainer=only_four))


def test_nothing_that_fits_is_a_placement_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", "30GiB")
    job = job_of(["trainer", "rollout"])
    cluster = fake_cluster(job.cluster, accelerators_per_node=4)
    with pytest.raises(PlacementError, match=r"no placement of trainer, rollout on .* fits: .*peak memory") as caught:
        search_placements(job, cluster, make_profile(trainer=TRAINER, rollout=ROLLOUT))
    assert not isinstance(caught.value, NotMeasured)


@pytest.mark.parametrize(("count", "bell"), [(1, 1), (2, 2), (3, 5), (4, 15), (5, 52)])
def test_every_layout_is_searched_once(count: int, bell: int) -> None:
    names = ["a", "b", "c", "d", "e"][:count]
    job = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": dict.fromkeys(names, "0")}})
    flat = make_profile(**{n: {"points": [point(1, "work", 1.0, {"work": "1GiB"})]} for n in names})
    result = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=count), flat)
    assert len({c.layout for c in result.candidates}) == len(result.candidates) == bell
    assert result.best.label == " | ".join(names)  # apart, each on its own accelerator: 1 s


@pytest.mark.parametrize("counts", [[2], [3], [4], [2, 2], [3, 1], [6], [3, 3], [4, 4], [2, 2, 2]],
                         ids=lambda c: "x".join(map(str, c)))
def test_a_later_source_rank_equals_brute_force(counts: list[int]) -> None:
    """The sync's source is the trainer's rank 1: plans with one trainer process have no such rank, and where
    rank 1 lies decides the sync's transport."""
    check(("trainer", "rollout"), counts, make_profile(trainer=TRAINER, rollout=ROLLOUT), source_rank=1)


@pytest.mark.parametrize("feedback", [False, True], ids=["to it", "to it and from it"])
@pytest.mark.parametrize("env_node", [0, 1])
def test_a_weight_sync_with_a_component_that_keeps_its_placement_costs_as_placed(env_node: int, feedback: bool) -> None:
    """A sync's target or source keeps its placement (on the node group), so the search takes the sync's transport
    from where that placement lies: the same as the prediction of the plan it pastes, node by node."""
    job = parse_job_config({"cluster": {"num_nodes": 2, "component_placement": {
        "trainer": "0", "rollout": "1", "env": {"node_group": "node", "placement": f"{env_node}:0-1"}}},
        "weight_sync": {"policy": {"source": "trainer", "targets": ["rollout"]},
                        "obs": {"source": "trainer", "targets": ["env"]},
                        **({"feedback": {"source": "env", "targets": ["rollout"]}} if feedback else {})}})
    cluster = fake_cluster(job.cluster, accelerators_per_node=[2, 2])
    profile = parse_profile({"version": 1, "components": {
        "trainer": TRAINER, "rollout": ROLLOUT,
        "env": {"points": [{"processes": 2, "stages": {"step": {"seconds": 0.5}}}]}},
        "weight_sync": {"policy": {"bytes": "4GB"}, "obs": {"bytes": "8GB"}, "feedback": {"bytes": "1GB"}},
        "bandwidth": {"same-device": "400GB", "same-node": "20GB", "other-node": "5GB"}})
    result = search_placements(job, cluster, profile)
    raw = job.to_dict()
    raw["cluster"]["component_placement"] = yaml.safe_load(result.component_placement())["component_placement"]
    plan = ComponentPlacement(parse_job_config(raw), cluster)
    prediction = predict(plan, profile)
    assert prediction.step_seconds == pytest.approx(result.best.step_seconds, rel=1e-12)
    searched = {s.name: s.transport for s in result.best.syncs}
    assert searched == {s.name: s.transport for s in prediction.syncs}
    trainer = plan.get_placements("trainer")[0].node_rank
    rollout = {p.node_rank for p in plan.get_placements("rollout")}
    assert searched["obs"] == ("same-node" if trainer == env_node else "other-node")
    assert searched.get("feedback", "") == ("" if not feedback else "same-node" if rollout == {env_node} else
                                            "other-node")


@pytest.mark.parametrize("counts", [[4], [2, 2], [3, 3], [8]], ids=lambda c: "x".join(map(str, c)))
def test_every_candidate_s_cells_and_syncs_are_those_of_its_pasted_plan(counts: list[int]) -> None:
    """Each predicted layout's cells (seconds with their syncs, peak memory of their accelerators) and syncs
    (transport, seconds) are what ``predict`` finds for the placement that candidate pastes."""
    names = ["trainer", "rollout", "reward"]
    profile = make_profile(trainer=TRAINER, rollout=ROLLOUT, reward=REWARD)
    cluster = cluster_of(names, counts)
    result = search_placements(job_of(names, num_nodes=len(counts)), cluster, profile)
    predicted = [c for c in result.candidates if c.cells is not None]
    assert predicted
    for candidate in predicted:
        pasted = yaml.safe_load(result.component_placement(candidate))["component_placement"]
        plan = ComponentPlacement(job_of(names, pasted, len(counts)), cluster)
        prediction = predict(plan, profile)
        assert prediction.step_seconds == pytest.approx(candidate.step_seconds, rel=1e-12)
        assert [(s.name, s.transport) for s in candidate.syncs] == [(s.name, s.transport) for s in prediction.syncs]
        assert [s.seconds for s in candidate.syncs] == pytest.approx([s.seconds for s in prediction.syncs])
        seconds = {frozenset(c.components): c.seconds for c in prediction.cells}
        assert candidate.cells is not None
        for cell in candidate.cells:
            assert cell.seconds == pytest.approx(seconds[frozenset(cell.components)], rel=1e-12)
            peaks = [m.peak for m in prediction.memory if cell.first <= m.index + sum(counts[:m.node_rank])
                     < cell.first + cell.size]
            assert [cell.peak] * cell.size == peaks


ROLLOUT_ONE = {"scaling": "data-parallel", "points": [  # one accelerator a process
    point(1, "generate", 6.0, {"generate": "30GiB", "idle": "20GiB"}),
    point(3, "generate", 2.2, {"generate": "30GiB", "idle": "20GiB"})]}
TRAINER_ONE = {"points": [point(1, "train", 1.0, {"train": "20GiB"})]}


@pytest.mark.parametrize("counts", [[3, 1], [2, 2], [1, 3], [2, 1, 1], [3, 2]], ids=lambda c: "x".join(map(str, c)))
def test_a_target_whose_last_process_lies_on_another_node_equals_brute_force(counts: list[int]) -> None:
    """A rollout of one accelerator a process may start on the trainer's node and end on the next: its sync
    goes to another node."""
    check(["trainer", "rollout"], counts, make_profile(trainer=TRAINER_ONE, rollout=ROLLOUT_ONE))


@pytest.mark.parametrize("env_node", [0, 1])
def test_a_component_that_keeps_its_placement_and_its_sync_can_set_the_step(env_node: int) -> None:
    """The env keeps its placement and is slower than any plan of the others: the step is its work and its
    sync's seconds, as the prediction of the pasted plan has it."""
    job = parse_job_config({"cluster": {"num_nodes": 2, "component_placement": {
        "trainer": "0", "rollout": "1", "env": {"node_group": "node", "placement": f"{env_node}:0-1"}}},
        "weight_sync": {"policy": {"source": "trainer", "targets": ["rollout"]},
                        "obs": {"source": "trainer", "targets": ["env"]}}})
    cluster = fake_cluster(job.cluster, accelerators_per_node=[2, 2])
    profile = parse_profile({"version": 1, "components": {
        "trainer": TRAINER, "rollout": ROLLOUT,
        "env": {"points": [{"processes": 2, "stages": {"step": {"seconds": 20.0}}}]}},
        "weight_sync": {"policy": {"bytes": "4GB"}, "obs": {"bytes": "8GB"}},
        "bandwidth": {"same-device": "400GB", "same-node": "20GB", "other-node": "5GB"}})
    result = search_placements(job, cluster, profile)
    raw = job.to_dict()
    raw["cluster"]["component_placement"] = yaml.safe_load(result.component_placement())["component_placement"]
    prediction = predict(ComponentPlacement(parse_job_config(raw), cluster), profile)
    obs = {s.name: s for s in result.best.syncs}["obs"]
    assert result.best.step_seconds == pytest.approx(20.0 + obs.seconds, rel=1e-12)
    assert prediction.step_seconds == pytest.approx(result.best.step_seconds, rel=1e-12)
    assert obs.seconds == pytest.approx(8 / (20 if obs.transport == "same-node" else 5))


ROLLOUT_THREE = {"scaling": "data-parallel", "points": [  # three accelerators a process
    point(1, "generate", 6.0, {"generate": "30GiB", "idle": "20GiB"}, per=3),
    point(2, "generate", 3.2, {"generate": "30GiB", "idle": "20GiB"}, per=3)]}


@pytest.mark.parametrize("counts", [[2, 3, 3], [1, 3, 3], [4, 3, 3], [2, 3], [3, 3]],
                         ids=lambda c: "x".join(map(str, c)))
def test_processes_of_three_accelerators_on_uneven_nodes_equal_brute_force(counts: list[int]) -> None:
    """A cell that starts at an accelerator that no process of three would start at on an even cluster: whether
    a process spans two nodes is counted from the cell's first accelerator."""
    check(["trainer", "rollout"], counts, make_profile(trainer=TRAINER_ONE, rollout=ROLLOUT_THREE))


def flat_job(count: int) -> tuple[Any, Profile]:
    """``count`` components of group 'cluster', each measured at one process of one second."""
    names = ["a", "b", "c", "d", "e", "f", "g"][:count]
    job = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": dict.fromkeys(names, "0")}})
    return job, make_profile(**{n: {"points": [point(1, "work", 1.0, {"work": "1GiB"})]} for n in names})


def test_what_the_search_cannot_take_is_refused_whole() -> None:
    job = job_of(["trainer", "rollout"])
    profile = make_profile(trainer=TRAINER, rollout=ROLLOUT)
    with pytest.raises(PlacementError, match="there are none") as caught:
        search_placements(job, fake_cluster(job.cluster, accelerators_per_node=0), profile)
    assert str(caught.value) == ("--search places components on accelerators, and there are none: group 'cluster' "
                                 "has 1 node (no accelerator was detected on its nodes, so the resources are the "
                                 "nodes themselves)")
    on_nodes = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": {
        "env": {"node_group": "node", "placement": "0"}}}})
    with pytest.raises(PlacementError, match="none is placed there") as caught:
        search_placements(on_nodes, fake_cluster(on_nodes.cluster, accelerators_per_node=2), profile)
    assert str(caught.value) == "--search places the components of group 'cluster', and none is placed there"
    seven, flat = flat_job(7)
    with pytest.raises(PlacementError, match="at most") as caught:
        search_placements(seven, fake_cluster(seven.cluster, accelerators_per_node=1), flat)
    assert str(caught.value) == "--search takes at most 6 components on group 'cluster', and there are 7"
    six, flat = flat_job(6)
    result = search_placements(six, fake_cluster(six.cluster, accelerators_per_node=1), flat)
    assert (result.best.label, result.best.step_seconds, len(result.candidates), result.devices) == (
        "a,b,c,d,e,f", 6.0, 203, 1)


def test_layouts_come_fastest_first_then_the_unpredicted_by_cell_count() -> None:
    job, flat = flat_job(3)
    result = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=1), flat)
    assert [c.label for c in result.candidates] == ["a,b,c", "a | b,c", "a,b | c", "a,c | b", "a | b | c"]
    assert result.candidates[-1].reason == ("its cells need at least 3 accelerators (a 1, b 1, c 1) and there are 1: "
                                            "profile smaller process counts")
    two = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=2), flat)
    assert [(c.label, c.step_seconds) for c in two.candidates] == [
        ("a | b,c", 2.0), ("a,b | c", 2.0), ("a,c | b", 2.0), ("a,b,c", 3.0), ("a | b | c", None)]
    assert two.devices == 2


def test_refusals_name_the_accelerators_every_layout_s_reason_and_the_first_component(
        monkeypatch: pytest.MonkeyPatch) -> None:
    only_four = {"points": [point(4, "train", 2.0, {"train": "10GiB"})]}
    job = job_of(["trainer", "rollout"])
    with pytest.raises(NotMeasured, match="can be predicted") as measured:
        search_placements(job, fake_cluster(job.cluster, accelerators_per_node=2),
                          make_profile(trainer=only_four, rollout=ROLLOUT))
    assert measured.value.component == "trainer"
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", "30GiB")
    with pytest.raises(PlacementError, match="fits") as caught:
        search_placements(job, fake_cluster(job.cluster, accelerators_per_node=4),
                          make_profile(trainer=TRAINER, rollout=ROLLOUT))
    assert str(caught.value) == (f"no placement of trainer, rollout on 4 accelerators fits: trainer,rollout: "
                                 f"{NO_SPLIT}; trainer | rollout: {NO_SPLIT}")


def test_each_size_takes_the_fastest_of_the_accelerators_per_process_measured() -> None:
    """A rollout measured with 1 and with 2 accelerators a process: each count of accelerators takes the faster
    of the two where both were measured, and the one measured where the other was not."""
    rollout = {"points": [point(2, "generate", 5.0, {"generate": "10GiB"}),
                          point(3, "generate", 4.0, {"generate": "10GiB"}),
                          point(1, "generate", 3.0, {"generate": "10GiB"}, per=2),
                          point(2, "generate", 1.0, {"generate": "10GiB"}, per=2)]}
    job = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": {"rollout": "0"}}})
    for count, slot, seconds in ((2, (1, 2), 3.0), (4, (2, 2), 1.0)):
        best = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=count),
                                 make_profile(rollout=rollout)).best
        assert best.cells is not None
        assert ([(s.processes, s.devices_per_process) for s in best.cells[0].slots], best.step_seconds) == (
            [slot], seconds)
    slow = {"points": [*rollout["points"][:2], point(1, "generate", 6.0, {"generate": "10GiB"}, per=2)]}
    best = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=3), make_profile(rollout=slow)).best
    assert best.cells is not None
    assert ([(s.processes, s.devices_per_process) for s in best.cells[0].slots], best.step_seconds) == ([(3, 1)], 4.0)


def test_the_result_describes_the_accelerators_searched() -> None:
    job = job_of(["trainer", "rollout"])
    result = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=4),
                               make_profile(trainer=TRAINER, rollout=ROLLOUT))
    assert (result.devices, result.description) == (4, "group 'cluster' has 4 fake-accelerator resources")


def test_a_layout_predicted_to_take_no_time_ranks_first() -> None:
    """Apart, two components of 0 s take 0 s; colocated, their turns cost 0.4 s."""
    free = {"points": [{"processes": 1, "stages": {"work": {"seconds": 0.0}}, "offload": {"seconds": 0.1},
                        "onload": {"seconds": 0.1}}]}
    job = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": {"a": "0", "b": "1"}}})
    result = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=2), make_profile(a=free, b=free))
    assert [(c.label, c.step_seconds) for c in result.candidates] == [("a | b", 0.0), ("a,b", pytest.approx(0.4))]


def test_the_written_placement_of_the_searched_components_is_not_checked_against_the_cluster() -> None:
    """The trainer and the rollout are written on accelerators the cluster lacks: the search places them anew,
    and only the env, which keeps its placement, is placed as written."""
    job = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": {
        "trainer": "0-7", "rollout": "8-15", "env": {"node_group": "node", "placement": "0:0-1"}}},
        "weight_sync": {"policy": {"source": "trainer", "targets": ["rollout"]}}})
    result = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=2),
                               make_profile(trainer=TRAINER, rollout=ROLLOUT))
    assert result.best.label == "trainer,rollout"
    assert result.fixed == {"env": '{node_group: node, placement: "0:0-1"}'}


def test_accelerators_that_report_no_capacity_take_any_memory() -> None:
    names = ["trainer", "rollout"]
    cluster = cluster_of(names, [2])
    nodes = [dataclasses.replace(node, hardware={kind: tuple(dataclasses.replace(d, properties={}) for d in devices)
                                                 for kind, devices in node.hardware.items()})
             for node in cluster.nodes]
    unknown = Cluster(cluster.config, nodes=nodes, plugin_manager=cluster.plugin_manager)
    big = {"points": [point(1, "train", 1.0, {"train": "500GiB"})]}
    best = search_placements(job_of(names), unknown, make_profile(trainer=big, rollout=big)).best
    assert (best.label, best.peak) == ("trainer | rollout", 500 * 2**30)


def test_a_cell_fits_only_where_its_least_accelerator_holds_its_peak() -> None:
    """Eight accelerators, one of them smaller: a cell on all eight fits only if that one holds its peak."""
    eight = {"points": [point(8, "generate", 1.0, {"generate": "50GiB"})]}
    job = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": {"rollout": "0-7"}}})
    profile = make_profile(rollout=eight)
    with pytest.raises(PlacementError, match=r"^no placement of rollout on 8 accelerators fits: rollout: no split"):
        search_placements(job, cluster_of(["trainer", "rollout"], [8], [80] * 7 + [40]), profile)
    best = search_placements(job, cluster_of(["trainer", "rollout"], [8], [80] * 7 + [60]), profile).best
    assert best.cells is not None
    assert [(c.first, c.size, c.peak) for c in best.cells] == [(0, 8, 50 * 2**30)]


def test_a_cell_without_memory_figures_has_no_peak() -> None:
    job, flat = flat_job(2)
    unmeasured = make_profile(**{n: {"points": [{"processes": 1, "stages": {"work": {"seconds": 1.0}}}]}
                                 for n in ("a", "b")})
    for profile, peak in ((flat, 2**30), (unmeasured, None)):
        best = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=2), profile).best
        assert best.cells is not None
        assert [c.peak for c in best.cells] == [peak, peak]
        assert best.peak == peak


def test_a_declared_memory_counts_where_the_profile_measured_none() -> None:
    """The profile has no memory for the trainer: its ``resources:`` entry decides whether it fits."""
    unmeasured = {"points": [{"processes": 1, "stages": {"train": {"seconds": 1.0}}}]}
    profile = make_profile(trainer=unmeasured, rollout=unmeasured)

    def job_with(train: str) -> Any:
        return parse_job_config({"cluster": {"num_nodes": 1, "component_placement": {"trainer": "0", "rollout": "1"}},
                                 "resources": {"trainer": {"memory": {"train": train}}}})

    fitting = job_with("70GiB")
    best = search_placements(fitting, fake_cluster(fitting.cluster, accelerators_per_node=2), profile).best
    assert (best.label, best.peak) == ("trainer | rollout", 70 * 2**30)
    too_big = job_with("90GiB")
    with pytest.raises(PlacementError, match="fits") as caught:
        search_placements(too_big, fake_cluster(too_big.cluster, accelerators_per_node=2), profile)
    assert str(caught.value).endswith(f"trainer | rollout: {NO_SPLIT}")


def test_a_source_rank_beyond_the_processes_of_a_component_that_keeps_its_placement_is_refused() -> None:
    job = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": {
        "trainer": "0", "rollout": "1", "env": {"node_group": "node", "placement": "0:0-1"}}},
        "weight_sync": {"feedback": {"source": "env", "targets": ["rollout"], "source_rank": 2}}})
    profile = parse_profile({"version": 1, "components": {"trainer": TRAINER, "rollout": ROLLOUT},
                             "weight_sync": {"feedback": {"bytes": "1GB"}}})
    with pytest.raises(ConfigError, match="source_rank") as caught:
        search_placements(job, fake_cluster(job.cluster, accelerators_per_node=4), profile)
    assert (caught.value.path, caught.value.value) == ("weight_sync.feedback.source_rank", 2)
    assert str(caught.value) == "weight_sync.feedback.source_rank: component 'env' has ranks 0-1 (got 2)"


def kept_job(entry: dict[str, Any], group: dict[str, Any]) -> Any:
    """The trainer and the rollout on group 'cluster' (node 0), and an env that keeps ``entry`` on ``group``."""
    return parse_job_config({"cluster": {"num_nodes": 2, "node_groups": [group], "component_placement": {
        "trainer": "0", "rollout": "1", "env": entry}}})


def test_a_kept_component_of_several_accelerators_a_process_counts_at_that_point() -> None:
    """The env keeps one process of two accelerators on another group: the profile's point of one process of two
    accelerators predicts its cell, which sets the step."""
    job = kept_job({"node_group": "late", "placement": "0-1:0"}, {"label": "late", "node_ranks": 1})
    cluster = fake_cluster(job.cluster, accelerators_per_node=[2, 2])
    profile = make_profile(trainer=TRAINER, rollout=ROLLOUT,
                           env={"points": [point(1, "step", 20.0, {"step": "10GiB"}, per=2)]})
    assert search_placements(job, cluster, profile).best.step_seconds == 20.0


def test_a_kept_component_that_holds_several_robots_a_process_counts_as_one_device_a_process() -> None:
    """``devices_per_process`` counts accelerators: the env's process holds two robots, and the profile's point of
    one process (of one device) predicts its cell."""
    robots = {"label": "robot", "node_ranks": 1, "hardware": {"type": "fake-robot", "configs": [
        {"node_rank": 1, "name": "arm0"}, {"node_rank": 1, "name": "arm1"}]}}
    job = kept_job({"node_group": "robot", "placement": "0-1:0"}, robots)
    cluster = fake_cluster(job.cluster, accelerators_per_node=[2, 0])
    profile = make_profile(trainer=TRAINER, rollout=ROLLOUT,
                           env={"points": [{"processes": 1, "stages": {"step": {"seconds": 20.0}}}]})
    assert search_placements(job, cluster, profile).best.step_seconds == 20.0


def test_a_count_of_one_more_process_than_the_accelerators_is_not_predicted() -> None:
    only_three = {"points": [point(3, "train", 2.0, {"train": "10GiB"})]}
    job = job_of(["trainer", "rollout"])
    with pytest.raises(NotMeasured, match="can be predicted") as caught:
        search_placements(job, fake_cluster(job.cluster, accelerators_per_node=2),
                          make_profile(trainer=only_three, rollout=ROLLOUT))
    assert str(caught.value).endswith("trainer | rollout: no count of accelerators up to 2 predicts trainer "
                                      "(measured on 3 processes)")


def test_a_count_of_accelerators_tries_every_accelerators_per_process_that_divides_it() -> None:
    """Measured with two and with three accelerators a process: three accelerators take one process of three,
    although two does not divide three."""
    rollout = {"points": [point(1, "generate", 5.0, {"generate": "10GiB"}, per=2),
                          point(1, "generate", 4.0, {"generate": "10GiB"}, per=3)]}
    job = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": {"rollout": "0"}}})
    cluster = fake_cluster(job.cluster, accelerators_per_node=3)
    best = search_placements(job, cluster, make_profile(rollout=rollout)).best
    assert best.cells is not None
    assert ([(s.processes, s.devices_per_process) for s in best.cells[0].slots], best.step_seconds) == ([(1, 3)], 4.0)


def test_each_slot_carries_the_profile_point_that_predicts_it() -> None:
    job = job_of(["trainer", "rollout"])
    profile = make_profile(trainer=TRAINER, rollout=ROLLOUT)
    best = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=8), profile).best
    assert best.cells is not None
    slots = [s for cell in best.cells for s in cell.slots]
    assert slots
    for slot in slots:
        assert slot.point == profile.component(slot.component).at(slot.processes, slot.devices_per_process)


OFFLOADS_FROM_TWO = {"points": [  # offloads, but its offload and onload were measured only on 2 processes
    point(1, "train", 4.0, {"train": "20GiB", "offloaded": "1GiB"}),
    point(2, "train", 2.0, {"train": "20GiB", "offloaded": "1GiB"}, swap=0.5)]}
BOTH = {"points": [point(1, "generate", 3.0, {"generate": "20GiB"}),
                   point(2, "generate", 1.5, {"generate": "20GiB"})]}


def test_a_cell_size_whose_turns_cannot_be_predicted_is_skipped_for_a_larger_one() -> None:
    job = job_of(["trainer", "rollout"])
    result = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=2),
                               make_profile(trainer=OFFLOADS_FROM_TWO, rollout=BOTH))
    colocated = {c.label: c for c in result.candidates}["trainer,rollout"]
    assert colocated.cells is not None
    assert [c.size for c in colocated.cells] == [2]
    assert colocated.cells[0].seconds == pytest.approx(2.0 + 0.5 + 1.5 + 4 / 20)  # with its turns and the sync


def test_a_cell_whose_turns_cannot_be_predicted_at_any_size_says_why() -> None:
    job = job_of(["trainer", "rollout"])
    with pytest.raises(NotMeasured, match="can be predicted") as caught:
        search_placements(job, fake_cluster(job.cluster, accelerators_per_node=1),
                          make_profile(trainer=OFFLOADS_FROM_TWO, rollout=BOTH))
    assert str(caught.value) == (
        "no placement of trainer, rollout on 1 accelerator can be predicted from the profile: trainer,rollout: "
        "trainer offloads (its memory has an offloaded phase) but its profile at 1 process has no offload and "
        "onload seconds; trainer | rollout: its cells need at least 2 accelerators (trainer 1, rollout 1) and "
        "there are 1: profile smaller process counts")


def test_plans_without_the_sync_s_source_rank_are_not_predicted() -> None:
    """The sync's source is trainer rank 1 and the trainer was measured on one process only."""
    job = job_of(["trainer", "rollout"], source_rank=1)
    with pytest.raises(NotMeasured, match="can be predicted") as caught:
        search_placements(job, fake_cluster(job.cluster, accelerators_per_node=2),
                          make_profile(trainer=TRAINER_ONE, rollout=ROLLOUT_ONE))
    beyond = "weight_sync.policy.source_rank is 1, beyond trainer's 1 process there"
    assert str(caught.value).endswith(f"the profile: trainer,rollout: {beyond}; trainer | rollout: {beyond}")


def test_the_documented_refusal_names_every_cell_s_unmeasured_components() -> None:
    """docs/resources.md, 'The placement search': the worked example on one accelerator."""
    measured = {"points": [point(2, "work", 2.0, {"work": "10GiB"}), point(4, "work", 1.0, {"work": "10GiB"})]}
    job = job_of(["trainer", "rollout"])
    with pytest.raises(NotMeasured, match="can be predicted") as caught:
        search_placements(job, fake_cluster(job.cluster, accelerators_per_node=1),
                          make_profile(trainer=measured, rollout=measured))
    assert str(caught.value) == (
        "no placement of trainer, rollout on 1 accelerator can be predicted from the profile: trainer,rollout: no "
        "count of accelerators up to 1 predicts trainer (measured on 2 and 4 processes), rollout (measured on 2 and "
        "4 processes); trainer | rollout: no count of accelerators up to 1 predicts trainer (measured on 2 and 4 "
        "processes); no count of accelerators up to 1 predicts rollout (measured on 2 and 4 processes)")


def test_components_measured_on_no_common_count_name_their_counts_the_first_eight() -> None:
    """Colocated, the trainer (9 odd counts) and the rollout (8 even ones) share no count of accelerators."""
    trainer = {"points": [point(n, "train", 10.0 / n, {"train": "10GiB"}) for n in range(1, 18, 2)]}
    rollout = {"points": [point(n, "generate", 10.0 / n, {"generate": "10GiB"}) for n in range(2, 17, 2)]}
    job = job_of(["trainer", "rollout"])
    result = search_placements(job, fake_cluster(job.cluster, accelerators_per_node=18),
                               make_profile(trainer=trainer, rollout=rollout))
    colocated = {c.label: c for c in result.candidates}["trainer,rollout"]
    assert colocated.reason == ("no count of accelerators predicts all of them together: trainer on 1, 3, 5, 7, 9, "
                                "11, 13, 15, ...; rollout on 2, 4, 6, 8, 10, 12, 14, 16")
    assert result.best.label == "trainer | rollout"


def test_cells_too_large_for_the_accelerators_are_named_with_their_components() -> None:
    two = {"points": [point(2, "work", 1.0, {"work": "1GiB"})]}
    one = {"points": [point(1, "work", 1.0, {"work": "1GiB"})]}
    job = parse_job_config({"cluster": {"num_nodes": 1, "component_placement": dict.fromkeys("abc", "0")}})
    with pytest.raises(NotMeasured, match="can be predicted") as caught:
        search_placements(job, fake_cluster(job.cluster, accelerators_per_node=2), make_profile(a=two, b=two, c=one))
    assert ("; a,b | c: its cells need at least 3 accelerators (a,b 2, c 1) and there are 2: profile smaller "
            "process counts; ") in str(caught.value)


def scaled(entry: dict[str, Any], factor: float) -> dict[str, Any]:
    """``entry`` with every figure of seconds multiplied by ``factor``."""
    def scale(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: v * factor if k == "seconds" else scale(v) for k, v in value.items()}
        return [scale(v) for v in value] if isinstance(value, list) else value
    result: dict[str, Any] = scale(entry)
    return result


def test_steps_shorter_than_a_second_equal_brute_force() -> None:
    """The same components a hundred times faster: no bound of a second or more holds the search back."""
    check(["trainer", "rollout", "reward"], [4, 4], make_profile(
        trainer=scaled(TRAINER, 0.01), rollout=scaled(ROLLOUT, 0.01), reward=scaled(REWARD, 0.01)))
