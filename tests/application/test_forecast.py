"""``hwplace plan --profile`` (the written plan's predicted step) and ``--search`` (the best layouts and the
``component_placement:`` to paste), as the command line prints them."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import hwplace
from hwplace.application.cli import main

JOB: dict[str, Any] = {"cluster": {"num_nodes": 2, "component_placement": {"trainer,rollout": "0-3",
                                                            "env": {"node_group": "node", "placement": "0-1"}}},
       "weight_sync": {"policy": {"source": "trainer", "targets": ["rollout"]}}}


def point(processes: int, stage: str, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"processes": processes, "stages": {stage: {"seconds": seconds}}, **extra}


TRAINER = {"scaling": "data-parallel", "points": [
    point(1, "train", 8.0, offload={"seconds": 0.5}, onload={"seconds": 0.5},
          memory={"train": "50GiB", "offloaded": "1GiB"}),
    point(4, "train", 2.0, offload={"seconds": 0.5}, onload={"seconds": 0.5},
          memory={"train": "50GiB", "offloaded": "1GiB"})]}
ROLLOUT = {"scaling": "data-parallel", "points": [point(1, "generate", 6.0), point(4, "generate", 1.5)]}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    job, profile = tmp_path / "job.yaml", tmp_path / "profile.json"
    job.write_text(yaml.safe_dump(JOB))
    profile.write_text(json.dumps({"version": 1, "components": {"trainer": TRAINER, "rollout": ROLLOUT},
                                   "weight_sync": {"policy": {"bytes": "1GB"}}}))
    return str(job), str(profile)


def test_search_prints_the_layouts_and_a_placement_that_plans_to_its_prediction(files: tuple[str, str],
                                                                                tmp_path: Path) -> None:
    job, profile = files
    code, out, err = run("plan", job, "--nodes", "2x2", "--search", "--profile", profile)
    assert (code, err) == (0, "")
    assert "placement search: 2 layouts of the components on 4 accelerators" in out
    assert "not predicted" not in out
    pasted = yaml.safe_load(out.split("(replacing its component_placement:)\n")[1])
    assert pasted["component_placement"]["env"] == {"node_group": "node", "placement": "0-1"}
    best = out.split("best: ")[1].split(",")[0]
    raw = {**JOB, "cluster": {**JOB["cluster"], **pasted}}
    (tmp_path / "best.yaml").write_text(yaml.safe_dump(raw))
    code, planned, _ = run("plan", str(tmp_path / "best.yaml"), "--nodes", "2x2", "--profile", profile)
    assert code == 0
    predicted = planned.split("predicted step (")[1].split("): ")[1].split("\n")[0]
    assert f"predicted step {predicted}" in out, (best, predicted)
    assert "not in the profile, not predicted: env" in planned


def test_search_json_holds_every_layout_and_the_placement(files: tuple[str, str]) -> None:
    job, profile = files
    code, out, _ = run("plan", job, "--nodes", "2x2", "--search", "--profile", profile, "--json")
    assert code == 0
    data = json.loads(out)["search"]
    assert data["devices"] == 4
    assert {tuple(map(tuple, c["layout"])) for c in data["candidates"]} == {(("trainer", "rollout"),),
                                                                          (("trainer",), ("rollout",))}
    steps = [c["step_seconds"] for c in data["candidates"]]
    assert steps == sorted(steps)
    assert data["component_placement"].startswith("component_placement:\n")
    assert data["candidates"][0]["weight_sync"]["policy"]["transport"] in ("same-node", "other-node")


def test_plan_with_a_profile_adds_the_prediction(files: tuple[str, str]) -> None:
    job, profile = files
    code, out, _ = run("plan", job, "--nodes", "2x4", "--json", "--profile", profile)
    assert code == 0
    prediction = json.loads(out)["prediction"]
    # colocated on 4: train 2 + its turn 1 + generate 1.5 + 1 GB over same-node at 20 GB/s
    assert prediction["step_seconds"] == pytest.approx(4.55)
    assert prediction["unprofiled"] == ["env"]


@pytest.mark.parametrize(("argv", "words"), [
    (["--search"], "hwplace: error: --search: needs a profile to predict from"),
    (["--search", "--profile", "PROFILE", "--top", "0"], "hwplace: error: --top: is how many layouts to show"),
    (["--profile", "absent.json"], "hwplace: error: --profile: cannot read 'absent.json'"),
])
def test_mistakes_exit_2_naming_the_option(files: tuple[str, str], argv: list[str], words: str) -> None:
    job, profile = files
    code, out, err = run("plan", job, "--nodes", "2x4", *[profile if a == "PROFILE" else a for a in argv])
    assert (code, out) == (2, "")
    assert err.startswith(words), err


def test_what_the_profile_cannot_predict_exits_2_naming_the_point(files: tuple[str, str], tmp_path: Path) -> None:
    job, _ = files
    narrow = tmp_path / "narrow.json"
    narrow.write_text(json.dumps({"version": 1, "components": {
        "trainer": {"points": [point(16, "train", 1.0)]}, "rollout": {"points": [point(16, "generate", 1.0)]}},
        "weight_sync": {"policy": {"bytes": 1}}}))
    code, _, err = run("plan", job, "--nodes", "2x4", "--search", "--profile", str(narrow))
    assert code == 2
    assert "predicts trainer (measured on 16 processes)" in err
    code, _, err = run("plan", job, "--nodes", "2x4", "--profile", str(narrow))
    assert code == 2
    assert err.startswith("hwplace: error: trainer was measured on 16 processes, not on 4 processes"), err


def test_profiles_given_twice_are_merged(files: tuple[str, str], tmp_path: Path) -> None:
    job, profile = files
    more = tmp_path / "more.json"
    more.write_text(json.dumps({"version": 1, "components": {"trainer": {"points": [point(2, "train", 3.5)]}}}))
    code, out, _ = run("plan", job, "--nodes", "2x4", "--profile", profile, "--profile", str(more), "--search",
                       "--json")
    assert code == 0
    assert json.loads(out)["search"]["candidates"]
    assert hwplace.load_profile(profile, str(more)).component("trainer").measured(1) == [1, 2, 4]
