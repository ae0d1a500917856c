"""What the GRPO example shows while it runs and when it is done: a progress bar, and a summary of the
learning curve, the weight syncs, staleness, the turns on shared accelerators, time per stage and balance."""

from __future__ import annotations

import collections
import sys
from typing import Any, TextIO

import hwplace


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, one line per tenth otherwise."""

    def __init__(self, total: int, what: str) -> None:
        self.total, self.what, self.shown = total, what, 0
        self.tty = sys.stderr.isatty()

    def update(self, done: int, note: str) -> None:
        if not self.tty and done * 10 // self.total == self.shown * 10 // self.total and done < self.total:
            return
        filled = 30 * done // self.total
        line = f"{self.what} [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} {note}"
        sys.stderr.write(f"\r{line}\033[K" if self.tty else line + "\n")
        if self.tty and done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()
        self.shown = done


def overlaps(first: list[tuple[float, float]], second: list[tuple[float, float]]) -> int:
    """How many pairs of intervals, one from each list, overlap in time (same node: one monotonic clock)."""
    count = 0
    for a0, a1 in first:
        count += sum(1 for b0, b1 in second if a0 < b1 and b0 < a1)
    return count


def summarize(settings: dict[str, Any], steps: list[list[dict[str, Any]]], curve: list[tuple[int, float]],
              produced: dict[str, list[dict[str, Any]]], trainers: list[dict[str, Any]], sync: hwplace.WeightSync,
              stale: int, *, launch: float, training: float) -> dict[str, Any]:
    """What the run did, from every trainer rank's step results and every producer's final report (a rank that was
    restarting when the channel closed has none: it counts as zero)."""
    produced = {name: [{**PRODUCED, **report} for report in reports] for name, reports in produced.items()}
    world = len(steps[0])
    rank_tokens = [sum(step[r]["tokens"] for step in steps) for r in range(world)]
    staleness = [s for step in steps for rank in step for s in rank["staleness"]]
    stages: dict[str, list[float]] = collections.defaultdict(list)
    for name, stage in (("env", "score answers"), ("rollout", "generate"), ("robot", "record demos")):
        stages[f"{name}: {stage}"] = [report["busy"] for report in produced[name]]
    stages["rollout: apply weights"] = [report["sync_seconds"] for report in produced["rollout"]]
    for stage in steps[0][0]["times"]:
        stages[f"trainer: {stage}"] = [sum(step[r]["times"][stage] for step in steps) for r in range(world)]
    rollouts = produced["rollout"]
    shared = [(t, r) for t in range(world) for r in range(len(rollouts))
              if trainers[t]["accelerators"] == rollouts[r]["accelerators"]]
    publish = [step[0]["times"]["publish weights"] for step in steps]
    return {
        "steps": len(steps), "launch_seconds": launch, "training_seconds": training,
        "eval": [list(point) for point in curve],
        "reward_first": _mean(r for rank in steps[0] for r in rank["reward"]),
        "reward_last": _mean(r for rank in steps[-1] for r in rank["reward"]),
        "weight_sync": {
            "versions": steps[-1][0]["version"], "bytes": trainers[0]["weight_bytes"],
            "publish_seconds": _mean(publish),
            "plan": [[t.group, t.rank, t.node, t.transport] for t in sync.plan],
            "applied": {r: {"versions": len(report["applied"]), "last": report["applied"][-1] if report["applied"]
                            else 0} for r, report in enumerate(rollouts)},
        },
        "staleness": {"mean": _mean(staleness), "max": max(staleness, default=0), "max_allowed":
                      settings["max_staleness"], "stale_reposed": stale},
        "turns": {"shared": [list(pair) for pair in shared],
                  "handovers": sum(trainers[t]["swaps"] + rollouts[r]["swaps"] for t, r in shared),
                  "overlaps": sum(overlaps(trainers[t]["turns"], rollouts[r]["turns"]) for t, r in shared)},
        "rank_tokens": rank_tokens, "imbalance": hwplace.imbalance(rank_tokens),
        "worst_step_imbalance": max(hwplace.imbalance([rank["tokens"] for rank in step]) for step in steps),
        "robots": [report["robot"] for report in produced["robot"]],
        "demos": sum(report["demos"] for report in produced["robot"]),
        "groups": sum(report["groups"] for report in rollouts),
        "stages": {stage: sum(seconds) / len(seconds) for stage, seconds in stages.items()},
    }


def ledger(trainer: dict[str, Any], left: hwplace.ChannelContents, handed: int) -> dict[str, Any]:
    """Where each prompt the cursor handed out (numbers 0 to ``handed`` - 1) went: trained on (the final model's
    history) or still in the pipeline at the end (``left``, a consistent copy of its channel). One that is in
    neither is lost; one in the history twice was trained on twice. The goal: neither."""
    seen: dict[int, int] = {}
    for ids in trainer["history"]:
        for i in ids:
            seen[i] = seen.get(i, 0) + 1
    waiting = {item["n"] for item in left.items("cursor")}
    waiting |= {item["id"] for queue in ("prompts", "answers", "experience") for item in left.items(queue)}
    return {"handed_out": handed, "trained": len(seen), "trained_twice": sum(1 for n in seen.values() if n > 1),
            "left": len(waiting - set(seen)),
            "lost": sum(1 for n in range(handed) if n not in seen and n not in waiting),
            "reposed": trainer["reposed"], "redelivered": trainer["redelivered"],
            "firsts": [[*key, *value] for key, value in trainer["firsts"].items()]}


PRODUCED: dict[str, Any] = {"busy": 0.0, "sync_seconds": 0.0, "applied": [], "turns": [], "swaps": 0,
                            "accelerators": None, "robot": "?", "demos": 0, "groups": 0}


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def print_summary(s: dict[str, Any], file: TextIO) -> None:
    def say(line: str) -> None:
        print(line, file=file)

    say(f"summary: {s['steps']} GRPO steps in {s['training_seconds']:.1f} s "
        f"(workers launched in {s['launch_seconds']:.1f} s)")
    say("  learning curve (held-out exact match): " + ", ".join(f"{step}: {em:.2f}" for step, em in s["eval"]))
    say(f"  reward per answer: {s['reward_first']:.2f} -> {s['reward_last']:.2f} (2 is an exact match)")
    sync = s["weight_sync"]
    applied = ", ".join(f"rank {r}: {a['versions']} versions, last {a['last']}" for r, a in sync["applied"].items())
    say(f"  weight sync: {sync['versions']} versions of {sync['bytes'] / 1e6:.2f} MB, "
        f"{sync['publish_seconds'] * 1000:.1f} ms per publish; rollouts applied {applied}")
    say("  weights: identical on every trainer rank after each step (checked with all_reduce MIN and MAX)")
    stale = s["staleness"]
    say(f"  staleness: mean {stale['mean']:.2f}, max {stale['max']} (allowed {stale['max_allowed']}); "
        f"{stale['stale_reposed']} stale groups discarded, their prompts sampled again")
    turns = s["turns"]
    if turns["shared"]:
        say(f"  turns: {len(turns['shared'])} accelerators shared by trainer and rollout, {turns['handovers']} "
            f"hand-overs, {turns['overlaps']} overlaps")
    say("  balance: tokens per trainer rank " + ", ".join(f"{t:,}" for t in s["rank_tokens"]) +
        f"; imbalance {s['imbalance']:.3f} (worst step {s['worst_step_imbalance']:.3f})")
    say(f"  data: {s['groups']} answer groups from rollouts, {s['demos']} demonstrations from robots "
        f"{', '.join(s['robots'])}")
    if "resilience" in s:
        r = s["resilience"]
        say(f"  resilience: {len(r['restarts'])} restarts, {r['resumes']} resumes; of {r['handed_out']} prompts handed "
            f"out, {r['trained']} trained ({r['trained_twice']} twice), {r['left']} left in the pipeline, {r['lost']} "
            f"lost; {r['redelivered']} redelivered after training, not trained again")
    say("  time per stage, seconds per process:")
    width = max(map(len, s["stages"]))
    for stage, seconds in s["stages"].items():
        say(f"    {stage:<{width}}  {seconds:7.2f}")
