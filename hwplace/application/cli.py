"""The ``hwplace`` command: ``plan`` a config without launching anything, ``run`` a job, list ``hardware``, show
the ``status`` of a running cluster, sum up a run's trace (``report``).

Each command parses its config once into a :class:`~hwplace.JobConfig` and hands that record on. Imports the
layers below and the other modules of :mod:`hwplace.application`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

from hwplace.application.job import run_job
from hwplace.application.notes import print_notes
from hwplace.application.report import plan_json, print_plan, print_sync_plans, sync_plans, sync_plans_json, table
from hwplace.application.status import print_status
from hwplace.application.summary import result_line, summary_data
from hwplace.application.timeline import load_trace, recording
from hwplace.application.trace_report import print_report
from hwplace.config.job_config import parse_job_config
from hwplace.config.loading import apply_overrides, load_config
from hwplace.contracts.capabilities import Leases, require
from hwplace.contracts.hardware import Device
from hwplace.foundation.errors import ConfigError, HwplaceError, PlacementError, PluginError
from hwplace.foundation.settings import FAKE_ACCELERATOR, NODE_RANK, QUIET_WORKERS, read_node_rank
from hwplace.foundation.version import __version__
from hwplace.foundation.wording import ranks_text, safe_repr
from hwplace.inventory.cluster import Cluster
from hwplace.inventory.detection import detect_node_hardware
from hwplace.inventory.offline import fake_cluster, parse_nodes
from hwplace.planning.component import ComponentPlacement
from hwplace.plugin.manager import PluginManager
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
    section = config.cluster
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
    try:
        plan = ComponentPlacement(config, cluster)
    except PlacementError:
        if args.nodes is None and not any(cluster.accelerator_types(range(cluster.num_nodes))):
            err.write("hwplace: note: no accelerator was detected on this machine; plan against a declared "
                      "inventory instead, such as --nodes 2x8 or --nodes 2x8:cuda\n")
        raise
    syncs = sync_plans(config.weight_sync, plan)
    if args.json:
        json.dump({**plan_json(plan), **({"weight_sync": sync_plans_json(syncs)} if syncs else {})}, out, indent=2,
                  default=safe_repr)
        out.write("\n")
    else:
        print_plan(plan, out)
        print_sync_plans(syncs, out)
        print_notes(plan, out)
    return 0


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
    try:
        with _worker_output(args.worker_output), recording(args.trace, args.profile, config):
            result = run_job(config, accelerators_per_node=counts, out=out,
                             base=os.path.dirname(os.path.abspath(args.config)), job_name=_stem(args.config))
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


def _node_rank(args: argparse.Namespace, num_nodes: int) -> int:
    raw = args.node_rank if args.node_rank is not None else (read_node_rank() or "0")
    where = "--node-rank" if args.node_rank is not None else NODE_RANK
    if not (str(raw).isascii() and str(raw).isdigit() and len(str(raw)) <= 7 and int(raw) < num_nodes):
        raise ConfigError(where, f"{str(raw)[:20]!r} is not a node rank of this config",
                          allowed=f"0 to {num_nodes - 1} (cluster.num_nodes is {num_nodes})")
    return int(raw)


STATUS_ADDRESSES = ("the address of a running cluster's head, host:port (`ray start --head` prints it), in "
                    "--address or RAY_ADDRESS; without either, status asks the cluster `ray start` made on this "
                    "machine. hwplace status never starts a cluster")

IDENTITY_KEYS = ("uuid", "physical_id", "port", "url", "name", "hostname")
"""Device properties that say which device it is, shown first by ``hwplace hardware``."""


def _device_row(device: Device) -> list[str]:
    identity = [f"{k}={device.properties[k]}" for k in IDENTITY_KEYS if k in device.properties]
    details = [f"{k}={v}" for k, v in device.properties.items() if k not in IDENTITY_KEYS]
    health = "healthy" if device.healthy else f"UNHEALTHY: {device.reason}"
    return [str(device.index), device.model, health, " ".join(identity) or "-", " ".join(details)]


def _why_none(manager: PluginManager, name: str, declared: Mapping[str, Any], args: argparse.Namespace,
              node_rank: int) -> str | None:
    """The reason a backend gave for finding nothing here (``NoDevices``), from the cached detection."""
    if manager.backends()[name].kind == "device" and name not in declared:
        if args.config is not None:
            return f"{args.config} declares no {name} devices for node {node_rank} (hardware.configs)"
        return "its devices are declared in a config's hardware.configs: add --config job.yaml"
    return manager.detect(name, declared.get(name, ())).absent


def _hardware(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    manager = get_plugin_manager()
    declared: dict[str, list[Mapping[str, Any]]] = {}
    elsewhere: list[int] = []
    node_rank = 0
    if args.config is not None:
        config = parse_job_config(args.config, plugin_manager=manager).cluster
        node_rank = _node_rank(args, config.num_nodes)
        declared = config.declared_configs(node_rank)
        elsewhere = [r for r in range(config.num_nodes) if r != node_rank and config.declared_configs(r)]
    elif args.node_rank is not None:
        raise ConfigError("--node-rank", "needs --config: it picks which node's declared devices to detect")
    found, problems = detect_node_hardware(declared, manager=manager)
    backends = manager.backends()
    executors = manager.executors()
    absent = {name: why for name in backends if not found.get(name) and name not in problems
              and (why := _why_none(manager, name, declared, args, node_rank))}
    notes = []
    if args.config is not None:
        notes.append(f"devices {args.config} declares for node {node_rank} were detected here"
                     if declared else f"{args.config} declares no devices for node {node_rank}")
        if elsewhere:
            notes.append(f"it also declares devices for {ranks_text(elsewhere)}: run this there with --node-rank "
                         "(or HWPLACE_NODE_RANK) to check them")
    if args.json:
        json.dump({
            "node_rank": node_rank,
            "backends": [{"name": b.name, "kind": b.kind, "plugin": b.plugin, "distribution": b.distribution,
                          "devices": [dataclasses.asdict(d) for d in found.get(b.name, ())],
                          "problem": problems.get(b.name), "why_none": absent.get(b.name)}
                         for b in sorted(backends.values(), key=lambda b: b.name)],
            "executors": [{"name": name, "plugin": e.plugin, "distribution": e.distribution}
                          for name, e in executors.items()],
            "problems": [f"{what}: {why}" for what, why in problems.items()],
            "notes": notes,
        }, out, indent=2, default=safe_repr)
        out.write("\n")
        return 0
    rows = [["backend", "kind", "plugin", "distribution", "devices here"]]
    rows += [[b.name, b.kind, b.plugin, b.distribution,
              f"0: {absent[b.name]}" if b.name in absent else str(len(found.get(b.name, ())))]
             for b in sorted(backends.values(), key=lambda b: b.name)]
    table(rows, out)
    out.write("\n")
    table([["executor", "plugin", "distribution"]]
           + [[name, e.plugin, e.distribution] for name, e in executors.items()], out)
    for name, devices in found.items():
        out.write(f"\n{name}:\n")
        table([["index", "model", "health", "identity", "details"]] + [_device_row(d) for d in devices], out)
    for note in notes:
        out.write(f"\nnote: {note}\n")
    for what, why in problems.items():
        err.write(f"hwplace: warning: {what}: {why}\n")
    return 0


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
    run.set_defaults(run=_run)
    report = commands.add_parser("report", help="sum up a trace of hwplace run --trace: each device's idle share "
                                 "per stage and the longest waits")
    report.add_argument("trace", metavar="FILE", help="a trace written by hwplace run --trace FILE")
    report.add_argument("--top", type=int, default=10, help="how many of the longest waits to list (default: 10)")
    report.set_defaults(run=_report)
    hardware = commands.add_parser("hardware", help="list the registered backends and what they detect here")
    hardware.add_argument("--config", help="also detect the devices this config declares for this node")
    hardware.add_argument("--node-rank", help="which node of the config this machine is (default: "
                          "$HWPLACE_NODE_RANK, else 0)")
    hardware.add_argument("--json", action="store_true", help="print as JSON")
    hardware.set_defaults(run=_hardware)
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
