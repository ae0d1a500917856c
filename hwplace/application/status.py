"""``hwplace status``: what runs on a shared cluster (jobs, groups, device leases, channels) as tables.

The executor gathers it (``Executor.cluster_status``, from hwplace's registry on the cluster); this module only
renders it. Imports the layers below.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from hwplace.application.report import table
from hwplace.foundation.wording import plural, ranks_text


def _ranks(ranks: Sequence[int]) -> str:
    """``"0-3"``, ``"0,2"``: ranks as the placement strings write them."""
    if not ranks:
        return "-"
    return ranks_text(sorted(ranks), "rank").split(" ", 1)[1]  # "ranks 0-3" less its word


def _devices(workers: Sequence[Mapping[str, Any]]) -> str:
    """``"node 0: fake-accelerator 0,1; node 1: fake-accelerator 0"``: what a group's workers hold, by node."""
    by_node: dict[int, list[str]] = {}
    for worker in workers:
        kind, _, indices = str(worker["hardware"]).rpartition(" ")
        held = by_node.setdefault(int(worker["node_rank"]), [])
        for index in indices.split(","):
            if f"{kind} {index}" not in held:
                held.append(f"{kind} {index}")
    parts = []
    for node, held in sorted(by_node.items()):
        kinds: dict[str, list[str]] = {}
        for item in held:
            kind, _, index = item.rpartition(" ")
            kinds.setdefault(kind, []).append(index)
        parts.append(f"node {node}: " + ", ".join(f"{k} {','.join(v)}" for k, v in kinds.items()))
    return "; ".join(parts) or "-"


def _states(workers: Sequence[Mapping[str, Any]]) -> str:
    """``"4 serving"``, ``"3 serving, 1 restarting"``: a group's ranks by state (records without one serve)."""
    counts: dict[str, int] = {}
    for worker in workers:
        state = str(worker.get("state", "serving"))
        counts[state] = counts.get(state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in counts.items()) or "-"


def _job_names(state: Mapping[str, Any]) -> dict[str, str]:
    return {str(j["id"]): str(j.get("name") or j["id"]) for j in state.get("jobs", ())}


def print_status(state: Mapping[str, Any], out: TextIO) -> None:
    """The cluster line, then one table each for jobs, groups, leases and channels (those that are not empty)."""
    cluster = state.get("cluster", {})
    nodes = cluster.get("nodes", [])
    alive = sum(1 for n in nodes if n.get("alive"))
    out.write(f"cluster {cluster.get('address', '?')}: {plural(len(nodes), 'node')}, {alive} alive\n")
    jobs, names = state.get("jobs", []), _job_names(state)
    if not jobs:
        out.write("\nno hwplace job has launched a group or made a channel here\n")
        return
    out.write("\njobs\n")
    table([["job", "id", "driver", "since", "groups"]]
          + [[str(j.get("name") or "-"), str(j["id"]), f"pid {j['pid']} on {j['host']}",
              time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(j["since"]))), str(j["groups"])]
             for j in jobs], out)
    groups = state.get("groups", [])
    if groups:
        out.write("\ngroups\n")
        table([["job", "group", "worker class", "ranks", "nodes", "state", "devices"]]
              + [[names.get(str(g["job"]), str(g["job"])), str(g["group"]), str(g["worker_class"]),
                  _ranks([w["rank"] for w in g["workers"]]),
                  _ranks(sorted({w["node_rank"] for w in g["workers"]})), _states(g["workers"]), _devices(g["workers"])]
                 for g in groups], out)
        for g in groups:
            for w in g["workers"]:
                if w.get("restarts") or w.get("state", "serving") != "serving":
                    used = plural(int(w.get("restarts", 0)), "restart")
                    out.write(f"  {g['group']} rank {w['rank']}: {w.get('state', 'serving')}, {used} used; "
                              f"last cause: {w.get('cause') or '-'}\n")
    leases = sorted(state.get("leases", []), key=lambda x: (x["node_rank"], x["hardware_type"], x["index"]))
    if leases:
        out.write("\nleases\n")
        table([["device", "node", "job", "group", "ranks"]]
              + [[f"{lease['hardware_type']} {lease['index']}", f"{lease['node_rank']} ({lease['address']})",
                  names.get(str(lease["job"]), str(lease["job"])), str(lease["group"]), _ranks(lease["ranks"])]
                 for lease in leases], out)
    channels = state.get("channels", [])
    if channels:
        out.write("\nchannels\n")
        table([["channel", "job", "host"]]
              + [[str(c["name"]), names.get(str(c["job"]), str(c["job"])), str(c["where"])] for c in channels], out)
