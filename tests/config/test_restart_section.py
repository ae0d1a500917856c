"""The ``restart:`` section and ``hwplace.Restart`` (SPEC §12): a policy per component, each mistake named by its
key path; ``hwplace plan`` prints what each component restarts."""

from __future__ import annotations

import io
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

import hwplace
from hwplace.application.cli import main
from hwplace.config.restart import parse_restart

COMPONENTS = ["trainer", "rollout", "env"]


def test_the_spec_example_parses_into_a_policy_per_component() -> None:
    section = {"rollout": {"max_restarts": 3}, "env": {"max_restarts": 10},
               "trainer": {"max_restarts": 2, "scope": "group"}}
    policies = parse_restart(section, COMPONENTS)
    assert policies == {"rollout": hwplace.Restart(3), "env": hwplace.Restart(10, "rank"),
                        "trainer": hwplace.Restart(2, "group")}
    assert parse_restart(None, COMPONENTS) == {} == parse_restart({}, COMPONENTS)
    assert hwplace.Restart(1).describe() == "1 restart per rank"
    assert hwplace.Restart(2, "group").describe() == "2 restarts of the whole group"
    with pytest.raises(TypeError, match="read-only"):
        policies["env"] = hwplace.Restart(1)  # type: ignore[index]


@pytest.mark.parametrize(("section", "path", "words"), [
    ([1], "restart", "is a mapping of components"),
    ({"rolout": {"max_restarts": 1}}, "restart.rolout", "did you mean 'rollout'"),
    ({"rollout": 3}, "restart.rollout", "is a mapping with max_restarts"),
    ({"rollout": {}}, "restart.rollout.max_restarts", "is missing"),
    ({"rollout": {"max_restarts": True}}, "restart.rollout.max_restarts", "a whole number, 0 or more"),
    ({"rollout": {"max_restarts": -1}}, "restart.rollout.max_restarts", "a whole number, 0 or more"),
    ({"rollout": {"max_restarts": 1.5}}, "restart.rollout.max_restarts", "a whole number, 0 or more"),
    ({"rollout": {"max_restarts": 1, "scope": "node"}}, "restart.rollout.scope", "'rank'"),
    ({"rollout": {"max_restarts": 1, "scop": "rank"}}, "restart.rollout.scop", "did you mean 'scope'"),
])
def test_each_mistake_is_named_by_its_key_path(section: object, path: str, words: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=re.escape(words)) as raised:
        parse_restart(section, COMPONENTS)
    assert raised.value.path == path


SCOPES = "'rank' (the dead rank alone) or 'group' (every rank of the group together)"
COUNT = "is how many times a dead process may be started again"


@pytest.mark.parametrize(("make", "message"), [
    (lambda: parse_restart([1], COMPONENTS),
     "restart: is a mapping of components to {max_restarts, scope} (got [1]); restart: {rollout: {max_restarts: 3}}"),
    (lambda: parse_restart({"rollout": 3}, COMPONENTS),
     "restart.rollout: is a mapping with max_restarts (and scope) (got 3); {max_restarts: 3, scope: rank}"),
    (lambda: parse_restart({"rollout": {"scope": "rank"}}, COMPONENTS),
     "restart.rollout.max_restarts: is missing; a whole number, 0 or more"),
    (lambda: parse_restart({"rollout": {"max_restarts": -1}}, COMPONENTS),
     f"restart.rollout.max_restarts: {COUNT} (got -1); a whole number, 0 or more"),
    (lambda: parse_restart({"rollout": {"max_restarts": 1, "scope": "grup"}}, COMPONENTS),
     f"restart.rollout.scope: 'grup' is not a restart scope; did you mean 'group'?; {SCOPES}"),
    (lambda: parse_restart({"rollout": {"max_restarts": 1, "scope": 3}}, COMPONENTS),
     f"restart.rollout.scope: 3 is not a restart scope; {SCOPES}"),
    (lambda: hwplace.Restart(-2), f"restart.max_restarts: {COUNT} (got -2); a whole number, 0 or more"),
    (lambda: hwplace.Restart(1, "nodes"), f"restart.scope: 'nodes' is not a restart scope; {SCOPES}"),
])
def test_each_mistake_s_message_whole(make: Any, message: str) -> None:
    with pytest.raises(hwplace.ConfigError, match=re.escape(message.split(":")[0])) as raised:
        make()
    assert str(raised.value) == message


JOB = """
    cluster:
      num_nodes: 1
      component_placement: {trainer: "0-1", rollout: "2-3"}
    restart:
      rollout: {max_restarts: 3}
      trainer: {max_restarts: 2, scope: group}
    job: {entrypoint: "x.py:main"}
"""


def test_a_job_file_carries_its_policies_and_plan_prints_them(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(JOB))
    assert hwplace.parse_job_config(str(path)).restart["trainer"] == hwplace.Restart(2, "group")
    out = io.StringIO()
    assert main(["plan", str(path), "--nodes", "1x4"], out=out, err=io.StringIO()) == 0
    assert "trainer: 2 processes on group cluster, placement '0-1', restarts in place: 2 restarts of the whole " \
           "group" in out.getvalue()
    assert "rollout: 2 processes on group cluster, placement '2-3', restarts in place: 3 restarts per rank" \
           in out.getvalue()
    out = io.StringIO()
    assert main(["plan", str(path), "--nodes", "1x4", "--json"], out=out, err=io.StringIO()) == 0
    assert json.loads(out.getvalue())["components"]["rollout"]["restart"] == {"max_restarts": 3, "scope": "rank"}
