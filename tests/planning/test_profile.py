"""Profiles: the version-1 JSON read back to what was written, mistakes named by key path, and no prediction
outside what was measured (NotMeasured naming the component and the process count)."""

from __future__ import annotations

import json
import math
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

from hwplace.foundation.errors import ConfigError
from hwplace.planning.profile import (
    DEFAULT_BANDWIDTH,
    ComponentProfile,
    NotMeasured,
    Point,
    Profile,
    load_profile,
    merge_profiles,
    parse_profile,
)


def profile_data(**extra: Any) -> dict[str, Any]:
    return {"version": 1, "components": {
        "trainer": {"scaling": "data-parallel", "points": [
            {"processes": 4, "placement": "0-3", "stages": {"train": {"seconds": 2.0}, "publish": {"seconds": 0.5}},
             "offload": {"seconds": 0.25}, "onload": {"seconds": 0.5}, "between": {"seconds": 0.1},
             "memory": {"train": "50GiB", "offloaded": 2**30}},
            {"processes": 1, "stages": {"train": {"seconds": 8.0}, "publish": {"seconds": 0.5}},
             "between": {"seconds": 0.3}, "spread": {"seconds": 0.5}, "memory": {"train": "40GiB"}}]},
        "rollout": {"points": [{"processes": 2, "devices_per_process": 2, "stages": {"generate": {"seconds": 3}}}]}},
        "weight_sync": {"policy": {"bytes": "1GB"}}, **extra}


def test_a_profile_reads_back_what_it_writes() -> None:
    profile = parse_profile(profile_data(bandwidth={"other-node": "5GB"}))
    trainer = profile.component("trainer")
    assert [p.processes for p in trainer.points] == [1, 4]  # sorted by process count
    four = trainer.at(4)
    assert (four.seconds, four.swap, four.memory["train"], four.placement) == (2.5, 0.75, 50 * 2**30, "0-3")
    assert (four.between, four.cycle) == (0.1, 2.6)
    assert profile.sync_bytes("policy") == 10**9
    assert profile.bandwidth == {**DEFAULT_BANDWIDTH, "other-node": 5 * 10**9}
    assert parse_profile(json.loads(json.dumps(profile.to_json()))) == profile


def test_data_parallel_scaling_predicts_between_measured_counts_linearly_in_one_over_processes() -> None:
    trainer = parse_profile(profile_data()).component("trainer")
    two = trainer.at(2)
    # train: 8 s at 1, 2 s at 4: a + b/p through both gives a = 0, b = 8, so 4 s at 2
    assert two.stages["train"] == pytest.approx(4.0)
    assert two.stages["publish"] == pytest.approx(0.5)
    assert not two.measured
    assert two.swap is None
    assert two.between == pytest.approx(0.3 + (0.1 - 0.3) * (1 / 2 - 1) / (1 / 4 - 1))  # the same rule
    assert two.memory == {"train": 50 * 2**30}  # the larger of the phases both measured


@pytest.mark.parametrize(("component", "processes", "per", "words"), [
    ("trainer", 8, 1, "trainer was measured on 1 and 4 processes (scaling: data-parallel predicts between measured "
                      "counts, never beyond them), not on 8 processes"),
    ("rollout", 1, 2, "rollout was measured on 2 processes of 2 accelerators, not on 1 process of 2 accelerators"),
    ("rollout", 4, 1, "rollout was measured only on 2 processes of 2 accelerators, not on 4 processes"),
])
def test_outside_the_measured_points_it_refuses_naming_the_point(component: str, processes: int, per: int,
                                                                  words: str) -> None:
    with pytest.raises(NotMeasured, match="^" + words.replace("(", r"\(").replace(")", r"\)")) as caught:
        parse_profile(profile_data()).component(component).at(processes, per)
    assert (caught.value.component, caught.value.processes) == (component, processes)


def test_without_scaling_two_points_are_only_two_points() -> None:
    data = profile_data()
    del data["components"]["trainer"]["scaling"]
    with pytest.raises(NotMeasured, match="add scaling: data-parallel to predict between them"):
        parse_profile(data).component("trainer").at(2)


def test_what_the_profile_lacks_is_not_measured() -> None:
    profile = parse_profile(profile_data())
    with pytest.raises(NotMeasured, match="no entry for component 'reward'"):
        profile.component("reward")
    with pytest.raises(NotMeasured, match=r"no bytes for weight sync 'other' \(weight_sync.other.bytes\)"):
        profile.sync_bytes("other")


@pytest.mark.parametrize(("change", "path"), [
    (lambda d: d.update(version=2), "profile: version"),
    (lambda d: d.update(extra=1), "profile.extra"),
    (lambda d: d["components"]["trainer"].update(scaling="linear"), "profile: components.trainer.scaling"),
    (lambda d: d["components"]["trainer"].update(points=[]), "profile: components.trainer.points"),
    (lambda d: d["components"]["trainer"]["points"][0].update(processes=0),
     "profile: components.trainer.points[0].processes"),
    (lambda d: d["components"]["trainer"]["points"][0].update(procs=1), "profile: components.trainer.points[0].procs"),
    (lambda d: d["components"]["trainer"]["points"][0]["stages"].update(train={"seconds": -1}),
     "profile: components.trainer.points[0].stages.train.seconds"),
    (lambda d: d["components"]["trainer"]["points"][0]["stages"].update(train=2.0),
     "profile: components.trainer.points[0].stages.train"),
    (lambda d: d["components"]["trainer"]["points"][0].update(between={"seconds": "1"}),
     "profile: components.trainer.points[0].between.seconds"),
    (lambda d: d["components"]["trainer"]["points"][0]["memory"].update(train="50G"),
     "profile: components.trainer.points[0].memory.train"),
    (lambda d: d["components"]["trainer"]["points"][0].update(memory={"offloaded": "1GiB"}),
     "profile: components.trainer.points[0].memory"),
    (lambda d: d["components"]["trainer"]["points"][0]["memory"].update(ofloaded="1GiB"),
     "profile: components.trainer.points[0].memory.ofloaded"),
    (lambda d: d["components"]["trainer"]["points"][0].update(memory={}),
     "profile: components.trainer.points[0].memory"),
    (lambda d: d["components"]["trainer"]["points"][1].update(processes=4), "profile: components.trainer.points"),
    (lambda d: d["weight_sync"]["policy"].update(bytes=1.5), "profile: weight_sync.policy.bytes"),
    (lambda d: d.update(bandwidth={"same-rack": "1GB"}), "profile: bandwidth.same-rack"),
    (lambda d: d.update(bandwidth={"same-node": 0}), "profile: bandwidth.same-node"),
])
def test_mistakes_name_their_key_path(change: Any, path: str) -> None:
    data = profile_data()
    change(data)
    with pytest.raises(ConfigError, match=re.escape(path)) as caught:
        parse_profile(data)
    assert caught.value.path == path


def test_profiles_of_several_runs_merge_and_a_point_measured_twice_is_refused(tmp_path: Path) -> None:
    first, second, again = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    first.write_text(json.dumps(profile_data()))
    more = {"version": 1, "components": {"rollout": {"points": [
        {"processes": 4, "devices_per_process": 2, "stages": {"generate": {"seconds": 1.5}}}]}}}
    second.write_text(json.dumps(more))
    merged = load_profile(first, second)
    assert merged.component("rollout").measured(2) == [2, 4]
    again.write_text(json.dumps(profile_data()))
    with pytest.raises(ConfigError, match="measures 1 process again"):
        load_profile(first, again)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="is not JSON"):
        load_profile(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="cannot read"):
        load_profile(tmp_path / "absent.json")


def two_counts(**trainer: Any) -> dict[str, Any]:
    """A data-parallel trainer measured on 2 and 8 processes (every figure given) and a rollout whose figures
    between its two counts are all zero."""
    return {"version": 1, "components": {
        "trainer": {"scaling": "data-parallel", "points": [
            {"processes": 2, "stages": {"train": {"seconds": 8.0}, "wait": {"seconds": 0}},
             "offload": {"seconds": 1.0}, "onload": {"seconds": 2.0}, "between": {"seconds": 0.4},
             "spread": {"seconds": 0.8}, "memory": {"train": 100, "offloaded": 10}},
            {"processes": 8, "stages": {"train": {"seconds": 2.0}, "wait": {"seconds": 0}},
             "offload": {"seconds": 0.4}, "onload": {"seconds": 0.5}, "between": {"seconds": 0.1},
             "spread": {"seconds": 0.2}, "memory": {"train": 60, "idle": 5}}], **trainer},
        "rollout": {"scaling": "data-parallel", "points": [
            {"processes": 1, "stages": {"generate": {"seconds": 0}}},
            {"processes": 3, "stages": {"generate": {"seconds": 0}}}]}}}


def test_between_two_counts_every_figure_is_linear_in_one_over_processes() -> None:
    profile = parse_profile(two_counts())
    four = profile.component("trainer").at(4)
    # each figure a + b/p through both points: the share of the way from 2 to 8 is (1/4 - 1/2) / (1/8 - 1/2) = 2/3
    assert dict(four.stages) == pytest.approx({"train": 4.0, "wait": 0.0})
    assert [four.offload, four.onload, four.between, four.spread] == pytest.approx([0.6, 1.0, 0.2, 0.4])
    assert (four.processes, four.devices_per_process, four.measured) == (4, 1, False)
    assert four.memory == {"train": 100}  # the larger of the phases both measured, no other
    two = profile.component("rollout").at(2)
    assert (dict(two.stages), two.between, two.spread) == ({"generate": 0.0}, 0.0, 0.0)


def test_between_counts_whose_stages_differ_nothing_is_predicted() -> None:
    data = two_counts()
    data["components"]["trainer"]["points"][1]["stages"]["publish"] = {"seconds": 0.5}
    words = r"^trainer has stages \['train', 'wait'\] at 2 processes but \['publish', 'train', 'wait'\] at 8: "
    with pytest.raises(NotMeasured, match=words + "no prediction between them$") as caught:
        parse_profile(data).component("trainer").at(4)
    assert (caught.value.component, caught.value.processes) == ("trainer", 4)


def test_merging_keeps_every_point_and_the_second_profile_s_figures() -> None:
    first = parse_profile(profile_data())
    second = parse_profile({"version": 1, "components": {
        "trainer": {"scaling": "data-parallel", "points": [{"processes": 2, "stages": {"train": {"seconds": 4.5}}}]},
        "env": {"points": [{"processes": 1, "stages": {"step": {"seconds": 1}}}]},
        "reward": {"points": [{"processes": 1, "stages": {"score": {"seconds": 1}}}]}},
        "weight_sync": {"policy": {"bytes": "2GB"}, "value": {"bytes": "1MB"}}, "bandwidth": {"same-node": "1GB"}})
    merged = merge_profiles(first, second, "b.json")
    trainer = merged.component("trainer")
    assert (trainer.component, trainer.scaling, trainer.measured(1)) == ("trainer", "data-parallel", [1, 2, 4])
    assert merged.component("env") == second.component("env")
    assert merged.component("reward") == second.component("reward")  # every component only the second has
    assert merged.component("rollout") == first.component("rollout")
    assert dict(merged.weight_sync) == {"policy": 2 * 10**9, "value": 10**6}
    assert merged.bandwidth == {**DEFAULT_BANDWIDTH, "same-node": 10**9}
    unscaled = profile_data()
    del unscaled["components"]["trainer"]["scaling"]
    assert merge_profiles(parse_profile(unscaled), second).component("trainer").scaling == "data-parallel"
    assert merge_profiles(second, parse_profile(unscaled)).component("trainer").scaling == "data-parallel"


def test_merging_a_point_measured_twice_or_another_scaling_is_refused_by_key_path() -> None:
    first = parse_profile(profile_data())
    with pytest.raises(ConfigError, match="again") as caught:
        merge_profiles(first, first, "c.json")
    assert caught.value.path == "c.json: components.trainer.points"
    assert caught.value.allowed == "one measurement per point"
    assert caught.value.problem == "measures 1 process again; another profile given measures it too"
    other = ComponentProfile("trainer", (Point(2, stages={"train": 4.0}),), "linear")  # a scaling of another hwplace
    with pytest.raises(ConfigError, match="differs") as caught:
        merge_profiles(first, Profile({"trainer": other}), "d.json")
    assert (caught.value.path, caught.value.problem) == ("d.json: components.trainer.scaling",
                                                         "differs from another profile's")
    assert (caught.value.value, caught.value.allowed) == ("linear", "'data-parallel'")


def test_load_profile_refuses_no_file_and_names_each_file_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="names no file") as caught:
        load_profile()
    assert (caught.value.path, caught.value.problem) == ("--profile", "names no file")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="is not JSON") as caught:
        load_profile(tmp_path / "bad.json")
    assert caught.value.path == "--profile"
    assert caught.value.problem.startswith(f"{str(tmp_path / 'bad.json')!r} is not JSON: ")
    with pytest.raises(ConfigError, match="cannot read") as caught:
        load_profile(tmp_path / "absent.json")
    assert caught.value.problem == f"cannot read {str(tmp_path / 'absent.json')!r}: No such file or directory"
    (tmp_path / "v2.json").write_text(json.dumps({"version": 2}))
    with pytest.raises(ConfigError, match="version") as caught:
        load_profile(tmp_path / "v2.json")
    assert caught.value.path == f"{tmp_path / 'v2.json'}: version"  # a mistake in a file names the file


def test_what_was_measured_is_named_count_by_count() -> None:
    data = profile_data()
    data["components"]["rollout"]["points"] += [
        {"processes": 1, "stages": {"generate": {"seconds": 6}}},
        {"processes": 4, "stages": {"generate": {"seconds": 2}}},
        {"processes": 8, "stages": {"generate": {"seconds": 1}}},
        {"processes": 8, "devices_per_process": 4, "stages": {"generate": {"seconds": 1}}}]
    rollout = parse_profile(data).component("rollout")
    assert rollout.measured_text() == ("1, 4 and 8 processes; 2 processes of 2 accelerators; "
                                       "8 processes of 4 accelerators")
    assert rollout.measured_text(2) == "2 processes of 2 accelerators"
    assert rollout.measured_text(4) == "8 processes of 4 accelerators"
    assert parse_profile(profile_data()).component("trainer").measured_text() == "1 and 4 processes"
    one = {"version": 1, "components": {"env": {"points": [{"processes": 1, "stages": {"step": {"seconds": 1}}}]}}}
    assert parse_profile(one).component("env").measured_text() == "1 process"


def test_not_measured_keeps_the_point_it_names_across_processes() -> None:
    data = profile_data()
    del data["components"]["trainer"]["scaling"]
    with pytest.raises(NotMeasured, match="add scaling") as caught:
        parse_profile(data).component("trainer").at(2)
    assert str(caught.value) == ("trainer was measured on 1 and 4 processes (add scaling: data-parallel to predict "
                                 "between them), not on 2 processes; profile a run with 2 processes")
    with pytest.raises(NotMeasured, match="rollout") as caught:
        parse_profile(data).component("rollout").at(3, 2)
    again = pickle.loads(pickle.dumps(caught.value))
    assert (type(again), str(again)) == (NotMeasured, str(caught.value))
    assert (again.component, again.processes, again.devices_per_process) == ("rollout", 3, 2)
    assert "measured on 2 processes of 2 accelerators, not on 3 processes of 2 accelerators" in str(again)
    for processes in (1, 4):  # a measured count is taken as it is, with or without scaling
        assert parse_profile(data).component("trainer").at(processes).measured


def test_a_count_at_either_end_is_not_between_the_measured_ones() -> None:
    data = profile_data()
    del data["components"]["trainer"]["scaling"]
    data["components"]["trainer"]["points"] = data["components"]["trainer"]["points"][1:]  # 1 process only
    with pytest.raises(NotMeasured, match=r"^trainer was measured on 1 process, not on 2 processes;") as caught:
        parse_profile(data).component("trainer").at(2)
    assert "add scaling" not in str(caught.value)


POINT = "profile: components.trainer.points[0]"


@pytest.mark.parametrize(("change", "path", "problem", "value", "allowed"), [
    (lambda p: p.update(placement=[1]), f"{POINT}.placement", "is the placement string the point ran with", [1],
     None),
    (lambda p: p["stages"].update({"Bad name": {"seconds": 1}}), f"{POINT}.stages.Bad name", "is not a stage name",
     "Bad name", None),
    (lambda p: p.update(stages={}), f"{POINT}.stages", "is empty", None, "STAGE: {seconds: S} entries"),
    (lambda p: p.update(devices_per_process=0), f"{POINT}.devices_per_process", "is a positive integer", 0, None),
    (lambda p: p.update(processes=True), f"{POINT}.processes", "is a positive integer", True, None),
    (lambda p: p.update(memory={"offloaded": "1GiB", "idle": "1GiB"}), f"{POINT}.memory", "declares no working phase",
     None, "a phase other than offloaded and idle, such as train: 50GiB"),
    (lambda p: p["stages"].update(train={"seconds": math.inf}), f"{POINT}.stages.train.seconds",
     "is a non-negative number of seconds", math.inf, None),
])
def test_a_point_s_mistake_is_named_whole(change: Any, path: str, problem: str, value: Any,
                                          allowed: str | None) -> None:
    data = profile_data()
    change(data["components"]["trainer"]["points"][0])
    with pytest.raises(ConfigError, match=re.escape(problem)) as caught:
        parse_profile(data)
    assert (caught.value.path, caught.value.problem, caught.value.value, caught.value.allowed) == (
        path, problem, value, allowed)


def test_a_point_keeps_its_placement_as_a_string_or_none() -> None:
    data = profile_data()
    data["components"]["trainer"]["points"][0]["placement"] = 3
    trainer = parse_profile(data).component("trainer")
    assert (trainer.at(4).placement, trainer.at(1).placement) == ("3", None)


def components(**entries: Any) -> Any:
    return lambda d: {**d, "components": entries}


ONE_POINT = {"processes": 1, "stages": {"train": {"seconds": 1}}}


@pytest.mark.parametrize(("change", "path", "problem", "value", "allowed"), [
    (lambda d: [d["version"]], "profile", "must be a mapping", [1], None),
    (lambda d: {**d, "version": 2}, "profile: version", "is not a profile version this hwplace reads", 2,
     "version: 1"),
    (lambda d: {**d, "components": [1]}, "profile: components", "must be a mapping", [1], None),
    (components(**{"Bad name": {"points": [ONE_POINT]}}), "profile: components.Bad name", "is not a component name",
     "Bad name", "a name of component_placement"),
    (components(trainer=[1]), "profile: components.trainer", "must be a mapping", [1], None),
    (components(trainer={"points": [ONE_POINT], "pts": 1}), "profile: components.trainer.pts", "unknown key", None,
     "allowed keys: points, scaling; did you mean 'points'?"),
    (components(trainer={"points": [ONE_POINT], "scaling": "linear"}), "profile: components.trainer.scaling",
     "is not a scaling hwplace knows", "linear", "data-parallel, or leave it out (measured counts only)"),
    (components(trainer={"points": []}), "profile: components.trainer.points",
     "is a list of at least one measured point", [], None),
    (components(trainer={"points": [ONE_POINT, ONE_POINT]}), "profile: components.trainer.points",
     "measures one process count twice", None, "one point per processes and devices_per_process"),
    (components(trainer={"points": [1]}), "profile: components.trainer.points[0]", "must be a mapping", 1, None),
    (components(trainer={"points": [{"processes": 1, "stages": [1]}]}), "profile: components.trainer.points[0].stages",
     "must be a mapping", [1], None),
    (components(trainer={"points": [{**ONE_POINT, "offload": {"seconds": -1}}]}),
     "profile: components.trainer.points[0].offload.seconds", "is a non-negative number of seconds", -1, None),
    (components(trainer={"points": [{**ONE_POINT, "onload": {"secs": 1}}]}),
     "profile: components.trainer.points[0].onload.secs", "unknown key", None,
     "allowed keys: seconds; did you mean 'seconds'?"),
    (lambda d: {**d, "weight_sync": [1]}, "profile: weight_sync", "must be a mapping", [1], None),
    (lambda d: {**d, "weight_sync": {"policy": 1}}, "profile: weight_sync.policy", "must be a mapping", 1, None),
    (lambda d: {**d, "weight_sync": {"policy": {"byte": 1}}}, "profile: weight_sync.policy.byte", "unknown key", None,
     "allowed keys: bytes; did you mean 'bytes'?"),
    (lambda d: {**d, "bandwidth": [1]}, "profile: bandwidth", "must be a mapping", [1], None),
    (lambda d: {**d, "bandwidth": {"same-rack": "1GB"}}, "profile: bandwidth.same-rack", "is not a transport", None,
     "same-device, same-node, other-node"),
    (lambda d: {**d, "bandwidth": {"same-node": "fast"}}, "profile: bandwidth.same-node",
     "is not an amount of bytes per second", "fast", "a positive amount per second, such as 20GB: bytes as an "
     "integer, or a number and a unit: B, KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024), such as "
     "50GiB or 0.5GiB"),
    (lambda d: {**d, "bandwidth": {"same-node": True}}, "profile: bandwidth.same-node",
     "is not an amount of bytes per second", True, "a positive amount per second, such as 20GB: bytes as an "
     "integer, or a number and a unit: B, KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024), such as "
     "50GiB or 0.5GiB"),
    (lambda d: {**d, "bandwidth": {"same-node": 0}}, "profile: bandwidth.same-node", "is zero bytes per second", 0,
     "a positive amount per second, such as 20GB"),
])
def test_a_profile_s_mistake_is_named_whole(change: Any, path: str, problem: str, value: Any,
                                            allowed: str | None) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)) as caught:
        parse_profile(change(profile_data()))
    assert (caught.value.path, caught.value.problem, caught.value.value, caught.value.allowed) == (
        path, problem, value, allowed)


def test_a_component_name_that_is_no_string_is_refused() -> None:
    with pytest.raises(ConfigError, match="is not a component name") as caught:
        parse_profile({"version": 1, "components": {1: {"points": [ONE_POINT]}}})
    assert (caught.value.path, caught.value.value) == ("profile: components.1", 1)


def test_a_profile_without_components_has_none_and_says_so() -> None:
    profile = parse_profile({"version": 1})
    assert (dict(profile.components), dict(profile.weight_sync)) == ({}, {})
    with pytest.raises(NotMeasured, match="reward") as caught:
        profile.component("reward")
    assert str(caught.value) == ("the profile has no entry for component 'reward' (it has none); profile a run "
                                 "that places it")
    with pytest.raises(NotMeasured, match="reward") as caught:
        parse_profile(profile_data()).component("reward")
    assert str(caught.value) == ("the profile has no entry for component 'reward' (it has trainer, rollout); profile a "
                                 "run that places it")
    assert (caught.value.component, caught.value.processes, caught.value.devices_per_process) == ("reward", 0, 1)


def test_points_and_profiles_are_read_only_and_hashable() -> None:
    point = Point(2, stages={"train": 1.0}, memory={"train": 5})
    assert hash(point) == hash(Point(2, stages={"train": 1.0}, memory={"train": 5}))
    with pytest.raises(TypeError, match="read-only"):
        point.stages["train"] = 2.0  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        point.memory["train"] = 6  # type: ignore[index]
    profile = Profile({"trainer": ComponentProfile("trainer", (point,))}, {"policy": 10})
    with pytest.raises(TypeError, match="read-only"):
        profile.components["other"] = ComponentProfile("other", (point,))  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        profile.weight_sync["policy"] = 20  # type: ignore[index]


def test_a_point_describes_itself_by_count_and_accelerators() -> None:
    assert [Point(1).describe(), Point(2).describe(), Point(2, 2).describe(), Point(1, 3).describe()] == [
        "1 process", "2 processes", "2 processes of 2 accelerators", "1 process of 3 accelerators"]


def test_a_count_not_measured_names_only_the_points_of_its_accelerators_per_process() -> None:
    data = profile_data()
    data["components"]["rollout"]["points"].append({"processes": 1, "stages": {"generate": {"seconds": 6}}})
    with pytest.raises(NotMeasured, match="rollout") as caught:
        parse_profile(data).component("rollout").at(3, 2)
    assert str(caught.value) == ("rollout was measured on 2 processes of 2 accelerators, not on 3 processes of 2 "
                                 "accelerators; profile a run with 3 processes of 2 accelerators")


def test_the_json_form_leaves_out_a_scaling_not_given() -> None:
    written = parse_profile(profile_data()).to_json()["components"]
    assert written["rollout"] == {"points": [{"processes": 2, "devices_per_process": 2,
                                              "stages": {"generate": {"seconds": 3.0}}}]}
    assert written["trainer"]["scaling"] == "data-parallel"


def test_merging_and_loading_name_where_a_point_is_measured_twice(tmp_path: Path) -> None:
    first = parse_profile(profile_data())
    with pytest.raises(ConfigError, match="again") as caught:
        merge_profiles(first, first)
    assert caught.value.path == "profile: components.trainer.points"
    (tmp_path / "a.json").write_text(json.dumps(profile_data()))
    (tmp_path / "b.json").write_text(json.dumps(profile_data()))
    with pytest.raises(ConfigError, match="again") as caught:
        load_profile(tmp_path / "a.json", tmp_path / "b.json")
    assert caught.value.path == f"{tmp_path / 'b.json'}: components.trainer.points"
    with pytest.raises(ConfigError, match="cannot read") as caught:
        load_profile(tmp_path / "absent.json")
    assert caught.value.path == "--profile"
