"""What ``hwplace plan`` reports of memory per phase (SPEC §13): each accelerator's capacity, peak and headroom,
as a table and as JSON; a plan that does not fit exits 2 before any process starts."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path

import pytest

import hwplace
from hwplace.application.cli import main
from hwplace.application.report import memory_json, print_memory, print_plan

GiB = 2**30
JOB = """
    cluster:
      num_nodes: 1
      component_placement:
        trainer,rollout: 0-1
        critic: 2
        reward: 3
    resources:
      trainer: {memory: {train: 50GiB, idle: 40GiB, offloaded: 1GiB}}
      rollout: {memory: {generate: 30GiB, idle: 20GiB, offloaded: 0.5GiB}}
      critic: {memory: {train: 20GiB}}
"""


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, text: str = JOB) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def memory_rows(out: str) -> list[str]:
    lines = out.splitlines()
    start = lines.index("memory per accelerator (resources:): the peak, when the component named first works")
    return [line.strip() for line in lines[start + 1:] if line.strip()]


def test_plan_prints_each_devices_capacity_peak_and_headroom(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", raising=False)
    code, out, err = run("plan", write(tmp_path), "--nodes", "1x4")
    assert (code, err) == (0, "")
    assert [row.split("  ")[0] for row in memory_rows(out)] == [
        "device", *[f"fake-accelerator {i} of node 0" for i in range(4)]]
    header, first, _, critic, reward = (" ".join(row.split()) for row in memory_rows(out))
    assert header == "device capacity peak headroom at the peak"
    assert first == ("fake-accelerator 0 of node 0 80 GiB 50.5 GiB 29.5 GiB trainer train 50 GiB + rollout "
                     "offloaded 512 MiB")
    assert critic == "fake-accelerator 2 of node 0 80 GiB 20 GiB 60 GiB critic train 20 GiB"
    assert reward == "fake-accelerator 3 of node 0 80 GiB 0 B 80 GiB -; not in resources: reward"


def test_a_device_of_unknown_capacity_is_shown_as_not_checked(tmp_path: Path) -> None:
    manager = hwplace.PluginManager()
    tpu = type("Tpu", (hwplace.HardwareBackend,), {"name": "test-tpu", "kind": "accelerator",
                                                   "detect": lambda self, configs: []})()
    with hwplace.testing.registered_plugin(hwplace.testing.backend_plugin(tpu), plugin_manager=manager):
        cluster = hwplace.testing.fake_cluster({"num_nodes": 1}, accelerators_per_node=4,
                                               accelerator_type="test-tpu", plugin_manager=manager)
        config = hwplace.parse_job_config(write(tmp_path), plugin_manager=manager)
        plan = hwplace.ComponentPlacement(config, cluster)
    out = io.StringIO()
    print_memory(plan.memory, out)
    row = " ".join(out.getvalue().splitlines()[2].split())
    assert row == ("test-tpu 0 of node 0 unknown 50.5 GiB - trainer train 50 GiB + rollout offloaded 512 MiB; "
                   "capacity unknown: not checked")


def test_plan_json_gives_every_figure_in_bytes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", "64GiB")
    code, out, _ = run("plan", write(tmp_path, JOB.replace("num_nodes: 1", "num_nodes: 2")), "--nodes", "2x2",
                       "--json")
    assert code == 0
    memory = json.loads(out)["memory"]
    assert len(memory) == 4
    assert memory[0] == {
        "node_rank": 0, "hardware_type": "fake-accelerator", "index": 0, "capacity": 64 * GiB,
        "peak": int(50.5 * GiB), "headroom": int(13.5 * GiB), "checked": True, "fits": True,
        "holdings": [{"component": "trainer", "processes": 1, "phase": "train", "amount": 50 * GiB},
                     {"component": "rollout", "processes": 1, "phase": "offloaded", "amount": GiB // 2}],
        "undeclared": []}
    assert memory[3]["node_rank"] == 1
    assert memory[3]["undeclared"] == ["reward"]


def test_plan_without_a_resources_section_prints_no_memory(tmp_path: Path) -> None:
    text = JOB[:JOB.index("    resources:")]
    code, out, _ = run("plan", write(tmp_path, text), "--nodes", "1x4")
    assert code == 0
    assert "memory per accelerator" not in out
    code, out, _ = run("plan", write(tmp_path, text), "--nodes", "1x4", "--json")
    assert "memory" not in json.loads(out)


@pytest.mark.parametrize("nodes", ["1x4", "2x2"])
def test_a_plan_that_does_not_fit_exits_2_naming_device_phase_components_and_figures(
        tmp_path: Path, monkeypatch, nodes: str) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", "48GiB")
    code, out, err = run("plan", write(tmp_path, JOB.replace("num_nodes: 1", f"num_nodes: {nodes[0]}")), "--nodes",
                         nodes)
    assert (code, out) == (2, "")
    assert err == ("hwplace: error: fake-accelerator 0 of node 0 does not hold its peak: 50.5 GiB (54223962112 "
                   "bytes) when trainer is in phase 'train' beside rollout (trainer train 50 GiB + rollout offloaded "
                   "512 MiB), "
                   "but the device has 48 GiB (51539607552 bytes); 1 more device does not fit either; lower the "
                   "figures of resources:, give a component offloaded: or idle: and take turns, or place the "
                   "components on other devices\n")


def test_a_bad_memory_variable_or_resources_entry_exits_2_naming_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATOR_MEMORY", "lots")
    code, _, err = run("plan", write(tmp_path), "--nodes", "1x4")
    assert code == 2
    assert err.startswith("hwplace: error: HWPLACE_FAKE_ACCELERATOR_MEMORY: is not an amount of memory")
    monkeypatch.delenv("HWPLACE_FAKE_ACCELERATOR_MEMORY")
    code, _, err = run("plan", write(tmp_path, JOB.replace("train: 20GiB", "trian: 20 GiBs")), "--nodes", "1x4")
    assert code == 2
    assert err.startswith("hwplace: error: resources.critic.memory.trian: ")


def test_print_plan_and_memory_json_take_the_plans_records() -> None:
    config = hwplace.parse_job_config({"cluster": {"num_nodes": 1, "component_placement": {"a": "0"}},
                                       "resources": {"a": {"memory": {"x": "1GiB"}}}})
    plan = hwplace.ComponentPlacement(config, hwplace.testing.fake_cluster(config.cluster, accelerators_per_node=1))
    out = io.StringIO()
    print_plan(plan, out)
    assert out.getvalue().endswith("a x 1 GiB\n\n")
    assert [entry["peak"] for entry in memory_json(plan.memory)] == [GiB]
