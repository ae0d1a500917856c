"""GRPO on hwplace: a small transformer learns to sort and reverse digits, from scratch, on fake accelerators.

Environment workers (plain nodes) pose prompts made in code and score answers with a rule; rollout workers
(accelerators) sample a group of answers per prompt with the CURRENT policy; robot workers (one per robot)
record scripted demonstrations; data-parallel trainer ranks take token-weighted batches (``get_batch``),
split them evenly (``balanced_split``), compute GRPO's group-relative loss plus the demonstrations' term,
average gradients with gloo, check that every rank's weights are identical, and publish the weights every
step through ``hwplace.WeightSync``. Rollouts apply each new version before their next batch; experience
carries the version that made it, and trainers never take experience older than ``max_staleness`` versions.

It survives the death of any process (the config's ``restart:`` section restarts each in place): every stage
takes its input with ``ack=False`` and acknowledges it with what it made, so a dead stage's items go back to
its queue; a restarted producer gets its call again; a restarted trainer rank is re-seeded from a live peer
(weights, optimizer, history; trainer.py) in a collective formed anew (resilience.py). With ``--snapshots DIR``
the driver snapshots every ``snapshot_every`` steps, and ``--resume DIR`` continues a run whose driver died.

    hwplace run examples/rl-grpo/grpo.yaml --nodes 1x4
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from typing import Any

import policy as rl  # beside this file
import task
import torch
from environment import Env, Robot
from report import Progress, ledger, print_summary, summarize
from resilience import Producers, Trainers
from trainer import Trainer

import hwplace


class Rollout(hwplace.Worker):
    """Samples a group of answers per prompt with the latest policy version it has applied."""

    def __init__(self, settings: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        self.settings = settings
        self.task = task.task_of(settings)
        self.group = settings["group_size"]
        self.batch = settings["prompts_per_batch"]
        self.policy: rl.Policy | None = rl.Policy(self.task.max_len)
        self.stash: dict[str, torch.Tensor] | None = None
        self.version = 0
        self.applied: list[int] = []
        self.turns: list[tuple[float, float]] = []
        self.swaps = 0
        self.attempt = 0

    def on_restart(self, info: hwplace.RestartInfo) -> None:
        self.attempt = info.attempt

    def offload(self) -> None:  # a trainer waits for this accelerator: move the policy to the stash
        assert self.policy is not None
        self.stash = {k: v.clone() for k, v in self.policy.state_dict().items()}
        self.policy = None
        self.swaps += 1

    def onload(self) -> None:  # back from the stash after the trainer's turn
        assert self.stash is not None
        self.policy = rl.Policy(self.task.max_len)
        self.policy.load_state_dict(self.stash)
        self.stash = None

    def generate(self, sync: hwplace.WeightSync, channel: hwplace.Channel, seed: int, offset: int) -> dict[str, Any]:
        """Until the channel closes; ``offset`` turns the sync's version numbers into the run's (a resumed run's
        sync counts from 1 again)."""
        generator = torch.Generator().manual_seed(seed * 1000 + self.rank * 100 + self.attempt)
        # This rank's share of what the trainers take per version, with a margin: once it has made that much
        # with one version, it waits for the next rather than make experience the trainers would discard.
        share = 1.2 * self.settings["tokens_per_rank"] * self.settings["trainer_ranks"] / self.world_size
        made = made_tokens = 0
        busy = sync_seconds = 0.0
        try:
            while True:
                if made_tokens >= share:
                    # if none comes, the trainers want more of this version than the share: go on
                    with contextlib.suppress(TimeoutError):
                        sync.latest(min_version=self.version + 1, timeout=2.0)
                batch = [channel.get("prompts", timeout=60, ack=False)]  # held until its answers are in
                batch += take_waiting(channel, self.batch - 1)
                with self.turn():  # colocated with a trainer rank: hwplace calls offload/onload around turns
                    entered = time.monotonic()
                    weights = sync.latest(min_version=max(self.version, 1), timeout=60)
                    if weights.version > self.version:  # apply the new version before this batch
                        start = time.perf_counter()
                        assert self.policy is not None
                        self.policy.load_state_dict({k: torch.as_tensor(v) for k, v in weights.tensors.items()})
                        self.version = weights.version
                        self.applied.append(weights.version + offset)
                        made_tokens = 0
                        sync_seconds += time.perf_counter() - start
                    assert self.policy is not None
                    repeated = [p["prompt"] for p in batch for _ in range(self.group)]
                    sampled, logps = rl.sample(self.policy, repeated, generator)
                    made_at = time.monotonic()
                    self.turns.append((entered, time.monotonic()))
                busy += self.turns[-1][1] - entered
                for i, prompt in enumerate(batch):
                    part = slice(i * self.group, (i + 1) * self.group)
                    channel.put({"id": prompt["id"], "prompt": prompt["prompt"], "answers": sampled[part],
                                 "logps": logps[part], "version": self.version + offset, "rollout": self.rank,
                                 "attempt": self.attempt, "made": made_at},
                                queue_name="answers", ack=prompt)
                    made_tokens += sum(len(prompt["prompt"]) + len(a) for a in sampled[part])
                    made += 1
        except hwplace.ChannelClosed:
            return {"groups": made, "busy": busy, "sync_seconds": sync_seconds, "applied": self.applied,
                    "turns": self.turns, "swaps": self.swaps, "accelerators": os.environ.get("FAKE_VISIBLE_DEVICES")}


def take_waiting(channel: hwplace.Channel, most: int) -> list[Any]:
    """Up to ``most`` prompts that are already in ``channel``, without waiting, held like the first; another rank
    may take the last one first, so an empty queue ends the batch (checking ``empty()`` first would race)."""
    taken: list[Any] = []
    with contextlib.suppress(hwplace.ChannelEmpty):
        while len(taken) < most:
            taken.append(channel.get_nowait("prompts", ack=False))
    return taken


DEFAULTS: dict[str, Any] = {
    "steps": 300, "tasks": ["sort", "reverse"], "min_digits": 3, "max_digits": 5, "group_size": 8,
    "prompts_per_batch": 4, "tokens_per_rank": 700, "demo_tokens_per_rank": 20, "micro_batches": 2,
    "learning_rate": 3e-3, "rl_weight": 1.0, "demo_weight": 0.5, "max_staleness": 0, "eval_every": 25,
    "eval_prompts": 200, "seed": 0, "snapshot_every": 10, "prompts_in_flight": 64,
}


class Cursor:
    """The job's data cursor, on the driver: hands out prompt numbers in order (the ``cursor`` queue, which the
    environments turn into prompts), keeping at most ``window`` of them in the pipeline and not yet trained on.
    Snapshotted with the driver's state, so a resumed run hands out what its killed one had not."""

    def __init__(self, channel: hwplace.Channel, window: int, handed: int = 0) -> None:
        self.channel, self.window, self.handed, self.trained = channel, window, handed, 0

    def feed(self) -> None:
        with contextlib.suppress(hwplace.ChannelFull):
            while self.handed - self.trained < self.window:
                self.channel.put_nowait({"n": self.handed}, queue_name="cursor")
                self.handed += 1


def main(job: hwplace.Job) -> dict[str, Any]:
    settings = vars(job.settings(**DEFAULTS))
    settings["trainer_ranks"] = job.placement.get_world_size("trainer")
    started = time.perf_counter()
    before: dict[str, Any] = job.resumed.state if job.resumed else {
        "run": uuid.uuid4().hex[:8], "epoch": -1, "handed": 0, "steps": [], "curve": [], "restarts": []}
    epoch = before["epoch"] + 1  # one per resume
    # The pipeline's queues are one channel (a snapshot is one consistent cut per channel), without a bound: the
    # cursor's window bounds what is in it. Its name is the run's, so that a resumed run gets its items back,
    # and one process can run the job twice. The robots' demonstrations are a channel of their own.
    channel = job.channel(f"grpo-{before['run']}")
    demos = job.channel(f"demos-{before['run']}", maxsize=32)
    env = job.launch(Env, "env", settings)
    robot = job.launch(Robot, "robot", settings)
    trainer = job.launch(Trainer, "trainer", settings)
    rollout = job.launch(Rollout, "rollout", settings)
    sync = hwplace.WeightSync.create("policy", source="trainer", targets=("rollout",), source_rank=0)
    [(_, offset), *_] = trainer.attach(sync).wait(timeout=120)
    launched = time.perf_counter()

    steps: list[list[dict[str, Any]]] = before["steps"]
    curve: list[tuple[int, float]] = before["curve"]
    cursor = Cursor(channel, settings["prompts_in_flight"], before["handed"])
    cursor.trained = steps[-1][0]["trained"] if steps else 0
    producers = Producers(feed=cursor.feed)
    producers.start("env", env, "serve", channel, settings["seed"])
    producers.start("rollout", rollout, "generate", sync, channel, settings["seed"], offset)
    producers.start("robot", robot, "record", demos, settings["seed"], epoch)
    trainers = Trainers(trainer)
    progress = Progress(settings["steps"], "training")
    done = steps[-1][0]["step"] if steps else 0
    snapshotted = done
    while done < settings["steps"]:
        ranks = trainers.step(producers, lambda rank: rank.step(channel, demos),
                              lambda rank, generation, kept: rank.reform(sync, generation, kept))
        steps.append(ranks)
        done, cursor.trained = ranks[0]["step"], ranks[0]["trained"]
        if "exact_match" in ranks[0]:
            curve.append((done, ranks[0]["exact_match"]))
        reward = sum(r for rank in ranks for r in rank["reward"]) / max(1, sum(len(rank["reward"]) for rank in ranks))
        progress.update(done, f"reward {reward:.2f}" + (f"  exact match {curve[-1][1]:.2f}" if curve else ""))
        if done - snapshotted >= settings["snapshot_every"] or done >= settings["steps"]:
            restarts = before["restarts"] + producers.restarts + trainers.restarts
            job.snapshot(done, {**before, "epoch": epoch, "handed": cursor.handed, "steps": steps, "curve": curve,
                                "restarts": restarts})
            snapshotted = done
    trained = time.perf_counter()
    reports = trainer.report().wait(timeout=60)
    left = hwplace.export_channel(channel)  # what is still in the pipeline, in one consistent cut
    for made in (channel, demos):
        made.close()
    produced = producers.finish(timeout=60)
    summary = summarize(settings, steps, curve, produced, reports, sync, reports[0]["reposed"],
                        launch=launched - started, training=trained - launched)
    summary["resilience"] = {"restarts": before["restarts"] + producers.restarts + trainers.restarts,
                             "resumes": epoch, **ledger(reports[0], left, cursor.handed),
                             "published": [[ranks[0]["published_at"], ranks[0]["version"]] for ranks in steps]}
    print_summary(summary, file=sys.stdout)
    return summary
