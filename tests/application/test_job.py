"""Jobs without Ray: the job's settings, finding its entry point, config overrides, and ``hwplace run``'s
checks before anything starts. The GRPO example itself runs in tests/plugins/ray/test_grpo.py."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

import hwplace
from hwplace.application.cli import main
from hwplace.application.job import Job, load_entrypoint
from hwplace.application.summary import summary_data
from hwplace.config.loading import apply_overrides
from hwplace.config.section import cluster_section
from hwplace.config.weight_sync import parse_weight_sync
from hwplace.testing import fake_cluster

ROOT = Path(__file__).resolve().parents[2]
GRPO = ROOT / "examples" / "rl-grpo"


def job_with(section: dict[str, Any]) -> Job:
    config = {"job": section, "cluster": {"num_nodes": 1, "component_placement": {"a": "0-1"}}}
    cluster = fake_cluster(config["cluster"], accelerators_per_node=2)
    return Job(config, cluster, hwplace.ComponentPlacement(config, cluster))


# -- settings --------------------------------------------------------------------------------------


def test_settings_are_the_defaults_overridden_by_the_job_section() -> None:
    job = job_with({"entrypoint": "x.py:main", "steps": 5, "rate": 2})
    settings = job.settings(steps=30, rate=0.5, name="run", flag=False)
    assert (settings.steps, settings.rate, settings.name, settings.flag) == (5, 2.0, "run", False)
    assert isinstance(settings.rate, float)


def test_an_unknown_setting_is_named_with_a_suggestion() -> None:
    job = job_with({"entrypoint": "x.py:main", "step": 5})
    with pytest.raises(hwplace.ConfigError, match=r"^job\.step: is not a setting of this job; settings: seed, "
                                                  r"steps; did you mean 'steps'\?$"):
        job.settings(steps=30, seed=0)


@pytest.mark.parametrize(("value", "default", "kind"), [
    ("5", 30, "an int"), (True, 30, "an int"), (1.5, 30, "an int"), ("x", 0.5, "a float"), (1, False, "a bool"),
    (3, "run", "a str"),
])
def test_a_setting_of_the_wrong_type_is_refused(value: object, default: object, kind: str) -> None:
    job = job_with({"entrypoint": "x.py:main", "key": value})
    with pytest.raises(hwplace.ConfigError, match=rf"^job\.key: must be {kind}, like its default .* \(got "):
        job.settings(key=default)


def test_a_job_without_settings_says_it_has_none() -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^job\.steps: is not a setting of this job; settings: none$"):
        job_with({"entrypoint": "x.py:main", "steps": 5}).settings()


def test_a_setting_of_the_wrong_type_names_its_default() -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^job\.steps: must be an int, like its default 30 \(got '5'\)$"):
        job_with({"entrypoint": "x.py:main", "steps": "5"}).settings(steps=30)


def test_a_job_holds_what_it_was_given() -> None:
    config = {"job": {}, "cluster": {"num_nodes": 1, "component_placement": {"a": "0"}}}
    cluster = fake_cluster(config["cluster"], accelerators_per_node=1)
    placement = hwplace.ComponentPlacement(config, cluster)
    job = Job(config, cluster, placement)
    assert (job.config, job.cluster, job.placement, job.groups) == (config, cluster, placement, {})
    job.shutdown()  # nothing launched: nothing to do


def test_a_setting_whose_default_is_none_takes_anything() -> None:
    assert job_with({"entrypoint": "x.py:main", "key": [1, 2]}).settings(key=None).key == [1, 2]


# -- the entry point -------------------------------------------------------------------------------


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_file_entry_point_is_read_relative_to_the_base_and_imports_its_siblings(tmp_path: Path) -> None:
    sibling = f"helper_{uuid.uuid4().hex}"  # a name no earlier test imported
    write(tmp_path, f"jobs/{sibling}.py", "ANSWER = 42\n")
    write(tmp_path, "jobs/my_job.py", f"""
        import dataclasses
        from {sibling} import ANSWER

        @dataclasses.dataclass
        class Item:
            value: int

        def main(job):
            return Item(ANSWER)
        """)
    write(tmp_path, f"elsewhere/{sibling}.py", "ANSWER = 0\n")  # a module of the same name, first on the path
    sys.path.insert(0, str(tmp_path / "elsewhere"))
    try:
        entry = load_entrypoint({"job": {"entrypoint": "jobs/my_job.py:main"}}, tmp_path)
    finally:
        sys.path.remove(str(tmp_path / "elsewhere"))
    item = entry(job_with({}))
    assert item.value == 42  # the job's own sibling, as for a script
    # Like a __main__ script's, the file's module is not left importable: its classes pickle by value
    assert type(item).__module__ == "__hwplace_job_my_job__"
    assert type(item).__module__ not in sys.modules
    assert sibling not in sys.modules  # nor are the modules it imported from its folder: they travel by value
    load_entrypoint({"job": {"entrypoint": "jobs/my_job.py:main"}}, tmp_path)
    assert sys.path.count(str(tmp_path / "jobs")) == 1  # on the path once, however often it is loaded
    sys.path.remove(str(tmp_path / "jobs"))
    with pytest.raises(pickle.PicklingError, match=r"Item"):
        pickle.dumps(item)


def test_a_module_entry_point_is_imported() -> None:
    import json

    assert load_entrypoint({"job": {"entrypoint": "json:dumps"}}, Path.cwd()) is json.dumps


@pytest.mark.parametrize(("section", "message"), [
    (None, r"^job: is missing; a job: section whose entrypoint is 'file\.py:function'"),
    ("main", r"^job: must be a mapping \(got 'main'\)"),
    ({}, r"^job\.entrypoint: is missing; 'file\.py:function' \(a path relative to the config's folder\) or "
         r"'package\.module:function' \(an installed module\)$"),
    ({"entrypoint": "pipeline.py"}, r"^job\.entrypoint: must name a function \(got 'pipeline\.py'\)"),
    ({"entrypoint": "a:b:c"}, r"^job\.entrypoint: must name a function"),
    ({"entrypoint": ":main"}, r"^job\.entrypoint: must name a function"),
    ({"entrypoint": 7}, r"^job\.entrypoint: must name a function \(got 7\)"),
    ({"entrypoint": "missing.py:main"}, r"^job\.entrypoint: there is no file '.*missing\.py' \(got "
                                        r"'missing\.py:main'\); 'file\.py:function' \(a path"),
    ({"entrypoint": "no_such_module_here:main"}, r"^job\.entrypoint: there is no module 'no_such_module_here' "
                                                 r"\(got 'no_such_module_here:main'\); 'file\.py:function'"),
    ({"entrypoint": "json:dump_it"}, r"^job\.entrypoint: module json has no function 'dump_it'; did you mean "
                                     r"'dump'\? \(got 'json:dump_it'\); a function that takes the hwplace\.Job$"),
])
def test_a_bad_entry_point_is_named_with_the_forms_allowed(section: object, message: str) -> None:
    config = {} if section is None else {"job": section}
    with pytest.raises(hwplace.ConfigError, match=message):
        load_entrypoint(config, Path.cwd())


def test_a_missing_import_inside_the_entry_module_shows_the_real_error(tmp_path: Path) -> None:
    write(tmp_path, "broken_job_module.py", "import not_installed_anywhere\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ModuleNotFoundError, match=r"not_installed_anywhere"):
            load_entrypoint({"job": {"entrypoint": "broken_job_module:main"}}, tmp_path)
    finally:
        sys.path.remove(str(tmp_path))


def test_a_file_entry_that_is_not_a_function_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "job.py", "main = 3\ndef run(job):\n    pass\n")
    with pytest.raises(hwplace.ConfigError, match=r"job\.py has no function 'main' \(got "):
        load_entrypoint({"job": {"entrypoint": "job.py:main"}}, tmp_path)


def test_only_public_functions_are_suggested_for_a_misspelt_entry(tmp_path: Path) -> None:
    write(tmp_path, "job.py", "maine = 3\ndef _main(job):\n    pass\ndef mainly(job):\n    pass\n")
    with pytest.raises(hwplace.ConfigError, match=r"has no function 'main'; did you mean 'mainly'\? \(got "):
        load_entrypoint({"job": {"entrypoint": "job.py:main"}}, tmp_path)


# -- overrides -------------------------------------------------------------------------------------


def test_overrides_set_yaml_values_and_create_mappings_in_checked_sections() -> None:
    config = {"job": {"steps": 30}, "cluster": {"num_nodes": 1}, "model": {"lr": 0.1}}
    apply_overrides(config, ["job.steps=5", "cluster.num_nodes=2", "job.name=yes", "job.ranks=[0, 1]",
                             "cluster.address=local", "job.empty=", "model.lr=0.5"])
    assert config == {"job": {"steps": 5, "name": "yes", "ranks": [0, 1], "empty": ""},
                      "cluster": {"num_nodes": 2, "address": "local"}, "model": {"lr": 0.5}}
    fresh: dict[str, object] = {}
    apply_overrides(fresh, ["job.steps=5", "cluster.sub.key=1"])  # their own checks name unknown keys
    assert fresh == {"job": {"steps": 5}, "cluster": {"sub": {"key": 1}}}


@pytest.mark.parametrize(("item", "message"), [
    ("steps=5", r"^override steps: names nothing: the config's top level has no key 'steps'; did you mean "
                r"'job\.steps'\?"),
    ("jbo.steps=5", r"^override jbo\.steps: names nothing: the config's top level has no key 'jbo'; did you mean "
                    r"'job'\?; a path into the config \(keys there: job, model, cluster\)"),
    ("model.lrr=1", r"^override model\.lrr: names nothing: model has no key 'lrr'; did you mean 'lr'\?"),
    ("new.key.deep=true", r"^override new\.key\.deep: names nothing: the config's top level has no key 'new'"),
    ("lr=1", r"has no key 'lr'; did you mean 'model\.lr'\?"),
])
def test_an_override_that_names_nothing_is_refused_with_a_did_you_mean(item: str, message: str) -> None:
    config = {"job": {"steps": 30}, "model": {"lr": 0.1}}
    with pytest.raises(hwplace.ConfigError, match=message):
        apply_overrides(config, [item])
    assert config == {"job": {"steps": 30}, "model": {"lr": 0.1}}


@pytest.mark.parametrize(("item", "message"), [
    ("job.steps", r"^override: 'job\.steps' is not key=value; dotted\.key=value"),
    ("=5", r"^override: '=5' is not key=value"),
    ("job..steps=5", r"^override: 'job\.\.steps=5' is not key=value"),
    ("job.steps.x=5", r"^job\.steps: is 30, not a mapping, so 'job\.steps\.x' cannot be set"),
    ("job.steps=[1", r"the value of job\.steps is not valid YAML"),
])
def test_a_bad_override_is_named(item: str, message: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=message):
        apply_overrides({"job": {"steps": 30}}, [item])


# -- hwplace run, before anything starts ---------------------------------------------------------------


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["run", *argv], out, err)
    return code, out.getvalue(), err.getvalue()


def test_run_refuses_a_simulated_cluster_of_real_accelerators() -> None:
    code, _, err = run_cli(str(GRPO / "grpo.yaml"), "--nodes", "1x4:cuda")
    assert code == 2
    assert "--nodes: a simulated cluster has fake accelerators only (got '1x4:cuda')" in err


def test_run_names_a_missing_entry_point(tmp_path: Path) -> None:
    config = write(tmp_path, "job.yaml", "cluster: {num_nodes: 1, component_placement: {a: 0}}\n")
    code, _, err = run_cli(str(config), "--nodes", "1x1")
    assert code == 2
    assert err.startswith("hwplace: error: job.entrypoint: is missing; 'file.py:function'")


def test_run_applies_overrides_given_before_and_after_options(tmp_path: Path) -> None:
    code, _, err = run_cli(str(GRPO / "grpo.yaml"), "cluster.num_nodes=x", "--nodes", "1x4")
    assert (code, err.splitlines()[0]) == (2, "hwplace: error: cluster.num_nodes: must be an integer (got 'x')")
    code, _, err = run_cli(str(GRPO / "grpo.yaml"), "--nodes", "1x4", "job.entrypoint=nope.py:main")
    assert code == 2
    assert "job.entrypoint: there is no file" in err


def test_run_rejects_unknown_options() -> None:
    with pytest.raises(SystemExit, match=r"^2$"):
        main(["run", str(GRPO / "grpo.yaml"), "--steps", "5"], io.StringIO(), io.StringIO())


def test_run_checks_the_placement_against_the_simulated_inventory_before_starting_ray() -> None:
    # Trainer is placed on accelerators 2-3: one node of 2 is too small. Ray must not even be imported.
    script = ("import sys; from hwplace.application.cli import main; "
              f"code = main(['run', {str(GRPO / 'grpo.yaml')!r}, '--nodes', '1x2']); "
              "print(code, 'ray' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert "component 'trainer', entry '2-3'" in done.stderr
    assert "    trainer: 2-3\n" in done.stderr  # the caret display


def test_run_refuses_a_simulated_cluster_and_an_address_together(tmp_path: Path) -> None:
    code, _, err = run_cli(str(GRPO / "grpo.yaml"), "cluster.address=10.0.0.1:6379", "--nodes", "1x4")
    assert code == 2
    assert "cluster.address: is set, but a simulated cluster runs on this machine (got '10.0.0.1:6379')" in err


def test_the_example_variants_differ_only_in_yaml_and_only_where_they_say() -> None:
    def flat(config: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(config, dict):
            return {k: v for key, value in config.items() for k, v in flat(value, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): config}

    base = flat(hwplace.load_config(GRPO / "grpo.yaml"))
    changed = {"colocated.yaml": {"cluster.component_placement.rollout", "cluster.component_placement.trainer",
                                  "cluster.component_placement.rollout,trainer"},
               "async.yaml": {"job.max_staleness"},
               "multinode.yaml": {"cluster.num_nodes", "cluster.component_placement.rollout",
                                  "cluster.component_placement.trainer"}}
    for variant, keys in changed.items():
        other = flat(hwplace.load_config(GRPO / variant))
        differ = {k for k in base.keys() | other.keys() if base.get(k) != other.get(k)}
        assert differ == keys, variant
    assert hwplace.load_config(GRPO / "async.yaml")["job"]["max_staleness"] == 1


def test_the_colocated_variant_shares_each_trainer_ranks_accelerator_with_a_rollout() -> None:
    config = hwplace.load_config(GRPO / "colocated.yaml")
    cluster = fake_cluster(config["cluster"], accelerators_per_node=2)
    plan = hwplace.ComponentPlacement(config, cluster)
    rollout, trainer = plan.get_placements("rollout"), plan.get_placements("trainer")
    assert [p.env for p in rollout] == [p.env for p in trainer] == [{"FAKE_VISIBLE_DEVICES": "0"},
                                                                    {"FAKE_VISIBLE_DEVICES": "1"}]


def test_run_refuses_a_simulated_cluster_smaller_than_the_config() -> None:
    code, _, err = run_cli(str(GRPO / "multinode.yaml"), "--nodes", "1x4")
    assert (code, err) == (2, "hwplace: error: --nodes: gives 1 node but cluster.num_nodes is 2 (got '1x4'); at "
                              "least 2 nodes, such as --nodes 2x4\n")


def test_run_refuses_a_summary_file_in_a_missing_folder_before_running(tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "s.json")
    code, _, err = run_cli(str(GRPO / "grpo.yaml"), "--nodes", "1x4", "--summary", missing)
    assert code == 2
    assert err.startswith("hwplace: error: --summary: names a file in a folder that does not exist")


def test_a_summary_writes_records_sets_and_scalars_as_json() -> None:
    import dataclasses

    import numpy

    @dataclasses.dataclass
    class Point:
        step: int
        value: float

    assert summary_data(Point(1, 0.5)) == {"step": 1, "value": 0.5}
    assert summary_data({3, 1, 2}) == [1, 2, 3]
    assert summary_data(numpy.float32(0.25)) == 0.25
    assert summary_data({"a": (numpy.arange(3), [Point(2, 1.0)])}) == {"a": [[0, 1, 2], [{"step": 2, "value": 1.0}]]}


@pytest.mark.parametrize(("value", "message"), [
    ({"stats": [1, object()]}, r"^--summary: result\['stats'\]\[1\] is an object \(<object object at 0x[0-9a-f]+>\), "
                               r"which JSON cannot hold; return plain data"),
    ({"loss": float("nan")}, r"^--summary: result\['loss'\] is nan, which JSON cannot hold"),
    ({(1, 2): "pair"}, r"^--summary: result\[\(1, 2\)\]: the key is a tuple; a JSON key is a string"),
    ([lambda: 0], r"^--summary: result\[0\] is a function "),
])
def test_a_summary_refuses_what_json_cannot_hold_naming_its_key_path(value: Any, message: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=message):  # it was written as "<object object at 0x...>"
        summary_data(value)


def test_a_summary_refuses_a_value_that_contains_itself() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(hwplace.ConfigError, match=r"^--summary: result(\[0\]){100} is nested more than 100"):
        summary_data(looped)


# -- the parsed config --------------------------------------------------------------------------------


def test_a_job_built_from_a_job_config_holds_a_plain_copy_of_its_own() -> None:
    parsed = hwplace.parse_job_config({"job": {"steps": 5, "layers": [1, 2]}, "model": {"lr": 0.1},
                                       "cluster": {"num_nodes": 1, "component_placement": {"a": "0"}}})
    cluster = fake_cluster(parsed.cluster, accelerators_per_node=1)
    job = Job(parsed, cluster, hwplace.ComponentPlacement(parsed, cluster))
    assert job.config == parsed.to_dict()
    assert job.settings(steps=1, layers=[0]).layers == [1, 2]  # a list, as the file wrote it
    job.config["job"]["steps"] = 6
    assert parsed.raw["job"]["steps"] == 5


def test_run_parses_the_config_once_before_anything_starts(tmp_path: Path, count_calls: Any) -> None:
    write(tmp_path, "entry.py", "def main(job):\n    pass\n")
    config = write(tmp_path, "job.yaml", """\
        job: {entrypoint: entry.py:main, steps: 1}
        cluster: {num_nodes: 1, component_placement: {trainer: 0, rollout: 1-3}}
        weight_sync: {policy: {source: trainer, targets: rollout}}
        """)
    watched = (hwplace.parse_job_config, cluster_section, parse_weight_sync)
    with count_calls(*watched) as calls:  # the simulated inventory is too small: refused before Ray starts
        code, _, err = run_cli(str(config), "--nodes", "1x2", "job.steps=3")
    assert code == 2
    assert "component 'rollout', entry '1-3'" in err
    assert calls.of == dict.fromkeys(watched, 1)


def test_run_job_takes_a_job_config_as_it_is(count_calls: Any) -> None:
    parsed = hwplace.parse_job_config(GRPO / "grpo.yaml")
    with count_calls(hwplace.parse_job_config, cluster_section) as calls, \
            pytest.raises(hwplace.PlacementError, match=r"component 'trainer', entry '2-3'"):
        hwplace.run_job(parsed, accelerators_per_node=2, base=GRPO)
    assert set(calls.of.values()) == {0}  # used as it is
