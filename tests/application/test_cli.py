"""The command line: ``hwplace plan`` and ``hwplace hardware``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwplace
from hwplace.application.cli import main
from hwplace.application.report import plan_json, sync_plans, sync_plans_json
from hwplace.config.section import cluster_section
from hwplace.config.weight_sync import parse_weight_sync
from hwplace.foundation.wording import safe_repr
from hwplace.inventory.offline import parse_nodes
from hwplace.testing import backend_plugin, registered_plugin

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


class Tpu(hwplace.HardwareBackend):
    name = "test-tpu"
    kind = "accelerator"

    def detect(self, configs):
        return []

    def isolation_env(self, devices):
        return {"TPU_VISIBLE_CHIPS": ",".join(str(d.index) for d in devices)}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_plan_prints_a_table_per_component() -> None:
    code, out, err = run("plan", str(QUICKSTART), "--nodes", "2x8")
    assert (code, err) == (0, "")
    assert "rollout: 16 processes on group gpu, placement '8-15:0-15'" in out
    assert "FAKE_VISIBLE_DEVICES=7" in out
    lines = out.splitlines()
    env_rows = lines[lines.index("env: 2 processes on group robot, placement '0:0-1'") + 2:][:2]
    assert [row.split()[:2] for row in env_rows] == [["0", "1"], ["1", "1"]]
    assert all("FAKE_ROBOTS=arm-0" in row for row in env_rows)
    # the gpu group's env_vars are shown beside the isolation variables
    rollout_header = lines[lines.index("rollout: 16 processes on group gpu, placement '8-15:0-15'") + 1]
    assert rollout_header.split() == ["rank", "node", "local", "hardware", "isolation", "env", "group", "env"]
    assert all("GLOO_SOCKET_IFNAME=lo" in row for row in lines[lines.index(rollout_header) + 1:][:16])


def test_plan_json_is_complete() -> None:
    code, out, _ = run("plan", str(QUICKSTART), "--nodes", "2x8", "--json")
    assert code == 0
    plan = json.loads(out)
    assert list(plan["components"]) == ["actor", "inference", "rollout", "env", "agent"]
    rollout = plan["components"]["rollout"]
    assert rollout["world_size"] == 16
    assert rollout["placements"][15] | {"env": None} == {
        "rank": 15, "node_id": "fake-node-1", "node_rank": 1, "local_accelerator_id": 7, "local_rank": 15,
        "local_world_size": 16, "visible_accelerators": [7], "isolate_accelerator": True,
        "local_hardware_ranks": [7], "hardware_type": "fake-accelerator", "node_group": "gpu", "env": None,
        "group_env": {"GLOO_SOCKET_IFNAME": "lo"}, "python_interpreter_path": None, "shares": []}
    assert plan["nodes"][1]["hardware"] == {"fake-accelerator": 8, "fake-robot": 1, "node": 1}


def test_placement_errors_show_the_entry_with_a_caret(tmp_path) -> None:
    config = write(tmp_path, """
        cluster:
          num_nodes: 1
          component_placement:
            actor: "0-3, 4-6:0-1"
    """)
    code, out, err = run("plan", config, "--nodes", "1x8")
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert lines[0].startswith("hwplace: error: component 'actor', entry '4-6:0-1' of '0-3, 4-6:0-1': ")
    assert "must continue at 4" in lines[0]
    assert lines[1] == "    actor: 0-3, 4-6:0-1"
    assert lines[2] == "                ^^^^^^^"


def test_config_errors_exit_2_naming_the_key(tmp_path) -> None:
    config = write(tmp_path, """
        cluster:
          num_node: 1
    """)
    code, _, err = run("plan", config, "--nodes", "1x8")
    assert code == 2
    assert "cluster.num_node: unknown key" in err
    assert "did you mean 'num_nodes'?" in err


def test_plan_refuses_an_unhealthy_device_naming_it_and_the_reason(tmp_path) -> None:
    config = write(tmp_path, """
        cluster:
          num_nodes: 1
          node_groups:
            - label: arms
              node_ranks: 0
              hardware:
                type: fake-robot
                configs:
                  - {node_rank: 0, name: left}
                  - {node_rank: 0, name: right, unhealthy: "servo 3 not responding"}
          component_placement:
            env: {node_group: arms, placement: "0-1"}
    """)
    code, _, err = run("plan", config)
    assert code == 2
    assert "process 1 would use fake-robot 1 on node 0, which is unhealthy: servo 3 not responding" in err
    assert "entry '0-1'" in err


def test_plan_without_nodes_uses_this_machines_detection(tmp_path, monkeypatch, fresh_manager) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "4")
    fresh_manager()
    config = write(tmp_path, """
        cluster:
          num_nodes: 1
          component_placement:
            actor: 0-3:0-1
            agent: {node_group: node, placement: "0:0-2"}
    """)
    code, out, _ = run("plan", config, "--json")
    assert code == 0
    plan = json.loads(out)
    assert [p["visible_accelerators"] for p in plan["components"]["actor"]["placements"]] == [[0, 1], [2, 3]]
    assert [p["hardware_type"] for p in plan["components"]["agent"]["placements"]] == ["node"] * 3


def test_plan_on_this_machine_fails_fast_when_the_config_wants_more_nodes(tmp_path) -> None:
    config = write(tmp_path, """
        cluster:
          num_nodes: 3
          component_placement: {agent: {node_group: node, placement: "0-2"}}
    """)
    code, _, err = run("plan", config)
    assert code == 2
    assert "cluster.num_nodes: asks for 3 nodes but 1 is available" in err


@pytest.mark.parametrize(("spec", "counts", "types"), [
    ("4x8", [8] * 4, ["fake-accelerator"] * 4),
    ("2x8,1x4", [8, 8, 4], ["fake-accelerator"] * 3),
    ("8, 0", [8, 0], ["fake-accelerator"] * 2),
    ("4x8:cuda", [8] * 4, ["cuda"] * 4),
    ("2x8:my-tpu,1x4:cuda", [8, 8, 4], ["my-tpu", "my-tpu", "cuda"]),
])
def test_nodes_inventory(spec, counts, types) -> None:
    assert parse_nodes(spec) == (counts, types)


@pytest.mark.parametrize("spec", ["4x8\n", "4x8:cuda\n"])
def test_a_nodes_item_with_a_final_newline_is_refused(spec) -> None:  # a "$" matched before it
    with pytest.raises(hwplace.ConfigError, match=r"^--nodes: "):
        parse_nodes(spec)


def test_nodes_inventory_of_another_accelerator_type_uses_its_backend(tmp_path) -> None:
    config = write(tmp_path, """
        cluster:
          num_nodes: 3
          node_groups: [{label: tpu, node_ranks: 0-1, hardware: {type: test-tpu}}]
          component_placement: {actor: {node_group: tpu, placement: "0-3"}, critic: "0-3"}
    """)
    with registered_plugin(backend_plugin(Tpu()), name="test-tpu-plugin"):
        code, _, err = run("plan", config, "--nodes", "2x2:test-tpu,1x4:fake-accelerator")
        assert code == 2  # the critic's group 'cluster' has two accelerator types
        assert "accelerators of several types: fake-accelerator, test-tpu" in err
        Path(config).write_text(Path(config).read_text().replace(', critic: "0-3"', ""))
        code, out, err = run("plan", config, "--nodes", "2x2:test-tpu,1x4:fake-accelerator", "--json")
    assert (code, err) == (0, "")
    actor = json.loads(out)["components"]["actor"]["placements"]
    assert [(p["node_rank"], p["hardware_type"], p["env"]) for p in actor] == [
        (0, "test-tpu", {"TPU_VISIBLE_CHIPS": "0"}), (0, "test-tpu", {"TPU_VISIBLE_CHIPS": "1"}),
        (1, "test-tpu", {"TPU_VISIBLE_CHIPS": "0"}), (1, "test-tpu", {"TPU_VISIBLE_CHIPS": "1"})]


def test_nodes_inventory_of_an_unknown_type_names_the_registered_ones() -> None:
    code, _, err = run("plan", str(QUICKSTART), "--nodes", "2x8:fake-accelerater")
    assert code == 2
    assert err.startswith("hwplace: error: --nodes: 'fake-accelerater' is not a registered accelerator backend; "
                          "registered: cuda, fake-accelerator, npu; did you mean 'fake-accelerator'?")


@pytest.mark.parametrize(("name", "meant"), [("gpu", "cuda"), ("nvidia", "cuda"), ("ascend", "npu")])
def test_nodes_of_a_common_alias_suggest_its_backend(name: str, meant: str) -> None:
    code, _, err = run("plan", str(QUICKSTART), "--nodes", f"1x4:{name}")  # 'gpu' suggested 'npu'
    assert code == 2
    assert err.startswith(f"hwplace: error: --nodes: {name!r} is not a registered accelerator backend; "
                          f"registered: cuda, fake-accelerator, npu; did you mean {meant!r}?")


def test_a_hardware_type_of_a_common_alias_suggests_its_backend() -> None:
    with pytest.raises(hwplace.ConfigError, match=r"^cluster\.node_groups\[0\]\.hardware\.type: no hardware "
                                                  r"backend is named 'gpu'; .*did you mean 'cuda'\?"):
        hwplace.parse_job_config({"cluster": {"num_nodes": 1, "node_groups": [{"label": "g", "node_ranks": 0,
                                                                               "hardware": {"type": "gpu"}}]}})


@pytest.mark.parametrize("spec", ["1000000000x1", "100001x1", "99999x1,2x1", "1x99999999", "1x8:Bad Type",
                                  ",".join(["1"] * 10_001)])
def test_absurd_nodes_inventory_is_refused_at_once(spec) -> None:
    code, _, err = run("plan", str(QUICKSTART), "--nodes", spec)
    assert code == 2
    assert err.startswith("hwplace: error: --nodes: ") or "accelerators_per_node" in err, err


@pytest.mark.parametrize("spec", ["4by8", "0x8", "", "x8", "--", "-"])
def test_bad_nodes_inventory_exits_2(spec) -> None:
    code, _, err = run("plan", str(QUICKSTART), f"--nodes={spec}")
    assert code == 2
    assert "--nodes" in err


def test_hardware_lists_backends_with_their_distribution(monkeypatch, fresh_manager) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "2")
    fresh_manager()
    code, out, _ = run("hardware")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["fake-accelerator"][1:] == ["accelerator", "fake", "hwplace", "2"]
    assert rows["node"][1:] == ["node", "node", "hwplace", "1"]
    assert rows["ray"][1:] == ["ray", "hwplace"]  # the executors, with their plugin and distribution
    assert " ".join(rows["fake-robot"][4:]) == "0: its devices are declared in a config's hardware.configs: add " \
        "--config job.yaml"
    names = [line.split()[0] for line in out.split("\n\n")[0].splitlines()[1:]]
    assert names == sorted(names)
    assert "hwplace fake accelerator" in out


def test_hardware_with_a_config_says_what_it_declares_not_to_add_it(fresh_manager) -> None:
    fresh_manager()
    code, out, _ = run("hardware", "--config", str(QUICKSTART), "--node-rank", "0")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert " ".join(rows["serial-robot"][4:]) == f"0: {QUICKSTART} declares no serial-robot devices for node 0 " \
        "(hardware.configs)"  # it said "add --config job.yaml" to a command given one
    assert "add --config" not in out


def test_hardware_json_detects_the_devices_a_config_declares() -> None:
    code, out, _ = run("hardware", "--json", "--config", str(QUICKSTART), "--node-rank", "1")
    assert code == 0
    robots = next(b for b in json.loads(out)["backends"] if b["name"] == "fake-robot")
    assert [d["properties"]["name"] for d in robots["devices"]] == ["arm-0"]
    assert json.loads(out)["executors"] == [{"name": "ray", "plugin": "ray", "distribution": "hwplace"}]


def test_console_script_and_module_entry_points() -> None:
    module = subprocess.run([sys.executable, "-m", "hwplace", "--version"], capture_output=True, text=True)
    assert module.returncode == 0
    assert module.stdout.startswith("hwplace ")
    script = Path(sys.executable).with_name("hwplace")
    result = subprocess.run([str(script), "plan", str(QUICKSTART), "--nodes", "2x8", "--json"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["components"]["agent"]["world_size"] == 4


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    script = Path(sys.executable).with_name("hwplace")
    pipeline = f"'{script}' plan '{QUICKSTART}' --nodes 2x8 | head -1"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", pipeline], capture_output=True, text=True)
    assert result.stdout == "actor: 8 processes on group cluster, placement '0-7'\n"
    assert "Traceback" not in result.stderr


def test_plan_shows_a_groups_interpreter(tmp_path) -> None:
    config = write(tmp_path, """
        cluster:
          num_nodes: 2
          node_groups:
            - label: g
              node_ranks: all
              env_configs:
                - {node_ranks: 1, python_interpreter_path: /opt/venv/bin/python, env_vars: {OMP_NUM_THREADS: 4}}
          component_placement: {actor: {node_group: g, placement: "0-3"}}
    """)
    code, out, _ = run("plan", config, "--nodes", "2x2")
    assert code == 0
    rows = [line.split() for line in out.splitlines()[2:6]]
    assert [(row[0], row[-2], row[-1]) for row in rows] == [
        ("0", "-", "-"), ("1", "-", "-"), ("2", "OMP_NUM_THREADS=4", "/opt/venv/bin/python"),
        ("3", "OMP_NUM_THREADS=4", "/opt/venv/bin/python")]
    code, out, _ = run("plan", config, "--nodes", "2x2", "--json")
    placements = json.loads(out)["components"]["actor"]["placements"]
    assert [(p["group_env"], p["python_interpreter_path"]) for p in placements[1:3]] == [
        ({}, None), ({"OMP_NUM_THREADS": "4"}, "/opt/venv/bin/python")]


def test_caret_under_a_multi_line_placement_points_into_its_line(tmp_path) -> None:
    config = write(tmp_path, """
        cluster:
          num_nodes: 1
          component_placement:
            actor: |
              0-1,
              2-3:0-1
    """)
    code, _, err = run("plan", config, "--nodes", "1x4")
    assert code == 2
    lines = err.splitlines()
    assert lines[1] == "    actor: 2-3:0-1"
    assert lines[2] == "           ^^^^^^^"


def test_no_accelerator_here_says_so_and_suggests_nodes(tmp_path, monkeypatch, fresh_manager) -> None:
    monkeypatch.delenv("HWPLACE_FAKE_ACCELERATORS", raising=False)
    fresh_manager()
    config = write(tmp_path, """
        cluster:
          num_nodes: 1
          component_placement: {actor: "0-3"}
    """)
    code, _, err = run("plan", config)
    assert code == 2
    assert "group 'cluster' has 1 node (no accelerator was detected on its nodes" in err
    assert "1 nodes" not in err
    assert "--nodes 2x8" in err


def test_hardware_node_rank_must_be_a_node_of_the_config(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("HWPLACE_NODE_RANK", raising=False)
    code, _, err = run("hardware", "--config", str(QUICKSTART), "--node-rank", "-1")
    assert code == 2
    assert "--node-rank: '-1' is not a node rank of this config; 0 to 1" in err
    code, _, err = run("hardware", "--config", str(QUICKSTART), "--node-rank", "2")
    assert code == 2
    code, _, err = run("hardware", "--node-rank", "1")
    assert (code, "needs --config") == (2, "needs --config" if "needs --config" in err else err)


def test_hardware_says_which_nodes_declarations_it_checked(monkeypatch) -> None:
    monkeypatch.delenv("HWPLACE_NODE_RANK", raising=False)
    code, out, _ = run("hardware", "--config", str(QUICKSTART))
    assert code == 0
    assert f"note: {QUICKSTART} declares no devices for node 0" in out
    assert "it also declares devices for node 1: run this there with --node-rank" in out
    monkeypatch.setenv("HWPLACE_NODE_RANK", "1")
    code, out, _ = run("hardware", "--config", str(QUICKSTART), "--json")
    report = json.loads(out)
    assert report["node_rank"] == 1
    robots = next(b for b in report["backends"] if b["name"] == "fake-robot")
    assert [d["properties"]["name"] for d in robots["devices"]] == ["arm-0"]


@given(spec=st.text(alphabet="0123456789x:,- abcz\0\n", max_size=40))
@settings(max_examples=200, deadline=None)
def test_any_nodes_text_plans_or_exits_2_naming_the_option(spec: str) -> None:
    code, _, err = run("plan", str(QUICKSTART), f"--nodes={spec}")
    assert code in (0, 2)
    if code == 2:
        assert err.startswith("hwplace: error: "), err
        assert "Traceback" not in err


class AbsentTPU(hwplace.HardwareBackend):
    name = "absent-tpu"
    kind = "accelerator"

    def detect(self, configs):
        return hwplace.NoDevices("libtpu is not installed: pip install 'absent-tpu[driver]'")


def test_hardware_says_why_a_backend_found_nothing(fresh_manager) -> None:
    fresh_manager()
    with registered_plugin(backend_plugin(AbsentTPU())):
        code, out, err = run("hardware")
        assert code == 0
        assert "absent-tpu        accelerator" in out
        assert "0: libtpu is not installed: pip install 'absent-tpu[driver]'" in out
        assert "absent-tpu" not in err  # finding nothing is not a problem
        code, out, _ = run("hardware", "--json")
        entry = next(b for b in json.loads(out)["backends"] if b["name"] == "absent-tpu")
        assert (entry["devices"], entry["problem"], entry["why_none"]) == (
            [], None, "libtpu is not installed: pip install 'absent-tpu[driver]'")


def test_plan_marks_components_that_share_accelerators(tmp_path) -> None:
    config = write(tmp_path, """\
        cluster:
          num_nodes: 1
          component_placement:
            rollout,trainer: 0-1
            solo: 2
        """)
    code, out, err = run("plan", config, "--nodes", "1x4")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    trainer = lines.index("trainer: 2 processes on group cluster, placement '0-1'")
    assert lines[trainer + 4:trainer + 6] == ["  rank 0 shares fake-accelerator 0 (node 0) with rollout rank 0",
                                              "  rank 1 shares fake-accelerator 1 (node 0) with rollout rank 1"]
    assert sum("shares" in line for line in lines) == 4  # solo shares nothing
    code, out, _ = run("plan", config, "--nodes", "1x4", "--json")
    placements = json.loads(out)["components"]["rollout"]["placements"]
    assert placements[1]["shares"] == [{"node_rank": 0, "hardware_type": "fake-accelerator", "index": 1,
                                        "component": "trainer", "rank": 1}]


WEIGHT_SYNC = """
    cluster:
      num_nodes: 2
      component_placement: {trainer: "0-1", rollout: "0,2,4-5"}
    weight_sync:
      policy: {source: trainer, targets: [%s]}
"""


def test_plan_prints_the_weight_sync_plan(tmp_path: Path) -> None:
    code, out, err = run("plan", write(tmp_path, WEIGHT_SYNC % "rollout"), "--nodes", "2x4")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    start = lines.index("weight sync policy: trainer rank 0 (node 0) -> rollout")
    assert [line.split() for line in lines[start + 1 : start + 6]] == [
        ["target", "rank", "node", "transport", "relay"], ["rollout", "0", "0", "same-device", "-"],
        ["rollout", "1", "0", "same-node", "-"], ["rollout", "2", "1", "other-node", "relays"],
        ["rollout", "3", "1", "other-node", "via", "rollout", "2"]]
    code, out, _ = run("plan", write(tmp_path, WEIGHT_SYNC % "rollout"), "--nodes", "2x4", "--json")
    plan = json.loads(out)["weight_sync"]["policy"]["plan"]
    assert [(t["transport"], t["relay"]) for t in plan] == [
        ("same-device", None), ("same-node", None), ("other-node", ["rollout", 2]), ("other-node", ["rollout", 2])]


def test_plan_refuses_a_weight_sync_naming_an_unknown_component(tmp_path: Path) -> None:
    code, _, err = run("plan", write(tmp_path, WEIGHT_SYNC % "rolout"), "--nodes", "2x4")
    assert code == 2
    assert "weight_sync.policy.targets[0]: 'rolout' is not a component" in err
    assert "did you mean 'rollout'?" in err


def test_plan_parses_the_file_once_and_plans_as_component_placement_does_from_the_record(
        tmp_path: Path, count_calls: Any) -> None:
    path = write(tmp_path, WEIGHT_SYNC % "rollout")
    watched = (hwplace.parse_job_config, hwplace.load_config, cluster_section, parse_weight_sync)
    with count_calls(*watched) as calls:
        code, out, err = run("plan", path, "--nodes", "2x4", "--json")
    assert (code, err) == (0, "")
    assert calls.of == dict.fromkeys(watched, 1)
    job = hwplace.parse_job_config(path)
    plan = hwplace.ComponentPlacement(job, hwplace.testing.fake_cluster(job.cluster, accelerators_per_node=4))
    expected = {**plan_json(plan), "weight_sync": sync_plans_json(sync_plans(job.weight_sync, plan))}
    assert json.loads(out) == json.loads(json.dumps(expected, default=safe_repr))


def test_plan_says_that_npu_tensors_travel_over_gloo_not_hccl(tmp_path) -> None:
    config = tmp_path / "npu.yaml"
    config.write_text("cluster:\n  num_nodes: 1\n  component_placement: {rollout: 0-3, trainer: 4-7}\n")
    code, out, _ = run("plan", str(config), "--nodes", "1x8:npu")  # it fell back to gloo without a word
    assert code == 0
    assert out.splitlines()[-1] == ("note: rollout, trainer on npu: the npu backend's collective backend is 'hccl', "
                                    "which hwplace does not run (torch_npu is not installed here either): tensors "
                                    "these workers send each other (messaging, weight sync) travel through host "
                                    "memory, over gloo")
    code, out, _ = run("plan", str(config), "--nodes", "1x8:cuda")  # nccl runs: nothing to say
    assert code == 0
    assert "note:" not in out
