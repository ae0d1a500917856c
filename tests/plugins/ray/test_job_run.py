"""``hwplace run`` of small jobs on the session's two-node Ray cluster: a failed job's exit code and message,
and the summary file; SIGTERM to a run on a throwaway cluster. The GRPO example itself is
tests/plugins/ray/test_grpo.py's."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from hwplace.application.cli import main
from hwplace.config.job_config import parse_job_config
from hwplace_plugins.ray.pytest_plugin import LocalRay

pytestmark = pytest.mark.time_limit(120)


def test_run_reports_a_failed_job_with_exit_code_1(hwplace_local_ray: LocalRay, tmp_path: Path) -> None:
    (tmp_path / "failing.py").write_text(textwrap.dedent("""
        import hwplace

        class Broken(hwplace.Worker):
            def work(self):
                if self.rank == 1:
                    raise ValueError(f"rank {self.rank} cannot work")

        def main(job):
            job.launch(Broken, "broken").work().wait()
        """))
    (tmp_path / "job.yaml").write_text("job: {entrypoint: failing.py:main}\n"
                                       "cluster: {num_nodes: 1, component_placement: {broken: {node_group: node, "
                                       "placement: '0:0-1'}}}\n")
    out, err = io.StringIO(), io.StringIO()
    assert main(["run", str(tmp_path / "job.yaml")], out, err) == 1
    assert "broken: 2 processes on group node" in out.getvalue()
    assert err.getvalue().startswith("hwplace: error: group 'broken' rank 1 on node 0: work() raised ValueError: "
                                     "rank 1 cannot work\n")
    assert "Remote traceback:" in err.getvalue()
    # the failed job's group was shut down: its name is free again
    assert main(["run", str(tmp_path / "job.yaml")], io.StringIO(), io.StringIO()) == 1


def test_run_writes_what_the_entry_point_returns_as_a_summary(hwplace_local_ray: LocalRay, tmp_path: Path,
                                                              count_calls: Any) -> None:
    (tmp_path / "counting.py").write_text(textwrap.dedent("""
        import hwplace

        class Counter(hwplace.Worker):
            def count(self, n):
                return {"rank": self.rank, "counted": list(range(n))}

        def main(job):
            results = job.launch(Counter, "counter").count(job.settings(n=2).n).wait(timeout=60)
            return {"results": results, "ranks": {r["rank"] for r in results}}
        """))
    (tmp_path / "job.yaml").write_text("job: {entrypoint: counting.py:main}\n"
                                       "cluster: {num_nodes: 2, component_placement: {counter: {node_group: node, "
                                       "placement: '0-1'}}}\n")
    out = io.StringIO()
    with count_calls(parse_job_config) as calls:
        assert main(["run", str(tmp_path / "job.yaml"), "job.n=3", "--summary", str(tmp_path / "s.json")], out,
                    io.StringIO()) == 0
    assert calls.of[parse_job_config] == 1  # the config, overrides applied, is parsed once and handed on
    assert json.loads((tmp_path / "s.json").read_text()) == {
        "results": [{"rank": 0, "counted": [0, 1, 2]}, {"rank": 1, "counted": [0, 1, 2]}], "ranks": [0, 1]}


SLEEPER = """
import time
from pathlib import Path


def main(job):
    Path(__file__).with_name("started").touch()
    time.sleep(3600)
"""


@pytest.mark.time_limit(300)
def test_sigterm_ends_a_run_with_exit_143_and_one_line(tmp_path: Path) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "job.yaml").write_text("job: {entrypoint: sleeper.py:main}\n"
                                       "cluster: {num_nodes: 1, component_placement: {a: 0}}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}
    run = subprocess.Popen([sys.executable, "-m", "hwplace", "run", str(tmp_path / "job.yaml"), "--nodes", "1x1"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        while not (tmp_path / "started").exists() and run.poll() is None:
            time.sleep(0.1)
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    # it was Ray's native dump ("*** SIGTERM received at time=..."), a 30 s drain of the node, and exit 1
    assert (run.returncode, err.splitlines()[-1]) == (143, "hwplace: terminated (SIGTERM)"), err[-3000:]
    assert "SIGTERM received" not in err
    assert "a: 1 process on group cluster" in out


TALKER = """
import hwplace


class Talker(hwplace.Worker):
    def talk(self):
        print("from the worker", flush=True)
        return self.rank


def main(job):
    return job.launch(Talker, "a").talk().wait(timeout=120)
"""


@pytest.mark.time_limit(300)
def test_the_terminal_shows_hwplace_s_output_and_names_where_ray_s_logs_are(tmp_path: Path) -> None:
    (tmp_path / "talker.py").write_text(TALKER)
    (tmp_path / "job.yaml").write_text("job: {entrypoint: talker.py:main}\n"
                                       "cluster: {num_nodes: 1, component_placement: {a: 0}}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR", "HWPLACE_QUIET_WORKERS")}
    done = subprocess.run([sys.executable, "-m", "hwplace", "run", str(tmp_path / "job.yaml"), "--nodes", "1x1"],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "result: [0]"
    # Ray's lines (its INFO lines, a worker's print, the raylet's warnings) came between the plan and the result
    assert "from the worker" not in done.stdout + done.stderr
    assert "INFO" not in done.stderr
    assert re.fullmatch(r"hwplace: workers' output and Ray's log lines are not shown here: see \S+/logs \(hwplace "
                        r"run --worker-output shows them\)\n", done.stderr), done.stderr
