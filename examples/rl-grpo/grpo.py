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
(weights, optimizer, history) in a collective formed anew (resilience.py). With ``--snapshots DIR`` the driver
snapshots every ``snapshot_every`` steps, and ``--resume DIR`` continues a run whose driver died.

    hwplace run examples/rl-grpo/grpo.yaml --nodes 1x4
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
import uuid
from typing import Any

import policy as rl  # beside this file
import torch
import torch.distributed as dist
from report import Progress, print_summary, summarize
from resilience import Collective, Producers, Trainers

import hwplace


def task_of(settings: dict[str, Any]) -> rl.Task:
    return rl.Task(tuple(settings["tasks"]), settings["min_digits"], settings["max_digits"])


class Env(hwplace.Worker):
    """Poses prompts, and scores the rollouts' answers with the rule into group-relative advantages."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.task = task_of(settings)
        self.group = settings["group_size"]
        self.attempt = 0

    def on_restart(self, info: hwplace.RestartInfo) -> None:
        self.attempt = info.attempt

    def serve(self, channel: hwplace.Channel, seed: int, epoch: int) -> dict[str, Any]:
        # Every prompt has an id of its own: this run's epoch (one per resume), rank, process and count.
        source = f"{epoch}.{self.rank}.{self.attempt}"
        rng = random.Random(f"env-{seed}-{source}")
        made = scored = 0
        busy = 0.0
        try:
            while True:
                try:  # keep the rollouts fed...
                    while True:
                        channel.put_nowait({"id": f"{source}.{made}", "prompt": rl.make_prompt(rng, self.task)},
                                           queue_name="prompts")
                        made += 1
                except hwplace.ChannelFull:
                    pass
                try:  # ...and score what comes back: held until the scored group is in (put with ack=)
                    item = channel.get("answers", timeout=0.05, ack=False)
                except hwplace.ChannelTimeout:
                    continue
                start = time.perf_counter()
                rewards = [rl.reward(item["prompt"], a) for a in item["answers"]]
                group = {**item, "rewards": rewards, "advantages": rl.group_advantages(rewards, self.group),
                         "tokens": sum(len(item["prompt"]) + len(a) for a in item["answers"])}
                busy += time.perf_counter() - start
                channel.put(group, weight=group["tokens"], queue_name="experience", version=item["version"],
                            ack=item)
                scored += 1
        except hwplace.ChannelClosed:  # the driver closes the channel when training is done
            return {"prompts": made, "scored": scored, "busy": busy}


class Rollout(hwplace.Worker):
    """Samples a group of answers per prompt with the latest policy version it has applied."""

    def __init__(self, settings: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        self.settings = settings
        self.task = task_of(settings)
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


class Robot(hwplace.Worker):
    """Drives its own robot (the fake backend names it in FAKE_ROBOTS) through scripted demonstrations."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.task = task_of(settings)
        self.attempt = 0

    def on_restart(self, info: hwplace.RestartInfo) -> None:
        self.attempt = info.attempt

    def record(self, channel: hwplace.Channel, seed: int, epoch: int) -> dict[str, Any]:
        robot = os.environ["FAKE_ROBOTS"]  # this process's robot, and no other
        rng = random.Random(f"robot-{seed}-{robot}-{epoch}-{self.attempt}")
        made = 0
        busy = 0.0
        try:
            while True:
                start = time.perf_counter()
                prompt = rl.make_prompt(rng, self.task)
                answer = rl.solve(prompt)
                time.sleep(0.002 * len(answer))  # a robot moves in real time
                busy += time.perf_counter() - start
                channel.put({"prompt": prompt, "answer": answer}, weight=len(prompt) + len(answer),
                            queue_name="demos")
                made += 1
        except hwplace.ChannelClosed:
            return {"demos": made, "busy": busy, "robot": robot}


class Trainer(hwplace.Worker):
    """One data-parallel rank: GRPO on token-weighted batches, gloo all_reduce, a weight publish per step.

    Its state (``state_dict``) is what a restarted rank is re-seeded with and what a snapshot keeps: the weights,
    the optimizer, the run's version of the weights and the history (the ids of the prompts each step trained on).
    """

    def __init__(self, settings: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        self.settings = settings
        self.task = task_of(settings)
        torch.manual_seed(settings["seed"] + self.rank)  # different on purpose: attach() makes them alike
        self.policy = rl.Policy(self.task.max_len)
        self.params = list(self.policy.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=settings["learning_rate"])
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.params)
        self.collective = Collective(self.rank, self.world_size)
        self.stash: dict[str, Any] | None = None
        self.turns: list[tuple[float, float]] = []
        self.swaps = 0
        self.held_out = rl.held_out(self.task, settings["eval_prompts"])
        self.sync: hwplace.WeightSync | None = None
        self.version = 0  # the run's version of these weights (0: never published)
        self.offset = 0  # the run's version minus the sync's (a resumed run's sync counts from 1 again)
        self.published = -1  # len(history) when rank 0 last published
        self.history: list[list[str]] = []  # per optimizer step, the ids of the prompts every rank trained on
        self.trained: set[str] = set()
        self.pending: list[hwplace.Taken] = []  # taken and not acknowledged yet: a failed step's batch
        self.pending_at = 0  # len(history) when the pending batch was taken
        self.redelivered = 0  # items taken again after a step trained on them: acknowledged, not trained again
        self.discarded: list[str] = []  # ids of the stale experience discarded
        self.firsts: dict[tuple[int, int], tuple[float, int]] = {}  # per rollout process: first item's time, version
        self.fresh = False  # a restarted process, until reform() re-seeds it
        self.channel: hwplace.Channel | None = None  # the one step() takes from

    def on_restart(self, info: hwplace.RestartInfo) -> None:
        self.fresh = True

    def attach(self, sync: hwplace.WeightSync) -> tuple[int, int]:
        """Form the collective, give every rank rank 0's weights (the resumed ones in a resumed run) and publish
        them; the run's version of them and the offset from the sync's numbers."""
        self.sync = sync
        self.collective.form(0)
        with self.turn():
            for param in self.params:
                dist.broadcast(param.data, src=0)
            self._publish(first=True)
        return self.version, self.offset

    def reform(self, sync: hwplace.WeightSync, generation: int) -> None:
        """After a rank died: form the collective anew and give every rank the state of the live rank that got
        furthest (a restarted rank has nothing), then acknowledge what the adopted history already trained on."""
        self.sync = sync
        self.collective.form(generation)
        with self.turn():
            everyone: list[Any] = [None] * self.world_size
            dist.all_gather_object(everyone, (not self.fresh, len(self.history)))
            seed = max(range(self.world_size), key=lambda r: everyone[r])
            if not everyone[seed][0]:
                raise RuntimeError("every trainer rank restarted at once: no live rank to re-seed from (resume the "
                                   "job from a snapshot)")
            state = [self.state_dict() if self.rank == seed else None]
            dist.broadcast_object_list(state, src=seed)
            if self.rank != seed:
                self.load_state_dict(state[0])
            if self.pending and len(self.history) > self.pending_at:  # the step that failed did train on it
                self._acknowledge()
            if self.published != len(self.history):
                self._publish()
        self.fresh = False

    def _publish(self, first: bool = False) -> None:
        """Rank 0 publishes the weights; every rank learns the run's version of them."""
        numbers = torch.zeros(2, dtype=torch.int64)
        if self.rank == 0:
            assert self.sync is not None
            published = self.sync.publish(self.policy.state_dict())
            if first:
                self.offset = self.version - published if self.version else 0
            numbers[:] = torch.tensor([published + self.offset, self.offset])
        dist.broadcast(numbers, src=0)
        self.version, self.offset = int(numbers[0]), int(numbers[1])
        self.published = len(self.history)

    def _acknowledge(self) -> None:
        assert self.channel is not None
        for taken in self.pending:
            self.channel.ack(taken)
        self.pending = []

    def _take(self) -> list[dict[str, Any]]:
        """This step's items, held (``ack=False``) until the step is done and kept across a failed step: enough
        experience that is fresh (not older than ``max_staleness`` versions) and new to the history (an item a
        step trained on comes back when its taker died after the step), then the demonstrations."""
        s = self.settings
        assert self.channel is not None
        if not self.pending:
            self.pending_at = len(self.history)
            weight = 0
            while weight < s["tokens_per_rank"]:
                taken = self.channel.get_batch(s["tokens_per_rank"] - weight, "experience", timeout=120, ack=False)
                self.pending.append(taken)
                weight += sum(g["tokens"] for g in self._sorted(taken)[0])
            if s["demo_tokens_per_rank"]:
                self.pending.append(self.channel.get_batch(s["demo_tokens_per_rank"], "demos", timeout=120,
                                                           ack=False))
        return [item for taken in self.pending for item in taken]

    def _sorted(self, items: list[dict[str, Any]]) -> tuple[list[Any], list[Any], list[Any]]:
        """Experience to train on, stale experience to discard, and experience the history has trained on."""
        oldest = max(1, self.version - self.settings["max_staleness"])
        groups = [g for g in items if "id" in g]
        again = [g for g in groups if g["id"] in self.trained]
        fresh = [g for g in groups if g["id"] not in self.trained and g["version"] >= oldest]
        return fresh, [g for g in groups if g["id"] not in self.trained and g["version"] < oldest], again

    def offload(self) -> None:  # a rollout waits for this accelerator: move the weights to the stash
        self.stash = {"policy": {k: v.clone() for k, v in self.policy.state_dict().items()}}
        for param in self.params:
            param.data = param.data.new_empty(0)  # what a GPU would free
        self.swaps += 1

    def onload(self) -> None:  # back from the stash after the rollout's turn
        assert self.stash is not None
        for param, value in zip(self.params, self.stash["policy"].values(), strict=True):
            param.data = value
        self.stash = None

    def step(self, channel: hwplace.Channel) -> dict[str, Any]:
        s = self.settings
        self.channel = channel
        times: dict[str, float] = {}
        start = time.perf_counter()
        taken = self._take()
        batch, stale, again = self._sorted(taken)
        shown = [item for item in taken if "id" not in item]
        times["wait for batch"] = time.perf_counter() - start

        with self.turn():  # colocated with a rollout rank: hwplace calls offload/onload around turns
            entered = time.monotonic()
            everyone: list[Any] = [None] * self.world_size  # every rank records the whole step:
            dist.all_gather_object(everyone, ([g["id"] for g in batch], [g["id"] for g in stale], len(again),
                                              [(g["rollout"], g["attempt"], g["made"], g["version"])
                                               for g in batch + stale + again]))
            self.optimizer.zero_grad()
            answer_tokens = sum(len(a) for g in batch for a in g["answers"])
            demo_tokens = sum(len(d["answer"]) for d in shown)
            losses = {"grpo": 0.0, "demos": 0.0}
            for part in hwplace.balanced_split(batch, s["micro_batches"], weight=lambda g: g["tokens"]):
                samples = [{"prompt": g["prompt"], "answer": a, "logps": lp, "advantage": adv} for g in part
                           for a, lp, adv in zip(g["answers"], g["logps"], g["advantages"], strict=True)]
                if samples:
                    loss, _ = rl.grpo_loss(self.policy, samples)
                    (loss * s["rl_weight"] / max(answer_tokens, 1)).backward()
                    losses["grpo"] += loss.item() / max(answer_tokens, 1)
            if shown:
                loss, _ = rl.demo_loss(self.policy, shown)
                (loss * s["demo_weight"] / demo_tokens).backward()
                losses["demos"] = loss.item() / demo_tokens
            times["forward and backward"] = time.monotonic() - entered

            start = time.perf_counter()
            grads = torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros_like(p).flatten()
                               for p in self.params])
            dist.all_reduce(grads)  # sum over ranks, then the mean; past this, every rank's batch is in the step
            grads /= self.world_size
            offset = 0
            for p in self.params:
                p.grad = grads[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            times["all_reduce"] = time.perf_counter() - start

            start = time.perf_counter()
            self.optimizer.step()
            ids = sorted(i for rank in everyone for i in rank[0])
            self.history.append(ids)
            self.trained.update(ids)
            self.discarded += sorted(i for rank in everyone for i in rank[1])
            self.redelivered += sum(rank[2] for rank in everyone)
            for process, attempt, made, version in (row for rank in everyone for row in rank[3]):
                if made < self.firsts.get((process, attempt), (made + 1, 0))[0]:
                    self.firsts[process, attempt] = (made, version)
            weights = torch.cat([p.detach().flatten() for p in self.params])
            low, high = weights.clone(), weights.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if not torch.equal(low, high):
                raise RuntimeError(f"after step {len(self.history)} the ranks' weights differ by up to "
                                   f"{(high - low).abs().max().item():.3g}")
            times["optimizer and check"] = time.perf_counter() - start

            start = time.perf_counter()
            self._publish()
            published_at = time.monotonic()
            times["publish weights"] = time.perf_counter() - start
            self._acknowledge()
            step = len(self.history)
            result: dict[str, Any] = {"step": step, "tokens": sum(g["tokens"] for g in batch), "groups": len(batch),
                                      "losses": losses, "times": times, "version": self.version,
                                      "published_at": published_at,
                                      "staleness": [self.version - 1 - g["version"] for g in batch],
                                      "reward": [sum(g["rewards"]) / len(g["rewards"]) for g in batch],
                                      "demo_tokens": demo_tokens}
            if self.rank == 0 and (step % s["eval_every"] == 0 or step == s["steps"]):
                result["exact_match"] = rl.exact_match(self.policy, self.held_out)
            self.turns.append((entered, time.monotonic()))
        return result

    def state_dict(self) -> dict[str, Any]:
        with self.turn():  # the weights are on the accelerator
            return {"policy": {k: v.clone() for k, v in self.policy.state_dict().items()},
                    "optimizer": self.optimizer.state_dict(), "version": self.version, "offset": self.offset,
                    "published": self.published, "history": self.history, "redelivered": self.redelivered,
                    "discarded": self.discarded, "firsts": self.firsts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.turn():
            self.policy.load_state_dict(state["policy"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.offset, self.published = state["version"], state["offset"], state["published"]
        self.history = [list(ids) for ids in state["history"]]
        self.trained = {i for ids in self.history for i in ids}
        self.redelivered, self.discarded = state["redelivered"], list(state["discarded"])
        self.firsts = dict(state["firsts"])

    def report(self) -> dict[str, Any]:
        return {"turns": self.turns, "swaps": self.swaps, "accelerators": os.environ.get("FAKE_VISIBLE_DEVICES"),
                "weight_bytes": self.weight_bytes, "history": self.history, "redelivered": self.redelivered,
                "discarded": self.discarded, "firsts": self.firsts}


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
    "eval_prompts": 200, "seed": 0, "snapshot_every": 10,
}


def main(job: hwplace.Job) -> dict[str, Any]:
    settings = vars(job.settings(**DEFAULTS))
    settings["trainer_ranks"] = job.placement.get_world_size("trainer")
    started = time.perf_counter()
    before: dict[str, Any] = job.resumed.state if job.resumed else {
        "run": uuid.uuid4().hex[:8], "epoch": -1, "steps": [], "curve": [], "restarts": []}
    epoch = before["epoch"] + 1  # one per resume: the ids of new prompts say which
    # one channel for the pipeline's queues (a snapshot is one consistent cut per channel); its name is the
    # run's, so that a resumed run gets its items back, and one process can run the job twice
    channel = job.channel(f"grpo-{before['run']}", maxsize=16)
    env = job.launch(Env, "env", settings)
    robot = job.launch(Robot, "robot", settings)
    trainer = job.launch(Trainer, "trainer", settings)
    rollout = job.launch(Rollout, "rollout", settings)
    sync = hwplace.WeightSync.create("policy", source="trainer", targets=("rollout",), source_rank=0)
    [(_, offset), *_] = trainer.attach(sync).wait(timeout=120)
    launched = time.perf_counter()

    producers = Producers()
    producers.start("env", env, "serve", channel, settings["seed"], epoch)
    producers.start("rollout", rollout, "generate", sync, channel, settings["seed"], offset)
    producers.start("robot", robot, "record", channel, settings["seed"], epoch)
    trainers = Trainers(trainer)
    progress = Progress(settings["steps"], "training")
    steps: list[list[dict[str, Any]]] = before["steps"]
    curve: list[tuple[int, float]] = before["curve"]
    done = steps[-1][0]["step"] if steps else 0
    snapshotted = done
    while done < settings["steps"]:
        ranks = trainers.step(producers, lambda rank: rank.step(channel),
                              lambda rank, generation: rank.reform(sync, generation))
        steps.append(ranks)
        done = ranks[0]["step"]
        if "exact_match" in ranks[0]:
            curve.append((done, ranks[0]["exact_match"]))
        reward = sum(r for rank in ranks for r in rank["reward"]) / max(1, sum(len(rank["reward"]) for rank in ranks))
        progress.update(done, f"reward {reward:.2f}" + (f"  exact match {curve[-1][1]:.2f}" if curve else ""))
        if done - snapshotted >= settings["snapshot_every"] or done >= settings["steps"]:
            restarts = before["restarts"] + producers.restarts + trainers.restarts
            job.snapshot(done, {**before, "epoch": epoch, "steps": steps, "curve": curve, "restarts": restarts})
            snapshotted = done
    trained = time.perf_counter()
    reports = trainer.report().wait(timeout=60)
    left = hwplace.export_channel(channel)  # what is still in the pipeline, in one consistent cut
    channel.close()
    produced = producers.finish(timeout=60)
    summary = summarize(settings, steps, curve, produced, reports, sync, len(reports[0]["discarded"]),
                        launch=launched - started, training=trained - launched)
    summary["resilience"] = {"restarts": before["restarts"] + producers.restarts + trainers.restarts,
                             "resumes": epoch, **ledger(reports[0], left),
                             "published": [[ranks[0]["published_at"], ranks[0]["version"]] for ranks in steps]}
    print_summary(summary, file=sys.stdout)
    return summary


def ledger(trainer: dict[str, Any], left: hwplace.ChannelContents) -> dict[str, Any]:
    """Where every prompt went: trained on (the final model's history), discarded as stale, or still in the
    pipeline at the end. Each env process numbers its prompts from 0, so a number below the highest one seen
    that is nowhere is a prompt lost; one in the history twice was trained on twice."""
    seen: dict[str, int] = {}
    for ids in trainer["history"]:
        for i in ids:
            seen[i] = seen.get(i, 0) + 1
    waiting = {item["id"] for queue in ("prompts", "answers", "experience") for item in left.items(queue)}
    accounted = set(seen) | set(trainer["discarded"]) | waiting
    highest: dict[str, int] = {}
    for i in accounted:
        source, number = i.rsplit(".", 1)
        highest[source] = max(highest.get(source, -1), int(number))
    lost = sum(1 for source, top in highest.items() for n in range(top + 1) if f"{source}.{n}" not in accounted)
    return {"trained": len(seen), "trained_twice": sum(1 for n in seen.values() if n > 1), "lost": lost,
            "discarded": len(trainer["discarded"]), "left": len(waiting), "redelivered": trainer["redelivered"],
            "firsts": [[*key, *value] for key, value in trainer["firsts"].items()]}
