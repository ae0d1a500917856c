"""Unit tests of the config model: loading, validation of the ``cluster:`` section, and the typed records.

Offline: no Ray, no torch. Hardware types come from the built-in ``fake`` and ``node`` plugins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import hwplace
from hwplace import ClusterConfig, ConfigError, HwplaceError, NodeGroup, load_config, parse_cluster_config
from hwplace.config.checks import parse_node_ranks
from hwplace.config.section import cluster_section
from hwplace.testing import backend_plugin, registered_plugin

# -- helpers ----------------------------------------------------------------------------------------


def group(label: str = "g", node_ranks: Any = "all", **extra: Any) -> dict[str, Any]:
    return {"label": label, "node_ranks": node_ranks, **extra}


def section(num_nodes: int = 2, **extra: Any) -> dict[str, Any]:
    return {"num_nodes": num_nodes, **extra}


def robot_group(label: str = "robot", node_ranks: Any = "all", configs: Any = None) -> dict[str, Any]:
    if configs is None:
        configs = [{"node_rank": 0}]
    return group(label, node_ranks, hardware={"type": "fake-robot", "configs": configs})


def fails(cluster: Any, path: str, match: str) -> ConfigError:
    """Parse ``cluster`` expecting a ConfigError at exactly ``path`` whose message matches ``match``."""
    with pytest.raises(ConfigError, match=match) as exc:
        parse_cluster_config(cluster)
    assert exc.value.path == path, str(exc.value)
    assert str(exc.value).startswith(f"{path}: ")
    return exc.value


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the error type ---------------------------------------------------------------------------------


def test_config_error_is_a_value_error_and_a_hwplace_error() -> None:
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, HwplaceError)
    assert hwplace.ConfigError is ConfigError


def test_config_error_message_names_path_value_and_allowed() -> None:
    error = ConfigError("cluster.x", "is bad", value=3, allowed="use 4")
    assert str(error) == "cluster.x: is bad (got 3); use 4"
    assert (error.path, error.problem, error.value, error.allowed) == ("cluster.x", "is bad", 3, "use 4")


# -- accepted forms: load_config --------------------------------------------------------------------

EXAMPLE_YAML = """\
cluster:
  num_nodes: 2
  address: auto
  node_groups:
    - label: a800
      node_ranks: 0-1
      env_configs:
        - node_ranks: 0
          env_vars: {GLOO_SOCKET_IFNAME: eth0}
          python_interpreter_path: /opt/venv/bin/python
    - label: robot
      node_ranks: 1
      hardware:
        type: fake-robot
        configs:
          - {node_rank: 1, name: arm}
  component_placement:
    actor,inference: 0-7
    env: {node_group: robot, placement: "0:0-1"}
other_section: {lr: 0.1}
"""


def test_load_config_from_yaml_path_string(tmp_path: Path) -> None:
    path = write(tmp_path, EXAMPLE_YAML)
    loaded = load_config(str(path))
    assert loaded["other_section"] == {"lr": 0.1}
    assert loaded["cluster"]["num_nodes"] == 2


def test_load_config_from_pathlike(tmp_path: Path) -> None:
    path = write(tmp_path, EXAMPLE_YAML)
    assert load_config(path) == load_config(str(path))


def test_full_example_from_yaml_parses_into_records(tmp_path: Path) -> None:
    config = parse_cluster_config(cluster_section(load_config(write(tmp_path, EXAMPLE_YAML))))
    assert isinstance(config, ClusterConfig)
    assert config.num_nodes == 2
    assert config.address == "auto"
    assert [g.label for g in config.node_groups] == ["a800", "robot"]
    a800, robot = config.node_groups
    assert a800.node_ranks == (0, 1)
    assert a800.env_vars(0) == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert a800.env_vars(1) == {}
    assert a800.python_interpreter_path(0) == "/opt/venv/bin/python"
    assert a800.python_interpreter_path(1) is None
    assert robot.node_ranks == (1,)
    assert robot.hardware is not None
    assert robot.hardware.type == "fake-robot"
    assert list(robot.hardware.configs) == [{"node_rank": 1, "name": "arm"}]
    assert set(config.components) == {"actor", "inference", "env"}
    assert config.components["actor"].placement == "0-7"
    assert config.components["actor"].node_groups == ("cluster",)
    assert config.components["inference"].placement == "0-7"
    assert config.components["env"].node_groups == ("robot",)
    assert config.components["env"].placement == "0:0-1"


def test_load_config_from_dict_returns_plain_copy() -> None:
    source = {"cluster": section(), "x": [1, {"y": 2}]}
    loaded = load_config(source)
    assert loaded == source
    assert type(loaded) is dict


def test_load_config_from_omegaconf_dictconfig() -> None:
    loaded = load_config(OmegaConf.create({"cluster": {"num_nodes": 3, "node_groups": [group()]}}))
    assert type(loaded) is dict
    assert type(loaded["cluster"]["node_groups"]) is list
    assert type(loaded["cluster"]["node_groups"][0]) is dict
    assert parse_cluster_config(cluster_section(loaded)).group("g").node_ranks == (0, 1, 2)


def test_load_config_resolves_omegaconf_interpolation() -> None:
    cfg = OmegaConf.create({"nodes": 4, "ranks": "0-3", "cluster": {
        "num_nodes": "${nodes}",
        "node_groups": [{"label": "g", "node_ranks": "${ranks}"}],
    }})
    cluster = cluster_section(load_config(cfg))
    assert cluster["num_nodes"] == 4
    config = parse_cluster_config(cluster)
    assert config.num_nodes == 4
    assert config.group("g").node_ranks == (0, 1, 2, 3)


def test_load_config_unresolvable_interpolation_is_config_error() -> None:
    cfg = OmegaConf.create({"cluster": {"num_nodes": "${missing}"}})
    with pytest.raises(ConfigError, match="cannot resolve"):
        load_config(cfg)


def test_parse_cluster_config_accepts_dictconfig_section() -> None:
    cfg = OmegaConf.create({"n": 2, "cluster": {"num_nodes": "${n}", "component_placement": {"actor": 3}}})
    config = parse_cluster_config(cfg.cluster)
    assert config.num_nodes == 2
    assert config.components["actor"].placement == "3"


def test_parse_cluster_config_returns_a_cluster_config_unchanged() -> None:
    config = parse_cluster_config(section())
    assert parse_cluster_config(config) is config


def test_load_config_rejects_a_list() -> None:
    with pytest.raises(ConfigError, match="mapping") as exc:
        load_config([1, 2])
    assert exc.value.path == ""


def test_yaml_base60_looking_placement_stays_a_string(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster:\n  num_nodes: 1\n  component_placement: {env: 1:3}\n")
    loaded = load_config(path)
    assert loaded["cluster"]["component_placement"]["env"] == "1:3"
    config = parse_cluster_config(cluster_section(loaded))
    assert config.components["env"].placement == "1:3"


def test_yaml_1_30_stays_a_string_not_90(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, "a: 1:30\nb: 12\nc: -3\nd: 0x10\n"))
    assert loaded == {"a": "1:30", "b": 12, "c": -3, "d": "0x10"}


def test_yaml_integer_placement_counts_as_its_string(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, "cluster:\n  num_nodes: 1\n  component_placement: {actor: 7}\n"))
    assert parse_cluster_config(cluster_section(loaded)).components["actor"].placement == "7"


def test_yaml_integer_env_value_becomes_string(tmp_path: Path) -> None:
    text = (
        "cluster:\n  num_nodes: 1\n  node_groups:\n    - label: g\n      node_ranks: 0\n"
        "      env_configs:\n        - node_ranks: 0\n          env_vars: {OMP_NUM_THREADS: 8, T: 1:30}\n"
    )
    config = parse_cluster_config(cluster_section(load_config(write(tmp_path, text))))
    assert config.group("g").env_vars(0) == {"OMP_NUM_THREADS": "8", "T": "1:30"}


# -- load_config failures ---------------------------------------------------------------------------


def test_unreadable_file_is_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"cannot read config file .*nope\.yaml") as exc:
        load_config(missing)
    assert exc.value.path == ""


def test_directory_as_config_file_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path)


def test_invalid_yaml_is_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster: {num_nodes: 2\n  bad: [\n")
    with pytest.raises(ConfigError, match="is not valid YAML") as exc:
        load_config(path)
    assert exc.value.path == ""
    assert "config.yaml" in str(exc.value)


def test_top_level_yaml_list_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must hold a mapping at the top level") as exc:
        load_config(write(tmp_path, "- a\n- b\n"))
    assert exc.value.value == "list"


def test_top_level_yaml_scalar_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must hold a mapping at the top level"):
        load_config(write(tmp_path, "just text\n"))


def test_empty_yaml_file_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must hold a mapping at the top level"):
        load_config(write(tmp_path, ""))


# -- cluster_section --------------------------------------------------------------------------------


def test_cluster_section_returns_the_cluster_mapping() -> None:
    assert cluster_section({"cluster": {"num_nodes": 1}, "other": 1}) == {"num_nodes": 1}


def test_missing_cluster_section_is_config_error_listing_keys() -> None:
    with pytest.raises(ConfigError, match="has no 'cluster' section") as exc:
        cluster_section({"trainer": {}, "model": {}})
    assert exc.value.path == "cluster"
    assert "trainer, model" in str(exc.value)
    assert "looks like the cluster section itself" not in str(exc.value)


def test_missing_cluster_section_on_empty_config() -> None:
    with pytest.raises(ConfigError, match="top-level keys found: none"):
        cluster_section({})


@pytest.mark.parametrize("key", ["num_nodes", "component_placement"])
def test_passing_the_cluster_section_itself_gives_a_hint(key: str) -> None:
    with pytest.raises(ConfigError, match="looks like the cluster section itself") as exc:
        cluster_section({key: 2})
    assert exc.value.path == "cluster"


# -- cluster level ----------------------------------------------------------------------------------


def test_minimal_cluster() -> None:
    config = parse_cluster_config({"num_nodes": 3})
    assert (config.num_nodes, config.address, config.node_groups, dict(config.components)) == (3, None, (), {})


def test_cluster_section_must_be_a_mapping() -> None:
    fails([1], "cluster", "must be a mapping")


def test_unknown_cluster_key_suggests_num_nodes() -> None:
    error = fails({"num_node": 2}, "cluster.num_node", "unknown key.*did you mean 'num_nodes'")
    assert "allowed keys: num_nodes, address, executor, node_groups, component_placement" in str(error)


def test_unknown_cluster_key_beside_num_nodes() -> None:
    fails(section(node_group=[]), "cluster.node_group", "did you mean 'node_groups'")


def test_missing_num_nodes() -> None:
    fails({"node_groups": []}, "cluster.num_nodes", "is required")


def test_num_nodes_zero() -> None:
    error = fails({"num_nodes": 0}, "cluster.num_nodes", "must be at least 1")
    assert error.value == 0


def test_num_nodes_negative() -> None:
    fails({"num_nodes": -2}, "cluster.num_nodes", "must be at least 1")


@pytest.mark.parametrize("value", [True, False])
def test_num_nodes_bool(value: bool) -> None:
    fails({"num_nodes": value}, "cluster.num_nodes", f"must be an integer \\(got {value}\\)")


@pytest.mark.parametrize("value", ["2", 2.0, None])
def test_num_nodes_not_an_int(value: Any) -> None:
    fails({"num_nodes": value}, "cluster.num_nodes", "must be an integer")


def test_address_is_kept() -> None:
    assert parse_cluster_config(section(address="ray://head:10001")).address == "ray://head:10001"


@pytest.mark.parametrize("value", ["", "  ", 5])
def test_bad_address(value: Any) -> None:
    fails(section(address=value), "cluster.address", "must be a non-empty string: 'auto' or a Ray address")


@pytest.mark.parametrize(("value", "problem"), [
    ("ray://head:10001\n", "ends with whitespace or a line break"),
    ("ray://he\0ad", "contains a NUL byte"),
])
def test_address_with_a_hidden_character(value: str, problem: str) -> None:
    fails(section(address=value), "cluster.address", problem)


def test_executor_defaults_to_ray_and_can_be_named() -> None:
    assert parse_cluster_config(section()).executor == "ray"
    assert parse_cluster_config(section(executor=None)).executor == "ray"
    assert parse_cluster_config(section(executor="my-runtime")).executor == "my-runtime"


@pytest.mark.parametrize("value", ["Ray Cluster", "", 3, False, "ray\n"])
def test_bad_executor_name(value: Any) -> None:
    fails(section(executor=value), "cluster.executor", "executor name")


@pytest.mark.parametrize("num_nodes", [100_001, 10**10, 10**20])
def test_absurd_num_nodes_is_refused_at_once(num_nodes: int) -> None:
    fails({"num_nodes": num_nodes, "node_groups": [{"label": "g", "node_ranks": "all"}]}, "cluster.num_nodes",
          "is more than 100000 nodes")


@pytest.mark.parametrize(("key", "value"), [("node_groups", False), ("node_groups", 0), ("component_placement", False),
                                            ("component_placement", "")])
def test_falsy_sections_are_not_taken_for_empty(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"cluster.{key}: must be a "):
        parse_cluster_config(section(**{key: value}))


def test_all_is_accepted_in_any_letter_case() -> None:
    config = parse_cluster_config(section(3, node_groups=[{"label": "g", "node_ranks": "ALL"},
                                                          {"label": "h", "node_ranks": " All "}]))
    assert config.group("g").node_ranks == config.group("h").node_ranks == (0, 1, 2)


def test_node_groups_must_be_a_list() -> None:
    fails(section(node_groups={"label": "g"}), "cluster.node_groups", "must be a list of node groups")


def test_node_group_must_be_a_mapping() -> None:
    fails(section(node_groups=["g"]), "cluster.node_groups[0]", "must be a mapping")


# -- node groups ------------------------------------------------------------------------------------


def test_unknown_group_key_suggests() -> None:
    cluster = section(node_groups=[group(), {"label": "h", "node_rank": 0}])
    fails(cluster, "cluster.node_groups[1].node_rank", "unknown key.*did you mean 'node_ranks'")


def test_group_label_required() -> None:
    fails(section(node_groups=[{"node_ranks": 0}]), "cluster.node_groups[0].label", "is required")


def test_group_label_not_a_string() -> None:
    fails(section(node_groups=[{**group(), "label": 3}]), "cluster.node_groups[0].label", r"\(got 3\)")


@pytest.mark.parametrize("label", ["a,b", "a b", "", "gpu:0", "gpu\n"])  # "gpu\n": a "$" matched before it
def test_group_label_bad_characters(label: str) -> None:
    error = fails(section(node_groups=[group(label=label)]), "cluster.node_groups[0].label",
                  "letters, digits")
    assert error.value == label


@pytest.mark.parametrize("label", ["a800", "gpu_1", "rack.2", "x-y", "A"])
def test_group_label_good_characters(label: str) -> None:
    assert parse_cluster_config(section(node_groups=[group(label=label)])).node_groups[0].label == label


@pytest.mark.parametrize("label", ["cluster", "node"])
def test_reserved_label(label: str) -> None:
    fails(section(node_groups=[group(), group(label=label)]), "cluster.node_groups[1].label",
          f"'{label}' is reserved")


def test_duplicate_label() -> None:
    cluster = section(node_groups=[group("a", 0), group("b", 1), group("a", 1)])
    fails(cluster, "cluster.node_groups[2].label", r"label 'a' is already used by cluster\.node_groups\[0\]")


def test_group_node_ranks_required() -> None:
    fails(section(node_groups=[{"label": "g"}]), "cluster.node_groups[0].node_ranks", "is required")


def test_group_path_is_recorded() -> None:
    config = parse_cluster_config(section(node_groups=[group("a", 0), group("b", 1)]))
    assert config.group("b").path == "cluster.node_groups[1]"


# -- node ranks -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0-1", (0, 1)),
        ("0,2-3", (0, 2, 3)),
        (1, (1,)),
        ([0, 1], (0, 1)),
        ("all", (0, 1, 2, 3)),
        (" all ", (0, 1, 2, 3)),
        ("3", (3,)),
        (" 1 - 2 ", (1, 2)),
        ((2, 0), (0, 2)),
        (["0-1", 3], (0, 1, 3)),
        ("2-3,0", (0, 2, 3)),
        (0, (0,)),
    ],
)
def test_parse_node_ranks_accepted_forms(value: Any, expected: tuple[int, ...]) -> None:
    assert parse_node_ranks(value, "p", 4) == expected


@pytest.mark.parametrize(
    ("value", "expected"), [("0-1", (0, 1)), ("0,2-3", (0, 2, 3)), (1, (1,)), ([0, 1], (0, 1)), ("all", (0, 1, 2, 3))]
)
def test_group_node_ranks_forms(value: Any, expected: tuple[int, ...]) -> None:
    config = parse_cluster_config(section(4, node_groups=[group(node_ranks=value)]))
    assert config.group("g").node_ranks == expected


def test_node_ranks_from_yaml_forms(tmp_path: Path) -> None:
    text = (
        "cluster:\n  num_nodes: 4\n  node_groups:\n"
        "    - {label: a, node_ranks: 0-1}\n"
        "    - {label: b, node_ranks: '0,2-3'}\n"
        "    - {label: c, node_ranks: 1}\n"
        "    - {label: d, node_ranks: [0, 1]}\n"
        "    - {label: e, node_ranks: all}\n"
    )
    config = parse_cluster_config(cluster_section(load_config(write(tmp_path, text))))
    assert [g.node_ranks for g in config.node_groups] == [(0, 1), (0, 2, 3), (1,), (0, 1), (0, 1, 2, 3)]


def test_node_rank_out_of_range_in_group() -> None:
    error = fails(section(2, node_groups=[group(), group("h", "1-2")]), "cluster.node_groups[1].node_ranks",
                  "node rank 2 is out of range: cluster.num_nodes is 2")
    assert error.value == "1-2"
    assert "within 0-1" in str(error)


@pytest.mark.parametrize("value", [2, [0, 5], "0,7", "2-3"])
def test_parse_node_ranks_out_of_range(value: Any) -> None:
    with pytest.raises(ConfigError, match="is out of range") as exc:
        parse_node_ranks(value, "x.node_ranks", 2)
    assert exc.value.path == "x.node_ranks"


def test_descending_range() -> None:
    error = fails(section(4, node_groups=[group(node_ranks="3-1")]), "cluster.node_groups[0].node_ranks",
                  "range 3-1 is descending")
    assert error.value == "3-1"


def test_duplicate_ranks() -> None:
    fails(section(4, node_groups=[group(node_ranks="0-2,1")]), "cluster.node_groups[0].node_ranks",
          r"node rank\(s\) \[1\] appear more than once")


def test_duplicate_ranks_in_list() -> None:
    with pytest.raises(ConfigError, match=r"\[0\] appear more than once"):
        parse_node_ranks([0, 0], "p", 2)


@pytest.mark.parametrize("value", [-1, "-1", "a", "1-", "", "0,,1", [], [True], True, None, 1.0, {"a": 1}, [[0]]])
def test_parse_node_ranks_rejects(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"^x\.node_ranks: .*(node rank|names no node|descending)") as exc:
        parse_node_ranks(value, "x.node_ranks", 4)
    assert exc.value.path == "x.node_ranks"


def test_parse_node_ranks_message_says_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"allowed: 'all', a rank, a range 'a-b'.*within 0-3") as exc:
        parse_node_ranks("x", "p", 4)
    assert exc.value.value == "x"


# -- env configs ------------------------------------------------------------------------------------


def env_group(*env_configs: Any, node_ranks: Any = "all", num_nodes: int = 2) -> dict[str, Any]:
    return section(num_nodes, node_groups=[group(node_ranks=node_ranks, env_configs=list(env_configs))])


def test_env_vars_as_mapping() -> None:
    config = parse_cluster_config(env_group({"node_ranks": "all", "env_vars": {"A": "1", "B_2": "x"}}))
    assert config.group("g").env_vars(0) == {"A": "1", "B_2": "x"}
    assert config.group("g").env_vars(1) == {"A": "1", "B_2": "x"}


def test_env_vars_as_list_of_one_key_mappings() -> None:
    config = parse_cluster_config(env_group({"node_ranks": 0, "env_vars": [{"A": "1"}, {"B": "2"}]}))
    assert config.group("g").env_vars(0) == {"A": "1", "B": "2"}
    assert config.group("g").env_vars(1) == {}


def test_env_values_int_and_bool_become_strings() -> None:
    config = parse_cluster_config(env_group({"node_ranks": 0, "env_vars": {"N": 8, "T": True, "F": False, "Z": 0}}))
    env = config.group("g").env_vars(0)
    assert env == {"N": "8", "T": "true", "F": "false", "Z": "0"}
    assert all(isinstance(v, str) for v in env.values())


@pytest.mark.parametrize("value", [11.10, 0.5, 1e3, float("nan"), float("inf")])
def test_env_value_float_is_refused_with_a_hint_to_quote_it(value: float) -> None:
    fails(env_group({"node_ranks": 0, "env_vars": {"V": value}}), "cluster.node_groups[0].env_configs[0].env_vars.V",
          r"number with a fraction, which YAML would change .*quote it")


@pytest.mark.parametrize(("value", "problem"), [
    ("a\0b", "NUL byte"), ("eth0\n", "ends with a line break"), ("x\r\n", "ends with a line break"),
])
def test_env_value_with_a_hidden_character_is_refused(value: str, problem: str) -> None:
    fails(env_group({"node_ranks": 0, "env_vars": {"V": value}}), "cluster.node_groups[0].env_configs[0].env_vars.V",
          problem)


def test_env_list_item_with_two_keys() -> None:
    fails(env_group({"node_ranks": 0, "env_vars": [{"A": "1", "B": "2"}]}),
          "cluster.node_groups[0].env_configs[0].env_vars[0]", "exactly one key")


def test_env_vars_wrong_type() -> None:
    fails(env_group({"node_ranks": 0, "env_vars": "A=1"}), "cluster.node_groups[0].env_configs[0].env_vars",
          "must be a mapping or a list of one-key mappings")


@pytest.mark.parametrize("name", ["1A", "A-B", "A B", "", "FOO\n"])
def test_env_var_name_invalid(name: str) -> None:
    error = fails(env_group({"node_ranks": 0, "env_vars": {name: "x"}}),
                  f"cluster.node_groups[0].env_configs[0].env_vars.{name}",
                  "is not a valid environment variable name")
    assert error.value == name


def test_env_var_name_invalid_in_list_form() -> None:
    fails(env_group({"node_ranks": 0, "env_vars": [{"OK": "1"}, {"BAD-NAME": "x"}]}),
          "cluster.node_groups[0].env_configs[0].env_vars[1].BAD-NAME", "is not a valid environment variable name")


def test_env_var_name_not_a_string() -> None:
    fails(env_group({"node_ranks": 0, "env_vars": {3: "x"}}),
          "cluster.node_groups[0].env_configs[0].env_vars.3", "is not a valid environment variable name")


@pytest.mark.parametrize("value", [None, [1], {"a": 1}])
def test_env_value_other_types(value: Any) -> None:
    fails(env_group({"node_ranks": 0, "env_vars": {"V": value}}),
          "cluster.node_groups[0].env_configs[0].env_vars.V", "environment values are strings, integers or booleans")


def test_env_var_set_twice_in_one_list() -> None:
    fails(env_group({"node_ranks": 0, "env_vars": [{"A": "1"}, {"A": "2"}]}),
          "cluster.node_groups[0].env_configs[0].env_vars[1].A", "is set twice, to '1' and '2'")


def test_same_env_var_different_values_on_one_node() -> None:
    cluster = env_group({"node_ranks": "0-1", "env_vars": {"IFACE": "eth0"}},
                        {"node_ranks": 1, "env_vars": {"IFACE": "ib0"}})
    fails(cluster, "cluster.node_groups[0].env_configs[1].env_vars.IFACE",
          r"sets 'ib0' on node 1, where cluster\.node_groups\[0\]\.env_configs\[0\] already sets 'eth0'")


def test_same_env_var_different_values_on_different_nodes_is_allowed() -> None:
    config = parse_cluster_config(env_group({"node_ranks": 0, "env_vars": {"IFACE": "eth0"}},
                                            {"node_ranks": 1, "env_vars": {"IFACE": "ib0"}}))
    g = config.group("g")
    assert g.env_vars(0) == {"IFACE": "eth0"}
    assert g.env_vars(1) == {"IFACE": "ib0"}


def test_same_env_var_same_value_twice_on_one_node_is_allowed() -> None:
    config = parse_cluster_config(env_group({"node_ranks": "0-1", "env_vars": {"A": "1"}},
                                            {"node_ranks": 1, "env_vars": {"A": 1, "B": "2"}}))
    assert config.group("g").env_vars(1) == {"A": "1", "B": "2"}


def test_env_vars_merge_across_configs() -> None:
    config = parse_cluster_config(env_group({"node_ranks": "all", "env_vars": {"A": "1"}},
                                            {"node_ranks": 1, "env_vars": {"B": "2"}}))
    assert config.group("g").env_vars(0) == {"A": "1"}
    assert config.group("g").env_vars(1) == {"A": "1", "B": "2"}


def test_env_vars_of_node_outside_group_is_empty() -> None:
    config = parse_cluster_config(env_group({"node_ranks": 0, "env_vars": {"A": "1"}}, node_ranks=0))
    assert config.group("g").env_vars(1) == {}
    assert config.group("g").python_interpreter_path(1) is None


def test_env_configs_node_ranks_outside_group() -> None:
    error = fails(env_group({"node_ranks": "1-2", "env_vars": {"A": "1"}}, node_ranks="0-1", num_nodes=4),
                  "cluster.node_groups[0].env_configs[0].node_ranks", r"node rank\(s\) \[2\] are not in this group")
    assert "the group's nodes are [0, 1]" in str(error)


def test_env_configs_node_ranks_out_of_cluster_range() -> None:
    fails(env_group({"node_ranks": 5}), "cluster.node_groups[0].env_configs[0].node_ranks", "out of range")


def test_env_configs_node_ranks_required() -> None:
    fails(env_group({"env_vars": {"A": "1"}}), "cluster.node_groups[0].env_configs[0].node_ranks", "is required")


def test_env_configs_unknown_key_suggests() -> None:
    fails(env_group({"node_ranks": 0, "env_var": {"A": "1"}}), "cluster.node_groups[0].env_configs[0].env_var",
          "unknown key.*did you mean 'env_vars'")


def test_env_configs_must_be_a_list() -> None:
    fails(section(node_groups=[group(env_configs={"node_ranks": 0})]), "cluster.node_groups[0].env_configs",
          "must be a list")


def test_env_config_entry_must_be_a_mapping() -> None:
    fails(env_group("A=1"), "cluster.node_groups[0].env_configs[0]", "must be a mapping")


def test_python_interpreter_path_per_node() -> None:
    config = parse_cluster_config(env_group({"node_ranks": 0, "python_interpreter_path": "/a/python"},
                                            {"node_ranks": 1, "python_interpreter_path": "/b/python"}))
    assert config.group("g").python_interpreter_path(0) == "/a/python"
    assert config.group("g").python_interpreter_path(1) == "/b/python"


def test_python_interpreter_path_default_is_none() -> None:
    config = parse_cluster_config(env_group({"node_ranks": 0, "env_vars": {"A": "1"}}))
    assert config.group("g").python_interpreter_path(0) is None


def test_same_interpreter_twice_on_one_node_is_allowed() -> None:
    config = parse_cluster_config(env_group({"node_ranks": "all", "python_interpreter_path": "/p"},
                                            {"node_ranks": 1, "python_interpreter_path": "/p"}))
    assert config.group("g").python_interpreter_path(1) == "/p"


def test_two_interpreters_for_one_node() -> None:
    cluster = env_group({"node_ranks": "all", "python_interpreter_path": "/a/python"},
                        {"node_ranks": 1, "python_interpreter_path": "/b/python"})
    error = fails(cluster, "cluster.node_groups[0].env_configs[1].python_interpreter_path",
                  "node 1 is given several interpreters")
    assert "/a/python" in str(error)
    assert "/b/python" in str(error)


@pytest.mark.parametrize("value", ["", "  ", 3])
def test_bad_interpreter_path(value: Any) -> None:
    fails(env_group({"node_ranks": 0, "python_interpreter_path": value}),
          "cluster.node_groups[0].env_configs[0].python_interpreter_path", "must be a non-empty string: the path")


@pytest.mark.parametrize("value", ["/opt/venv/bin/python\n", "/opt/py\0thon"])
def test_interpreter_path_with_a_hidden_character(value: str) -> None:
    fails(env_group({"node_ranks": 0, "python_interpreter_path": value}),
          "cluster.node_groups[0].env_configs[0].python_interpreter_path", "NUL byte|line break")


# -- hardware ---------------------------------------------------------------------------------------


def hw_cluster(hardware: Any, node_ranks: Any = "all", num_nodes: int = 2, **extra: Any) -> dict[str, Any]:
    return section(num_nodes, node_groups=[group(), group("hw", node_ranks, hardware=hardware, **extra)])


HW = "cluster.node_groups[1].hardware"


def test_accelerator_type_without_configs() -> None:
    config = parse_cluster_config(hw_cluster({"type": "fake-accelerator"}))
    hardware = config.group("hw").hardware
    assert hardware is not None
    assert (hardware.type, hardware.configs) == ("fake-accelerator", ())


def test_accelerator_type_with_configs() -> None:
    fails(hw_cluster({"type": "fake-accelerator", "configs": [{"node_rank": 0}]}), f"{HW}.configs",
          "'fake-accelerator' is an accelerator backend.*leave configs out")


def test_device_type_with_configs() -> None:
    config = parse_cluster_config(hw_cluster({"type": "fake-robot", "configs": [
        {"node_rank": 1, "name": "left"}, {"node_rank": 0, "name": "right", "model": "m"}]}))
    hardware = config.group("hw").hardware
    assert hardware is not None
    assert hardware.type == "fake-robot"
    assert [dict(c) for c in hardware.configs] == [
        {"node_rank": 1, "name": "left"}, {"node_rank": 0, "name": "right", "model": "m"}]


@pytest.mark.parametrize("configs", [None, [], "x"])
def test_device_type_without_configs(configs: Any) -> None:
    hardware = {"type": "fake-robot"} if configs is None else {"type": "fake-robot", "configs": configs}
    fails(hw_cluster(hardware), f"{HW}.configs", "'fake-robot' devices must be declared")


def test_hardware_type_unknown_suggests() -> None:
    error = fails(hw_cluster({"type": "fake-robt", "configs": [{"node_rank": 0}]}), f"{HW}.type",
                  "no hardware backend is named 'fake-robt'.*did you mean 'fake-robot'")
    assert "registered types:" in str(error)
    assert "fake-accelerator" in str(error)


def test_hardware_type_node_is_refused_with_hint() -> None:
    error = fails(hw_cluster({"type": "node"}), f"{HW}.type", "no hardware backend is named 'node'")
    assert "ignore_hardware: true" in str(error)
    assert "registered types: cuda, fake-accelerator, fake-robot, npu, serial-robot" in str(error)


@pytest.mark.parametrize("hardware", [{}, {"type": 3}, {"configs": [{"node_rank": 0}]}])
def test_hardware_type_required(hardware: Any) -> None:
    fails(hw_cluster(hardware), f"{HW}.type", "is required: the name of a hardware backend")


def test_hardware_must_be_a_mapping() -> None:
    fails(hw_cluster("fake-robot"), HW, "must be a mapping")


def test_hardware_unknown_key_suggests() -> None:
    fails(hw_cluster({"type": "fake-robot", "config": [{"node_rank": 0}]}), f"{HW}.config",
          "unknown key.*did you mean 'configs'")


def test_device_config_without_node_rank() -> None:
    fails(hw_cluster({"type": "fake-robot", "configs": [{"node_rank": 0}, {"name": "x"}]}),
          f"{HW}.configs[1].node_rank", "is required")


def test_device_config_node_rank_outside_group() -> None:
    error = fails(hw_cluster({"type": "fake-robot", "configs": [{"node_rank": 0}]}, node_ranks=1),
                  f"{HW}.configs[0].node_rank", "node 0 is not in this group")
    assert "the group's nodes are [1]" in str(error)


@pytest.mark.parametrize("value", [True, "0", -1])
def test_device_config_node_rank_not_a_rank(value: Any) -> None:
    fails(hw_cluster({"type": "fake-robot", "configs": [{"node_rank": value}]}), f"{HW}.configs[0].node_rank",
          "must be")


def test_device_config_entry_must_be_a_mapping() -> None:
    fails(hw_cluster({"type": "fake-robot", "configs": ["/dev/ttyUSB0"]}), f"{HW}.configs[0]", "must be a mapping")


def test_fake_robot_check_config_rejects_unknown_key() -> None:
    error = fails(hw_cluster({"type": "fake-robot", "configs": [{"node_rank": 0, "port": "/dev/ttyUSB0"}]}),
                  f"{HW}.configs[0]", re.escape("unknown fake-robot key(s) ['port']"))
    assert "'fake-robot' backend" in str(error)


def test_fake_robot_check_config_rejects_bad_value() -> None:
    fails(hw_cluster({"type": "fake-robot", "configs": [{"node_rank": 0}, {"node_rank": 1, "name": 5}]}),
          f"{HW}.configs[1]", "fake-robot name must be a string")


def test_ignore_hardware_true() -> None:
    config = parse_cluster_config(section(node_groups=[group(ignore_hardware=True)]))
    assert config.group("g").ignore_hardware is True


def test_ignore_hardware_default_false() -> None:
    assert parse_cluster_config(section(node_groups=[group()])).group("g").ignore_hardware is False


@pytest.mark.parametrize("value", ["yes", 1, 0, None])
def test_ignore_hardware_non_bool(value: Any) -> None:
    fails(section(node_groups=[group(ignore_hardware=value)]), "cluster.node_groups[0].ignore_hardware",
          "must be true or false")


def test_ignore_hardware_with_hardware() -> None:
    fails(hw_cluster({"type": "fake-accelerator"}, ignore_hardware=True), "cluster.node_groups[1].ignore_hardware",
          "cannot be true in a group that declares hardware")


def test_ignore_hardware_false_with_hardware_is_allowed() -> None:
    config = parse_cluster_config(hw_cluster({"type": "fake-accelerator"}, ignore_hardware=False))
    assert config.group("hw").hardware is not None


# -- component placement ----------------------------------------------------------------------------

CP = "cluster.component_placement"


def cp_cluster(placement: Any, num_nodes: int = 2) -> dict[str, Any]:
    return section(num_nodes, node_groups=[group("gpu", 0), robot_group("robot", 1, [{"node_rank": 1}])],
                   component_placement=placement)


def test_component_plain_string() -> None:
    spec = parse_cluster_config(cp_cluster({"actor": "0-7"})).components["actor"]
    assert (spec.name, spec.node_groups, spec.placement, spec.path) == ("actor", ("cluster",), "0-7", f"{CP}.actor")


def test_component_integer_placement_becomes_string() -> None:
    assert parse_cluster_config(cp_cluster({"actor": 3})).components["actor"].placement == "3"


def test_component_key_with_several_names_gives_each_a_copy() -> None:
    components = parse_cluster_config(cp_cluster({"actor, inference": "0-3"})).components
    assert set(components) == {"actor", "inference"}
    assert components["actor"].placement == components["inference"].placement == "0-3"
    assert components["actor"].path == f"{CP}['actor, inference']"


def test_component_mapping_form() -> None:
    spec = parse_cluster_config(cp_cluster({"env": {"node_group": "robot", "placement": "0:0-1"}})).components["env"]
    assert (spec.node_groups, spec.placement, spec.path) == (("robot",), "0:0-1", f"{CP}.env.placement")


def test_component_mapping_without_node_group_uses_cluster() -> None:
    spec = parse_cluster_config(cp_cluster({"env": {"placement": "0"}})).components["env"]
    assert spec.node_groups == ("cluster",)


@pytest.mark.parametrize("node_group", ["gpu,robot", " gpu , robot ", ["gpu", "robot"]])
def test_component_several_node_groups(node_group: Any) -> None:
    spec = parse_cluster_config(cp_cluster({"a": {"node_group": node_group, "placement": "0-1"}})).components["a"]
    assert spec.node_groups == ("gpu", "robot")


@pytest.mark.parametrize("label", ["node", "cluster"])
def test_component_reserved_node_groups_allowed(label: str) -> None:
    spec = parse_cluster_config(cp_cluster({"a": {"node_group": label, "placement": "0"}})).components["a"]
    assert spec.node_groups == (label,)


def test_component_placed_twice() -> None:
    fails(cp_cluster({"actor,inference": "0-3", "actor": "4-7"}), f"{CP}.actor",
          re.escape("component 'actor' is placed twice (also in cluster.component_placement['actor,inference'])"))


def test_component_listed_twice_in_one_key() -> None:
    fails(cp_cluster({"actor,actor": "0-3"}), f"{CP}['actor,actor']", "component 'actor' is placed twice")


def test_component_name_invalid() -> None:
    fails(cp_cluster({"actor,": "0-3"}), f"{CP}['actor,']", "'' is not a component name")


def test_component_unknown_node_group_suggests() -> None:
    error = fails(cp_cluster({"env": {"node_group": "robt", "placement": "0"}}), f"{CP}.env.node_group",
                  "there is no node group 'robt'.*did you mean 'robot'")
    assert "groups: gpu, robot, cluster, node" in str(error)


def test_component_unknown_node_group_in_list() -> None:
    fails(cp_cluster({"env": {"node_group": ["gpu", "gpus"], "placement": "0"}}), f"{CP}.env.node_group",
          "there is no node group 'gpus'.*did you mean 'gpu'")


@pytest.mark.parametrize("node_group", ["robot,robot", ["gpu", "gpu"]])
def test_component_node_group_listed_twice(node_group: Any) -> None:
    fails(cp_cluster({"env": {"node_group": node_group, "placement": "0"}}), f"{CP}.env.node_group",
          "is listed twice")


@pytest.mark.parametrize("node_group", [[], 3, None])
def test_component_node_group_wrong_type(node_group: Any) -> None:
    fails(cp_cluster({"env": {"node_group": node_group, "placement": "0"}}), f"{CP}.env.node_group",
          "must be a group label")


def test_component_placement_missing_in_mapping_form() -> None:
    fails(cp_cluster({"env": {"node_group": "robot"}}), f"{CP}.env.placement", "is required")


def test_component_mapping_unknown_key_suggests() -> None:
    fails(cp_cluster({"env": {"node_group": "robot", "placment": "0"}}), f"{CP}.env.placment",
          "unknown key.*did you mean 'placement'")


@pytest.mark.parametrize("value", [[0, 1], True, None, 1.5])
def test_component_placement_wrong_type(value: Any) -> None:
    error = fails(cp_cluster({"actor": value}), f"{CP}.actor", "a placement is a string")
    assert error.value == value


@pytest.mark.parametrize("value", [["0-1"], False])
def test_component_placement_wrong_type_in_mapping_form(value: Any) -> None:
    fails(cp_cluster({"env": {"node_group": "robot", "placement": value}}), f"{CP}.env.placement",
          "a placement is a string")


def test_component_placement_must_be_a_mapping() -> None:
    fails(cp_cluster(["actor"]), CP, "must be a mapping")


def test_component_name_not_a_string() -> None:
    fails(cp_cluster({3: "0"}), f"{CP}.3", "component names are strings")


# -- ClusterConfig.group ----------------------------------------------------------------------------


@pytest.mark.parametrize("label", ["cluster", "node"])
def test_reserved_groups_cover_all_nodes(label: str) -> None:
    config = parse_cluster_config(section(3, node_groups=[group("a", 0)]))
    reserved = config.group(label)
    assert isinstance(reserved, NodeGroup)
    assert reserved.label == label
    assert reserved.node_ranks == (0, 1, 2)
    assert reserved.hardware is None
    assert reserved.env_configs == ()


def test_node_group_ignores_hardware_cluster_group_does_not() -> None:
    config = parse_cluster_config(section(2))
    assert config.group("node").ignore_hardware is True
    assert config.group("cluster").ignore_hardware is False


def test_group_by_label() -> None:
    config = parse_cluster_config(section(3, node_groups=[group("a", 0), group("b", "1-2")]))
    assert config.group("b").node_ranks == (1, 2)
    assert config.group("b") is config.node_groups[1]


def test_unknown_group_suggests() -> None:
    config = parse_cluster_config(section(2, node_groups=[group("robot", 1)]))
    with pytest.raises(ConfigError, match=r"there is no node group 'robt'.*did you mean 'robot'") as exc:
        config.group("robt")
    assert exc.value.path == "cluster.node_groups"
    assert "groups: robot, cluster, node" in str(exc.value)


def test_unknown_group_without_close_match() -> None:
    config = parse_cluster_config(section(2, node_groups=[group("robot", 1)]))
    with pytest.raises(ConfigError, match="there is no node group 'zzzzzz'") as exc:
        config.group("zzzzzz")
    assert "did you mean" not in str(exc.value)


# -- ClusterConfig.declared_configs -----------------------------------------------------------------


class _OtherDevice(hwplace.HardwareBackend):
    name = "test-config-gripper"
    kind = "device"

    def detect(self, configs: Sequence[Mapping[str, Any]]) -> list[hwplace.Device]:
        return [hwplace.Device(i, "gripper") for i in range(len(configs))]


def test_declared_configs_single_type_in_declaration_order() -> None:
    config = parse_cluster_config(section(2, node_groups=[
        robot_group("r", "all", [{"node_rank": 1, "name": "b"}, {"node_rank": 0, "name": "x"},
                                 {"node_rank": 1, "name": "a"}]),
    ]))
    assert config.declared_configs(1) == {"fake-robot": [{"node_rank": 1, "name": "b"},
                                                         {"node_rank": 1, "name": "a"}]}
    assert config.declared_configs(0) == {"fake-robot": [{"node_rank": 0, "name": "x"}]}


def test_declared_configs_across_groups_keep_group_order() -> None:
    config = parse_cluster_config(section(2, node_groups=[
        robot_group("r1", 1, [{"node_rank": 1, "name": "first"}]),
        group("accel", "all", hardware={"type": "fake-accelerator"}),
        robot_group("r2", "0-1", [{"node_rank": 1, "name": "second"}]),
    ]))
    assert config.declared_configs(1) == {
        "fake-robot": [{"node_rank": 1, "name": "first"}, {"node_rank": 1, "name": "second"}]}


def test_declared_configs_node_without_devices_is_empty() -> None:
    config = parse_cluster_config(section(3, node_groups=[robot_group("r", 0, [{"node_rank": 0}]), group("g")]))
    assert config.declared_configs(2) == {}
    assert parse_cluster_config(section(1)).declared_configs(0) == {}


def test_declared_configs_group_by_type() -> None:
    with registered_plugin(backend_plugin(_OtherDevice()), name="test-config-gripper-plugin"):
        config = parse_cluster_config(section(2, node_groups=[
            robot_group("r1", "all", [{"node_rank": 0, "name": "r1-0"}, {"node_rank": 1, "name": "r1-1"}]),
            group("grip", "all", hardware={"type": "test-config-gripper",
                                           "configs": [{"node_rank": 1, "id": "g"}]}),
            robot_group("r2", 1, [{"node_rank": 1, "name": "r2-1"}]),
        ]))
    declared = config.declared_configs(1)
    assert list(declared) == ["fake-robot", "test-config-gripper"]
    assert declared["fake-robot"] == [{"node_rank": 1, "name": "r1-1"}, {"node_rank": 1, "name": "r2-1"}]
    assert declared["test-config-gripper"] == [{"node_rank": 1, "id": "g"}]
    assert config.declared_configs(0) == {"fake-robot": [{"node_rank": 0, "name": "r1-0"}]}
