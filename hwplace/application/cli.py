"""The ``hwplace`` command: ``plan`` a config without launching anything, ``run`` a job, list ``hardware``, show
the ``status`` of a running cluster, sum up a run's trace (``report``).

Each command parses its config once into a :class:`~hwplace.JobConfig` and hands that record on. Imports the
layers below and the other modules of :mod:`hwplace.application`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from hwplace.application.forecast import prediction_json, print_measured, print_prediction, print_search, search_json
from hwplace.application.hardware import hardware_command
from hwplace.application.job import run_job
from hwplace.application.notes import print_notes
from hwplace.application.report import plan_json, print_plan, print_sync_plans, sync_plans, sync_plans_json
from hwplace.application.status import print_status
from hwplace.application.summary import result_line, summary_data
from hwplace.application.timeline import load_trace, recording
from hwplace.application.trace_report import print_report
from hwplace.config.job_config import parse_job_config
from hwplace.config.loading import apply_overrides, load_config
from hwplace.config.records import ClusterConfig
from hwplace.contracts.capabilities import Leases, require
from hwplace.foundation.errors import ConfigError, HwplaceError, PlacementError, PluginError
from hwplace.foundation.settings import FAKE_ACCELERATOR, QUIET_WORKERS
from hwplace.foundation.version import __version__
from hwplace.foundation.wording import safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.inventory.offline import fake_cluster, parse_nodes
from hwplace.planning.component import ComponentPlacement
from hwplace.planning.cost import predict
from hwplace.planning.layouts import SearchResult
from hwplace.planning.profile import NotMeasured, load_profile
from hwplace.planning.search import search_placements
from hwplace.plugin.session import get_plugin_manager

EXIT_ERROR = 2
EXIT_FAILED = 1  # the job ran and failed: a worker raised or died
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT
EXIT_TERMINATED = 143  # SIGTERM: 128 + SIGTERM


class Terminated(BaseException):
    """SIGTERM reached the command: raised where it runs, so the job's groups are shut down on the way out."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_ends_the_command() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the block (the main thread only), as Ctrl-C raises KeyboardInterrupt;
    the executor keeps it (the Ray executor puts back the handler ``ray.init`` replaces)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _show_error(error: HwplaceError, err: TextIO) -> None:
    err.write(f"hwplace: error: {error}\n")
    if isinstance(error, PlacementError) and error.text is not None and error.span is not None:
        start, end = error.span
        lines = error.text.splitlines(keepends=True) or [""]
        offset = 0
        for line in lines:  # show the line the entry starts on, with the caret under the entry
            if offset + len(line) > start or line is lines[-1]:
                break
            offset += len(line)
        shown = line.rstrip("\r\n").expandtabs(1)
        prefix = f"    {error.component or 'placement'}: "
        width = max(min(end, offset + len(shown)) - start, 1)
        err.write(f"{prefix}{shown}\n")
        err.write(" " * (len(prefix) + start - offset) + "^" * width + "\n")


def _plan(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    config = parse_job_config(args.config)
    if args.search and not args.profile:
        raise ConfigError("--search", "needs a profile to predict from", allowed="--profile FILE (JSON written by "
                          "hwplace run --profile, or by hand: docs/resources.md)")
    if args.top < 1:
        raise ConfigError("--top", "is how many layouts to show", value=args.top, allowed="1 or more")
    profile = load_profile(*args.profile) if args.profile else None
    cluster = _plan_cluster(args, config.cluster, err)
    try:
        if args.search:
            assert profile is not None
            return _search(search_placements(config, cluster, profile), args, out)
        plan = ComponentPlacement(config, cluster)
    except PlacementError as exc:
        if args.nodes is None and not any(cluster.accelerator_types(range(cluster.num_nodes))) \
                and not isinstance(exc, NotMeasured):
            err.write("hwplace: note: no accelerator was detected on this machine; plan against a declared "
                      "inventory instead, such as --nodes 2x8 or --nodes 2x8:cuda\n")
        raise
    syncs = sync_plans(config.weight_sync, plan)
    prediction = predict(plan, profile) if profile is not None else None
    if args.json:
        json.dump({**plan_json(plan), **({"weight_sync": sync_plans_json(syncs)} if syncs else {}),
                   **({"prediction": prediction_json(prediction)} if prediction else {})}, out, indent=2,
                  default=safe_repr)
        out.write("\n")
    else:
        print_plan(plan, out)
        print_sync_plans(syncs, out)
        if prediction is not None:
            print_prediction(prediction, out, profile=", ".join(args.profile))
        print_notes(plan, out)
    return 0


def _search(result: SearchResult, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        json.dump({"search": search_json(result)}, out, indent=2, default=safe_repr)
        out.write("\n")
    else:
        print_search(result, out, top=args.top, profile=", ".join(args.profile))
    return 0


def _plan_cluster(args: argparse.Namespace, section: ClusterConfig, err: TextIO) -> Cluster:
    """The cluster ``hwplace plan`` plans on: the inventory of ``--nodes``, else this machine's."""
    if args.nodes is not None:
        # argparse turns the value '--' into an empty list: take it as the text it was
        counts, types = parse_nodes(args.nodes if isinstance(args.nodes, str) else "--")
        try:
            cluster = fake_cluster(section, num_nodes=len(counts), accelerators_per_node=counts,
                                   accelerator_type=types)
        except ConfigError as exc:  # an unknown :type is the option's mistake: name the option
            if exc.path != "accelerator_type":
                raise
            raise ConfigError("--nodes", exc.problem, allowed=exc.allowed) from None
    else:
        cluster = Cluster.this_machine(section)
    for problem in cluster.problems:
        err.write(f"hwplace: warning: {problem}\n")
    return cluster


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.summary is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.summary))):
        raise ConfigError("--summary", "names a file in a folder that does not exist", value=args.summary,
                          allowed="a file in an existing folder (it is written when the job returns)")
    raw = apply_overrides(load_config(args.config), args.overrides)
    raw.setdefault("job", {})  # a config without one is named as job.entrypoint's problem, with the forms
    config = parse_job_config(raw)
    counts = None
    if args.nodes is not None:
        counts, types = parse_nodes(args.nodes if isinstance(args.nodes, str) else "--")
        if set(types) != {FAKE_ACCELERATOR}:
            raise ConfigError("--nodes", "a simulated cluster has fake accelerators only", value=args.nodes,
                              allowed="4x8 or 8,8,4 without a :type; plan other types with hwplace plan --nodes")
    plans: list[ComponentPlacement] = []
    try:
        with _worker_output(args.worker_output), recording(args.trace, args.profile, config) as recorded:
            result = run_job(config, accelerators_per_node=counts, out=out,
                             base=os.path.dirname(os.path.abspath(args.config)), job_name=_stem(args.config),
                             snapshots=args.snapshots, resume=args.resume, keep_snapshots=args.keep_snapshots,
                             planned=plans.append)
    except ConfigError as exc:  # the simulated cluster's shape is the option's mistake: name the option
        if exc.path != "accelerators_per_node":
            raise
        wanted = exc.allowed.split()[2] if exc.allowed else "N"  # "at least N nodes"
        raise ConfigError("--nodes", exc.problem, value=args.nodes,
                          allowed=f"{exc.allowed}, such as --nodes {wanted}x4") from None
    out.write(result_line(result))
    if args.summary is not None:
        data = summary_data(result)  # refused before the file is written
        with open(args.summary, "w", encoding="utf-8") as file:
            json.dump(data, file, indent=2, allow_nan=False)
            file.write("\n")
        out.write(f"summary: {args.summary}\n")
    for option, path in (("trace", args.trace), ("profile", args.profile)):
        if path is not None:
            out.write(f"{option}: {path}\n")
    if args.profile is not None and recorded.profile is not None and plans:
        print_measured(recorded.profile, args.profile, plans[0], out)
    return 0


def _report(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.top < 1:
        raise ConfigError("--top", "must be at least 1", value=args.top)
    print_report(load_trace(args.trace), out, top=args.top, node_type=get_plugin_manager().node_backend().name)
    return 0


@contextlib.contextmanager
def _worker_output(shown: bool) -> Iterator[None]:
    """Keep the terminal to hwplace's output for the block (``HWPLACE_QUIET_WORKERS``): workers' output and the
    executor's log lines go to its logs, unless ``shown`` (``--worker-output``) or the variable says otherwise."""
    before = os.environ.get(QUIET_WORKERS)
    os.environ[QUIET_WORKERS] = "0" if shown else (before if before is not None else "1")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(QUIET_WORKERS, None)
        else:
            os.environ[QUIET_WORKERS] = before


def _stem(path: str) -> str:
    """A config file's name without its suffix: ``grpo.yaml`` names job ``grpo``."""
    return os.path.splitext(os.path.basename(path))[0] or path


STATUS_ADDRESSES = ("the address of a running cluster's head, host:port (`ray start --head` prints it), in "
                    "--address or RAY_ADDRESS; without either, status asks the cluster `ray start` made on this "
                    "machine. hwplace status never starts a cluster")

def _status(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    manager = get_plugin_manager()
    try:
        executor = manager.executor(args.executor)
    except PluginError as exc:
        raise ConfigError("--executor", str(exc), allowed=", ".join(manager.executors()) or "none installed") from None
    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"  # a running cluster, never a new one
    try:
        state = require(executor, Leases, "hwplace status").cluster_status(address)
    except ConfigError as exc:  # worded for a job's config (cluster.address, an embedded Ray): say it for status
        if exc.path not in ("cluster.address", "address"):
            raise
        where = "--address" if args.address else ("RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else "--address")
        raise ConfigError(where, exc.problem.replace("cluster.address", "--address"), allowed=STATUS_ADDRESSES) \
            from None
    if args.json:
        json.dump(state, out, indent=2, default=safe_repr)
        out.write("\n")
    else:
        print_status(state, out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hwplace", description="Place a distributed job's processes on hardware.")
    parser.add_argument("--version", action="version", version=f"hwplace {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="resolve every component of a config without launching anything")
    plan.add_argument("config", help="YAML file with a cluster: section")
    plan.add_argument("--nodes", help="plan on a declared inventory instead of this machine: 4x8 (4 nodes of 8 "
                      "fake accelerators), 4x8:cuda (of 8 cuda GPUs), 2x8:my-tpu,1x4:cuda, or 8,8,4")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--profile", action="append", metavar="FILE", help="predict the step time from this profile "
                      "(JSON; repeat to merge several runs' points): docs/resources.md")
    plan.add_argument("--search", action="store_true", help="search the placements of the components on the "
                      "cluster, predict each from --profile, print the best and its component_placement:")
    plan.add_argument("--top", type=int, default=5, help="how many layouts --search shows (default 5)")
    plan.set_defaults(run=_plan)
    run = commands.add_parser("run", help="run a job: place its components, launch them, call its entry point",
                              description="Connect to Ray (or start an embedded local one), place every component, "
                              "print the plan, and call the function job.entrypoint names with a hwplace.Job.")
    run.add_argument("config", help="YAML file with a cluster: section and a job: section naming the entry point")
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                     help="set config values before running, such as job.steps=5 or cluster.num_nodes=2")
    run.add_argument("--nodes", help="run on a throwaway local Ray cluster of this shape, with fake accelerators: "
                     "1x4 (one node of 4), 2x4, or 4,2")
    run.add_argument("--summary", metavar="FILE", help="write what the job's entry point returns to FILE, as JSON")
    run.add_argument("--worker-output", action="store_true", help="show the workers' output and the executor's "
                     "log lines (Ray's) here; by default they stay in the executor's logs, which the run names")
    run.add_argument("--trace", metavar="FILE", help="write the run's timeline to FILE: a Chrome / Perfetto trace "
                     "with a track per worker (open it in ui.perfetto.dev; hwplace report FILE sums it up)")
    run.add_argument("--profile", metavar="FILE", help="write each component's stage durations and peak memory per "
                     "phase to FILE, as JSON (what plan --search reads)")
    run.add_argument("--snapshots", metavar="DIR", help="keep the snapshots job.snapshot(step, state) takes in DIR "
                     "(made if missing; written atomically): docs/resilience.md")
    run.add_argument("--resume", metavar="DIR", help="continue from the newest snapshot in DIR (an empty DIR starts "
                     "from the beginning); new snapshots go there too unless --snapshots names another folder")
    run.add_argument("--keep-snapshots", type=int, default=2, metavar="N",
                     help="how many of the newest snapshots to keep (default 2)")
    run.set_defaults(run=_run)
    report = commands.add_parser("report", help="sum up a trace of hwplace run --trace: each device's idle share "
                                 "per stage, the top waits (beyond the usual of their kind) and the longest waits")
    report.add_argument("trace", metavar="FILE", help="a trace written by hwplace run --trace FILE")
    report.add_argument("--top", type=int, default=10,
                        help="how many of the top and of the longest waits to list (default: 10)")
    report.set_defaults(run=_report)
    hardware = commands.add_parser("hardware", help="list the registered backends and what they detect here")
    hardware.add_argument("--config", help="also detect the devices this config declares for this node")
    hardware.add_argument("--node-rank", help="which node of the config this machine is (default: "
                          "$HWPLACE_NODE_RANK, else 0)")
    hardware.add_argument("--json", action="store_true", help="print as JSON")
    hardware.set_defaults(run=hardware_command)
    status = commands.add_parser("status", help="list the jobs, groups, device leases and channels on a running "
                                 "cluster", description="Connect to a running Ray cluster (never start one) and list "
                                 "what hwplace jobs run there: jobs, groups, device leases and channels.")
    status.add_argument("--address", help="the cluster's address, host:port (default: $RAY_ADDRESS, else the "
                        "cluster `ray start` made on this machine)")
    status.add_argument("--executor", default="ray", help="the executor whose cluster to ask (default: ray)")
    status.add_argument("--json", action="store_true", help="print as JSON")
    status.set_defaults(run=_status)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the command line; returns the exit code: 2 for a configuration, placement or plugin error, 1 for a
    job that failed (a worker raised or died), 130 when interrupted (Ctrl-C) and 143 when terminated (SIGTERM)."""
    out, err = out or sys.stdout, err or sys.stderr
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "run" and not any(e.startswith("-") for e in extra):
        args.overrides += extra  # KEY=VALUE overrides given after --nodes
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        with _sigterm_ends_the_command():
            code: int = args.run(args, out, err)
    except (ConfigError, PlacementError, PluginError) as error:
        _show_error(error, err)
        return EXIT_ERROR
    except HwplaceError as error:  # the job started and failed: a worker raised or died, a channel was lost
        _show_error(error, err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        err.write("hwplace: interrupted\n")
        return EXIT_INTERRUPTED
    except Terminated:
        err.write("hwplace: terminated (SIGTERM)\n")
        return EXIT_TERMINATED
    except BrokenPipeError:  # the reader went away (`hwplace plan ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code
