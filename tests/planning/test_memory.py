"""Memory per phase at plan time (SPEC §13): the peak of each accelerator by the rule, against its capacity.

A corpus of configs that fit and that do not, on devices of mixed capacities, a MIG-sized device, three sharers,
offloaded and not; then the rule itself (``peak``) against its definition, over random figures.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hwplace
from hwplace.config.resources import ComponentResources
from hwplace.planning.memory import DeviceMemory, Holding, capacity_of, check_memory, peak

GiB = 2**30
FAKE = "fake-accelerator"
TRAINER = {"memory": {"train": "50GiB", "idle": "40GiB", "offloaded": "1GiB"}}  # the SPEC's example
ROLLOUT = {"memory": {"generate": "30GiB", "idle": "20GiB", "offloaded": "0.5GiB"}}
CRITIC = {"memory": {"train": "20GiB", "offloaded": "2GiB"}}
REWARD = {"memory": {"score": "10GiB"}}  # takes no turns: holds its working figure throughout


def cluster(*nodes: list[int | None]) -> hwplace.Cluster:
    """Nodes of fake accelerators with these capacities (``None``: the device reports none)."""
    return hwplace.Cluster(nodes=[
        hwplace.Node(rank, f"n{rank}", f"a{rank}", {FAKE: tuple(
            hwplace.Device(i, "fake", properties={} if cap is None else {"memory_bytes": cap})
            for i, cap in enumerate(capacities)), "node": (hwplace.Device(0, "node", properties={"memory_bytes": 1}),)})
        for rank, capacities in enumerate(nodes)])


def job(placement: dict[str, Any], resources: dict[str, Any], num_nodes: int = 1) -> dict[str, Any]:
    return {"cluster": {"num_nodes": num_nodes, "component_placement": placement}, "resources": resources}


def plan(config: dict[str, Any], on: hwplace.Cluster) -> hwplace.ComponentPlacement:
    return hwplace.ComponentPlacement(config, on)


def peaks(placed: hwplace.ComponentPlacement) -> dict[tuple[int, int], tuple[int, str]]:
    """``(node, index) -> (peak in bytes, breakdown)`` of every accelerator."""
    return {(d.node_rank, d.index): (d.peak, d.breakdown()) for d in placed.memory}


# -- the corpus: configs that fit --------------------------------------------------------------------------

FITS = [
    pytest.param(  # the SPEC's pair, colocated with turns: the trainer works beside the offloaded rollout
        job({"trainer,rollout": "0-3"}, {"trainer": TRAINER, "rollout": ROLLOUT}), [[80 * GiB] * 4],
        {(0, i): (int(50.5 * GiB), "trainer train 50 GiB + rollout offloaded 512 MiB") for i in range(4)},
        id="two-sharers-offloaded"),
    pytest.param(  # idle, not offloaded: 50 + 20 while the trainer works, 30 + 40 while the rollout does
        job({"trainer,rollout": "0"}, {"trainer": {"memory": {"train": "50GiB", "idle": "40GiB"}},
                                       "rollout": {"memory": {"generate": "30GiB", "idle": "20GiB"}}}),
        [[70 * GiB]], {(0, 0): (70 * GiB, "trainer train 50 GiB + rollout idle 20 GiB")}, id="idle-not-offloaded"),
    pytest.param(  # no turns at all: both hold their working figure at once; exactly the capacity fits
        job({"trainer,rollout": "0"}, {"trainer": {"memory": {"train": "50GiB"}},
                                       "rollout": {"memory": {"generate": "30GiB"}}}),
        [[80 * GiB]], {(0, 0): (80 * GiB, "trainer train 50 GiB + rollout generate 30 GiB")}, id="no-turns-exact"),
    pytest.param(  # three sharers, all taking turns
        job({"trainer,rollout,critic": "0-1"}, {"trainer": TRAINER, "rollout": ROLLOUT, "critic": CRITIC}),
        [[80 * GiB] * 2],
        {(0, i): (int(52.5 * GiB), "trainer train 50 GiB + rollout offloaded 512 MiB + critic offloaded 2 GiB")
         for i in range(2)}, id="three-sharers"),
    pytest.param(  # three sharers, one of which takes no turns: its 10 GiB stay while the trainer works
        job({"trainer,rollout,reward": "0"}, {"trainer": TRAINER, "rollout": ROLLOUT, "reward": REWARD}),
        [[64 * GiB]], {(0, 0): (int(60.5 * GiB), "trainer train 50 GiB + rollout offloaded 512 MiB + reward "
                                                 "score 10 GiB")}, id="three-sharers-one-without-turns"),
    pytest.param(  # the peak is the rollout's when it is the larger: its largest working phase decides
        job({"trainer,rollout": "0"}, {"trainer": {"memory": {"train": "10GiB", "offloaded": 0}},
                                       "rollout": {"memory": {"generate": "30GiB", "prefill": "35GiB",
                                                              "idle": "20GiB"}}}),
        [[40 * GiB]], {(0, 0): (35 * GiB, "rollout prefill 35 GiB + trainer offloaded 0 B")}, id="largest-phase"),
    pytest.param(  # mixed capacities: a 24 GiB node takes the rollout, an 80 GiB node the trainer
        job({"trainer": "0-1", "rollout": "2-3"}, {"trainer": TRAINER, "rollout": {"memory": {"generate": "20GiB"}}},
            num_nodes=2),
        [[80 * GiB] * 2, [24 * GiB] * 2],
        {(0, 0): (50 * GiB, "trainer train 50 GiB"), (0, 1): (50 * GiB, "trainer train 50 GiB"),
         (1, 0): (20 * GiB, "rollout generate 20 GiB"), (1, 1): (20 * GiB, "rollout generate 20 GiB")},
        id="mixed-capacities"),
    pytest.param(  # a MIG-sized device (1g.10gb) beside whole GPUs: a small rollout fits its slice
        job({"trainer": "0", "rollout": "1"}, {"trainer": TRAINER, "rollout": {"memory": {"generate": "9GiB"}}}),
        [[80 * GiB, 10 * GiB]], {(0, 0): (50 * GiB, "trainer train 50 GiB"), (0, 1): (9 * GiB, "rollout generate "
                                                                                               "9 GiB")}, id="mig"),
    pytest.param(  # a device that reports no capacity is not checked; a trainer without turns holds it all
        job({"trainer,rollout": "0"}, {"trainer": {"memory": {"train": "1000TiB"}}, "rollout": ROLLOUT}),
        [[None]], {(0, 0): (1000 * 2**40 + 30 * GiB, "rollout generate 30 GiB + trainer train 1000 TiB")},
        id="capacity-unknown"),
    pytest.param(  # a component the section does not name counts for nothing (and is listed as undeclared)
        job({"trainer,rollout": "0"}, {"trainer": TRAINER}), [[50 * GiB]],
        {(0, 0): (50 * GiB, "trainer train 50 GiB")}, id="undeclared-sharer"),
    pytest.param(  # each of a process's accelerators holds the per-accelerator figure
        job({"trainer": "0-3:0-1"}, {"trainer": {"memory": {"train": "70GiB"}}}), [[80 * GiB] * 4],
        {(0, i): (70 * GiB, "trainer train 70 GiB") for i in range(4)}, id="two-accelerators-per-process"),
]


@pytest.mark.parametrize(("config", "capacities", "expected"), FITS)
def test_a_config_that_fits_plans_each_devices_peak(config: dict[str, Any], capacities: list[list[int | None]],
                                                    expected: dict[tuple[int, int], tuple[int, str]]) -> None:
    placed = plan(config, cluster(*capacities))
    assert peaks(placed) == expected
    for device in placed.memory:
        assert device.fits
        capacity = capacities[device.node_rank][device.index]
        assert device.capacity == capacity
        assert device.headroom == (None if capacity is None else capacity - device.peak)


# -- the corpus: configs that do not fit -------------------------------------------------------------------

REFUSED = [
    pytest.param(
        job({"trainer,rollout": "0-3"}, {"trainer": TRAINER, "rollout": ROLLOUT}), [[40 * GiB] * 4],
        "fake-accelerator 0 of node 0 does not hold its peak: 50.5 GiB (54223962112 bytes) when trainer is in phase "
        "'train' beside rollout (trainer train 50 GiB + rollout offloaded 512 MiB), but the device has 40 GiB "
        "(42949672960 bytes); 3 more devices do not fit either", id="spec-pair-on-40GiB"),
    pytest.param(
        job({"trainer,rollout": "0"}, {"trainer": {"memory": {"train": "50GiB"}},
                                       "rollout": {"memory": {"generate": "30GiB"}}}), [[80 * GiB - 1]],
        "peak: 80 GiB (85899345920 bytes) when trainer is in phase 'train' beside rollout (trainer train 50 GiB + "
        "rollout generate 30 GiB), but the device has 80 GiB (85899345919 bytes);", id="no-turns-one-byte-short"),
    pytest.param(
        job({"trainer,rollout": "0"}, {"trainer": {"memory": {"train": "50GiB", "idle": "40GiB"}},
                                       "rollout": {"memory": {"generate": "30GiB", "idle": "20GiB"}}}), [[64 * GiB]],
        "when trainer is in phase 'train' beside rollout (trainer train 50 GiB + rollout idle 20 GiB), but the "
        "device has 64 GiB", id="idle-not-offloaded"),
    pytest.param(
        job({"trainer,rollout,critic": "0"}, {"trainer": TRAINER, "rollout": ROLLOUT, "critic": CRITIC}),
        [[52 * GiB]],
        "fake-accelerator 0 of node 0 does not hold its peak: 52.5 GiB (56371445760 bytes) when trainer is in phase "
        "'train' beside rollout, critic (trainer train 50 GiB + rollout offloaded 512 MiB + critic offloaded 2 GiB)",
        id="three-sharers"),
    pytest.param(
        job({"trainer,rollout,reward": "0"}, {"trainer": TRAINER, "rollout": ROLLOUT, "reward": REWARD}),
        [[60 * GiB]], "+ reward score 10 GiB), but the device has 60 GiB", id="three-sharers-one-without-turns"),
    pytest.param(
        job({"trainer": "0-1", "rollout": "2-3"}, {"trainer": TRAINER, "rollout": ROLLOUT}, num_nodes=2),
        [[80 * GiB] * 2, [24 * GiB] * 2],
        "fake-accelerator 0 of node 1 does not hold its peak: 30 GiB (32212254720 bytes) when rollout is in phase "
        "'generate' (rollout generate 30 GiB), but the device has 24 GiB (25769803776 bytes); 1 more device does "
        "not fit either", id="mixed-capacities"),
    pytest.param(
        job({"trainer": "0", "rollout": "1"}, {"trainer": TRAINER, "rollout": {"memory": {"generate": "12GiB"}}}),
        [[80 * GiB, 10 * GiB]],
        "fake-accelerator 1 of node 0 does not hold its peak: 12 GiB (12884901888 bytes) when rollout is in phase "
        "'generate' (rollout generate 12 GiB), but the device has 10 GiB (10737418240 bytes); lower", id="mig"),
    pytest.param(  # two processes of one component on one device do not take turns with each other
        job({"rollout": "0:0-1"}, {"rollout": ROLLOUT}), [[40 * GiB]],
        "60 GiB (64424509440 bytes) when rollout is in phase 'generate' (rollout generate 2 x 30 GiB), but the "
        "device has 40 GiB", id="two-processes-of-one-component"),
]


@pytest.mark.parametrize(("config", "capacities", "message"), REFUSED)
def test_a_config_that_does_not_fit_is_refused_naming_device_phase_components_and_figures(
        config: dict[str, Any], capacities: list[list[int | None]], message: str) -> None:
    with pytest.raises(hwplace.PlacementError, match=re.escape(message)) as caught:
        plan(config, cluster(*capacities))
    assert caught.value.component is None  # several components: the message names them
    assert str(caught.value).endswith("lower the figures of resources:, give a component offloaded: or idle: and "
                                      "take turns, or place the components on other devices")


def test_without_a_resources_section_nothing_is_planned_or_checked() -> None:
    config = job({"trainer,rollout": "0"}, {})
    placed = plan(config, cluster([GiB]))
    assert placed.memory == []
    del config["resources"]
    assert plan(config, cluster([GiB])).memory == []


def test_the_device_record_says_who_holds_what() -> None:
    placed = plan(job({"trainer,rollout,env": "0", "other": "1"}, {"trainer": TRAINER, "rollout": ROLLOUT}),
                  cluster([80 * GiB, None]))
    first, second = placed.memory
    assert first.device == "fake-accelerator 0 of node 0"
    assert first.working == Holding("trainer", 1, "train", 50 * GiB)
    assert first.holdings[1:] == (Holding("rollout", 1, "offloaded", GiB // 2),)
    assert first.undeclared == ("env",)
    assert (second.peak, second.holdings, second.undeclared, second.capacity) == (0, (), ("other",), None)
    assert second.breakdown() == "-"
    assert second.working is None
    assert second.headroom is None
    assert second.fits


def test_processes_on_nodes_or_devices_own_no_accelerator_and_count_nowhere() -> None:
    config = job({"trainer": "0", "env": {"node_group": "node", "placement": "0"}},
                 {"trainer": TRAINER, "env": {"memory": {"step": "1TiB"}}})
    placed = plan(config, cluster([80 * GiB]))
    assert [(d.index, d.peak) for d in placed.memory] == [(0, 50 * GiB)]


def test_the_check_runs_on_offline_inventories_with_the_fake_backends_memory(monkeypatch) -> None:
    config = job({"trainer,rollout": "0-1"}, {"trainer": TRAINER, "rollout": ROLLOUT})
    placed = plan(config, hwplace.testing.fake_cluster(config["cluster"], accelerators_per_node=2))
    assert [d.capacity for d in placed.memory] == [80 * GiB] * 2
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", "48GB")
    with pytest.raises(hwplace.PlacementError, match=r"but the device has 44.7 GiB \(48000000000 bytes\)"):
        plan(config, hwplace.testing.fake_cluster(config["cluster"], accelerators_per_node=2))


def test_a_device_capacity_is_a_whole_non_negative_number_of_bytes() -> None:
    assert capacity_of({"memory_bytes": 5}) == 5
    assert capacity_of({"memory_bytes": 0}) == 0  # a device that reports no memory holds nothing: known, not unknown
    for bad in ({}, {"memory_bytes": -1}, {"memory_bytes": 1.5}, {"memory_bytes": "80GiB"}, {"memory_bytes": True}):
        assert capacity_of(bad) is None


def test_check_memory_names_the_first_device_that_does_not_fit() -> None:
    fits = DeviceMemory(0, FAKE, 0, 10, 10, (Holding("a", 1, "x", 10),))
    unknown = DeviceMemory(0, FAKE, 1, None, 10**12, (Holding("a", 1, "x", 10**12),))
    check_memory([fits, unknown])
    over = DeviceMemory(1, FAKE, 2, 10, 11, (Holding("a", 1, "x", 11),))
    with pytest.raises(hwplace.PlacementError, match=r"^fake-accelerator 2 of node 1 does not hold its peak: "
                                                     r"11 B \(11 bytes\) when a is in phase 'x' \(a x 11 B\), "
                                                     r"but the device has 10 B \(10 bytes\); lower"):
        check_memory([fits, over, unknown])


# -- the rule itself ---------------------------------------------------------------------------------------

AMOUNTS = st.integers(min_value=0, max_value=2**45)


@st.composite
def records(draw: st.DrawFn, name: str) -> ComponentResources:
    working = draw(st.lists(AMOUNTS, min_size=1, max_size=3))
    memory = {f"w{i}": amount for i, amount in enumerate(working)}
    for reserved in ("idle", "offloaded"):
        if draw(st.booleans()):
            memory[reserved] = draw(AMOUNTS)
    return ComponentResources(name, memory)


@st.composite
def holders(draw: st.DrawFn, min_size: int = 1) -> list[tuple[ComponentResources, int]]:
    count = draw(st.integers(min_value=min_size, max_value=4))
    return [(draw(records(f"c{i}")), draw(st.integers(min_value=1, max_value=3))) for i in range(count)]


def by_definition(on: list[tuple[ComponentResources, int]]) -> int:
    """SPEC §13 word for word: the largest, over the components, of its largest working phase plus what every
    other one holds meanwhile (offloaded, else idle, else its largest working phase), each process counted."""
    def meanwhile(r: ComponentResources) -> int:
        if "offloaded" in r.memory:
            return r.memory["offloaded"]
        if "idle" in r.memory:
            return r.memory["idle"]
        return max(v for k, v in r.memory.items() if k not in ("idle", "offloaded"))
    return max(n * max(v for k, v in r.memory.items() if k not in ("idle", "offloaded"))
               + sum(m * meanwhile(o) for j, (o, m) in enumerate(on) if j != i)
               for i, (r, n) in enumerate(on))


@given(holders())
def test_the_peak_is_the_rule_of_the_spec(on: list[tuple[ComponentResources, int]]) -> None:
    total, holdings = peak(on)
    assert total == by_definition(on)
    assert total == sum(h.amount for h in holdings)
    assert sorted(h.component for h in holdings) == sorted(r.component for r, _ in on)
    working = next(r for r, _ in on if r.component == holdings[0].component)
    assert holdings[0].phase == working.peak_phase[0]  # the working component is in its largest working phase


@given(holders(), st.randoms())
def test_the_peak_does_not_depend_on_the_order_of_the_components(on: list[tuple[ComponentResources, int]],
                                                                  rng: Any) -> None:
    shuffled = list(on)
    rng.shuffle(shuffled)
    assert peak(shuffled)[0] == peak(on)[0]


@given(holders(), records("newcomer"), st.integers(min_value=1, max_value=3))
def test_another_sharer_never_lowers_the_peak(on: list[tuple[ComponentResources, int]], newcomer: ComponentResources,
                                              count: int) -> None:
    assert peak([*on, (newcomer, count)])[0] >= peak(on)[0]


@given(holders(min_size=2))
def test_taking_turns_never_raises_the_peak_and_a_sharer_alone_holds_its_largest_phase(
        on: list[tuple[ComponentResources, int]]) -> None:
    without_turns = [(ComponentResources(r.component, r.working_phases), n) for r, n in on]
    offloaded_to_zero = [(ComponentResources(r.component, {**r.working_phases, "offloaded": 0}), n) for r, n in on]
    assert peak(offloaded_to_zero)[0] <= peak(on)[0]
    assert peak(offloaded_to_zero)[0] == max(n * r.peak_phase[1] for r, n in on)
    assert peak(without_turns)[0] == sum(n * r.peak_phase[1] for r, n in on)
    for r, n in on:
        assert peak([(r, n)]) == (n * r.peak_phase[1], (Holding(r.component, n, *r.peak_phase[:1],
                                                                n * r.peak_phase[1]),))


def test_no_holder_has_no_peak() -> None:
    assert peak([]) == (0, ())
