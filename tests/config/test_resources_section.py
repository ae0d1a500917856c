"""The ``resources:`` section (SPEC §13): memory per phase per component, each mistake named by its key path."""

from __future__ import annotations

import pytest

import hwplace
from hwplace.config.resources import ComponentResources, parse_resources

COMPONENTS = ["trainer", "rollout", "reward"]
GiB = 2**30


def test_the_spec_example_parses_into_records_in_the_order_written() -> None:
    section = {"trainer": {"memory": {"train": "50GiB", "idle": "40GiB", "offloaded": "1GiB"}},
               "rollout": {"memory": {"generate": "30GiB", "idle": "20GiB", "offloaded": "0.5GiB"}}}
    trainer, rollout = parse_resources(section, COMPONENTS)
    assert trainer == ComponentResources("trainer", {"train": 50 * GiB, "idle": 40 * GiB, "offloaded": GiB})
    assert list(rollout.memory) == ["generate", "idle", "offloaded"]
    assert rollout.memory["offloaded"] == GiB // 2
    assert parse_resources(None, COMPONENTS) == ()
    assert parse_resources({}, COMPONENTS) == ()


def test_what_a_component_holds_while_another_works() -> None:
    both = ComponentResources("a", {"train": 50, "logprobs": 60, "idle": 40, "offloaded": 1})
    assert both.working_phases == {"train": 50, "logprobs": 60}
    assert both.peak_phase == ("logprobs", 60)
    assert both.meanwhile == ("offloaded", 1)
    assert both.takes_turns
    assert ComponentResources("a", {"train": 50, "idle": 40}).meanwhile == ("idle", 40)
    alone = ComponentResources("a", {"generate": 30, "score": 30})
    assert alone.meanwhile == ("generate", 30)
    assert not alone.takes_turns
    with pytest.raises(AttributeError, match="cannot assign"):
        both.component = "b"  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        both.memory["train"] = 1  # type: ignore[index]


def test_the_job_config_holds_the_section() -> None:
    job = hwplace.parse_job_config({
        "cluster": {"num_nodes": 1, "component_placement": {"trainer,rollout": "0-3"}},
        "resources": {"trainer": {"memory": {"train": 1024}}}})
    assert job.resources == (ComponentResources("trainer", {"train": 1024}),)
    assert job.to_dict()["resources"] == {"trainer": {"memory": {"train": 1024}}}
    assert hwplace.parse_job_config({"cluster": {"num_nodes": 1}}).resources == ()


@pytest.mark.parametrize(("section", "message"), [
    (["trainer"], r"^resources: must be a mapping \(got \['trainer'\]\)$"),
    ({"trainr": {"memory": {"train": 1}}},
     r"^resources.trainr: 'trainr' is not a component of component_placement; did you mean 'trainer'\?; "
     r"components: trainer, rollout, reward$"),
    ({3: {"memory": {"train": 1}}}, r"^resources.3: 3 is not a component"),
    ({"trainer": "50GiB"}, r"^resources.trainer: must be a mapping \(got '50GiB'\)$"),
    ({"trainer": {}}, r"^resources.trainer: declares nothing; memory: \{PHASE: AMOUNT, ...\}"),
    ({"trainer": {"memroy": {"train": 1}}},
     r"^resources.trainer.memroy: unknown key; allowed keys: memory; did you mean 'memory'\?$"),
    ({"trainer": {"memory": "50GiB"}}, r"^resources.trainer.memory: must be a mapping"),
    ({"trainer": {"memory": {}}}, r"^resources.trainer.memory: is empty"),
    ({"trainer": {"memory": {"train": "50 gigs"}}}, r"^resources.trainer.memory.train: "),
    ({"trainer": {"memory": {"train": "50Gib"}}},
     r"^resources.trainer.memory.train: has an unknown unit 'Gib'; did you mean 'GiB'\?"),
    ({"trainer": {"memory": {"train": 0.5}}}, r"^resources.trainer.memory.train: is a number without a unit"),
    ({"trainer": {"memory": {"train": -1}}}, r"^resources.trainer.memory.train: is negative"),
    ({"trainer": {"memory": {"train": 1, "idle": "1 EiB"}}}, r"^resources.trainer.memory.idle: "),
    ({"trainer": {"memory": {"idle": "1GiB", "offloaded": 0}}},
     r"^resources.trainer.memory: declares no working phase; a phase other than offloaded and idle"),
    ({"trainer": {"memory": {"train": 1, "ofloaded": 0}}},
     r"^resources.trainer.memory.ofloaded: is so close to the reserved phase 'offloaded' that it is taken for a "
     r"misspelling; 'offloaded' itself, or a working phase named otherwise$"),
    ({"trainer": {"memory": {"train": 1, "Idle": 0}}}, r"^resources.trainer.memory.Idle: is so close to the "
                                                       r"reserved phase 'idle'"),
    ({"trainer": {"memory": {"train": 1, "bad phase": 0}}},
     r"^resources.trainer.memory.bad phase: is not a phase name"),
    ({"trainer": {"memory": {"train": 1, 7: 0}}}, r"^resources.trainer.memory.7: is not a phase name"),
])
def test_every_mistake_is_a_config_error_with_its_key_path(section: object, message: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=message):
        parse_resources(section, COMPONENTS)


def test_a_mistake_surfaces_when_the_job_file_is_parsed(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("cluster:\n  num_nodes: 1\n  component_placement:\n    trainer: 0\n"
                    "resources:\n  trainer: {memory: {train: 50GB, offloaded: 1 GiB}}\n  rollout: {memory: {x: 1}}\n")
    with pytest.raises(hwplace.ConfigError, match=r"^resources.rollout: 'rollout' is not a component of "
                                                  r"component_placement; components: trainer$"):
        hwplace.parse_job_config(str(path))


def test_working_phases_may_be_named_freely_and_zero_is_an_amount() -> None:
    (record,) = parse_resources({"reward": {"memory": {"score": "2GB", "warm-up.1": 0, "offloaded": 0}}},
                                COMPONENTS)
    assert record.working_phases == {"score": 2 * 10**9, "warm-up.1": 0}
    assert record.meanwhile == ("offloaded", 0)
