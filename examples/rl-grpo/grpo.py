"""GRPO on hwplace: a small transformer learns to sort and reverse digits, from scratch, on fake accelerators.

Environment workers (plain nodes) pose prompts made in code and score answers with a rule; rollout workers
(accelerators) sample a group of answers per prompt with the CURRENT policy; robot workers (one per robot)
record scripted demonstrations; data-parallel trainer ranks take token-weighted batches (``get_batch``),
split them evenly (``balanced_split``), compute GRPO's group-relative loss plus the demonstrations' term,
average gradients with gloo, check that every rank's weights are identical, and publish the weights every
step through ``hwplace.WeightSync``. Rollouts apply each new version before their next batch; experience
carries the version that made it, and trainers never take experience older than ``max_staleness`` versions.

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

import hwplace

POLL = 0.25  # seconds between looks at the producers while a training step runs


def task_of(settings: dict[str, Any]) -> rl.Task:
    return rl.Task(tuple(settings["tasks"]), settings["min_digits"], settings["max_digits"])


class Env(hwplace.Worker):
    """Poses prompts, and scores the rollouts' answers with the rule into group-relative advantages."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.task = task_of(settings)
        self.group = settings["group_size"]

    def serve(self, prompts: hwplace.Channel, answers: hwplace.Channel, experience: hwplace.Channel,
              seed: int) -> dict[str, Any]:
        rng = random.Random(f"env-{seed}-{self.rank}")
        made = scored = 0
        busy = 0.0
        try:
            while True:
                try:  # keep the rollouts fed...
                    while True:
                        prompts.put_nowait(rl.make_prompt(rng, self.task))
                        made += 1
                except hwplace.ChannelFull:
                    pass
                try:  # ...and score what comes back
                    item = answers.get(timeout=0.05)
                except hwplace.ChannelTimeout:
                    continue
                start = time.perf_counter()
                rewards = [rl.reward(item["prompt"], a) for a in item["answers"]]
                group = {**item, "rewards": rewards, "advantages": rl.group_advantages(rewards, self.group),
                         "tokens": sum(len(item["prompt"]) + len(a) for a in item["answers"])}
                busy += time.perf_counter() - start
                experience.put(group, weight=group["tokens"], version=item["version"])
                scored += 1
        except hwplace.ChannelClosed:  # the driver closes the channels when training is done
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

    def generate(self, sync: hwplace.WeightSync, prompts: hwplace.Channel, answers: hwplace.Channel,
                 seed: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(seed * 1000 + self.rank)
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
                batch = [prompts.get(timeout=60)]
                batch += take_waiting(prompts, self.batch - 1)
                with self.turn():  # colocated with a trainer rank: hwplace calls offload/onload around turns
                    entered = time.monotonic()
                    weights = sync.latest(min_version=max(self.version, 1), timeout=60)
                    if weights.version > self.version:  # apply the new version before this batch
                        start = time.perf_counter()
                        assert self.policy is not None
                        self.policy.load_state_dict({k: torch.as_tensor(v) for k, v in weights.tensors.items()})
                        self.version = weights.version
                        self.applied.append(weights.version)
                        made_tokens = 0
                        sync_seconds += time.perf_counter() - start
                    assert self.policy is not None
                    repeated = [p for p in batch for _ in range(self.group)]
                    sampled, logps = rl.sample(self.policy, repeated, generator)
                    self.turns.append((entered, time.monotonic()))
                busy += self.turns[-1][1] - entered
                for i, prompt in enumerate(batch):
                    part = slice(i * self.group, (i + 1) * self.group)
                    answers.put({"prompt": prompt, "answers": sampled[part], "logps": logps[part],
                                 "version": self.version})
                    made_tokens += sum(len(prompt) + len(a) for a in sampled[part])
                    made += 1
        except hwplace.ChannelClosed:
            return {"groups": made, "busy": busy, "sync_seconds": sync_seconds, "applied": self.applied,
                    "turns": self.turns, "swaps": self.swaps, "accelerators": os.environ.get("FAKE_VISIBLE_DEVICES")}


class Robot(hwplace.Worker):
    """Drives its own robot (the fake backend names it in FAKE_ROBOTS) through scripted demonstrations."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.task = task_of(settings)

    def record(self, demos: hwplace.Channel, seed: int) -> dict[str, Any]:
        robot = os.environ["FAKE_ROBOTS"]  # this process's robot, and no other
        rng = random.Random(f"robot-{seed}-{robot}")
        made = 0
        busy = 0.0
        try:
            while True:
                start = time.perf_counter()
                prompt = rl.make_prompt(rng, self.task)
                answer = rl.solve(prompt)
                time.sleep(0.002 * len(answer))  # a robot moves in real time
                busy += time.perf_counter() - start
                demos.put({"prompt": prompt, "answer": answer}, weight=len(prompt) + len(answer))
                made += 1
        except hwplace.ChannelClosed:
            return {"demos": made, "busy": busy, "robot": robot}


class Trainer(hwplace.Worker):
    """One data-parallel rank: GRPO on token-weighted batches, gloo all_reduce, a weight publish per step."""

    def __init__(self, settings: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        dist.init_process_group("gloo")  # hwplace set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
        self.settings = settings
        self.task = task_of(settings)
        torch.manual_seed(settings["seed"] + self.rank)  # different on purpose: the broadcast makes them alike
        self.policy = rl.Policy(self.task.max_len)
        self.params = list(self.policy.parameters())
        with hwplace.span("broadcast"):  # a wait on the timeline (hwplace run --trace): blocked on rank 0
            for param in self.params:
                dist.broadcast(param.data, src=0)
        self.optimizer = torch.optim.Adam(self.params, lr=settings["learning_rate"])
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.params)
        self.stash: dict[str, Any] | None = None
        self.turns: list[tuple[float, float]] = []
        self.swaps = 0
        self.held_out = rl.held_out(self.task, settings["eval_prompts"])
        self.sync: hwplace.WeightSync | None = None
        self.version = 0

    def attach(self, sync: hwplace.WeightSync) -> int:
        """Take the weight sync (made once both groups run) and publish the initial weights: version 1."""
        self.sync = sync
        self.version = sync.publish(self.policy.state_dict()) if self.rank == 0 else 1
        return self.version

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

    def step(self, experience: hwplace.Channel, demos: hwplace.Channel, step: int) -> dict[str, Any]:
        s = self.settings
        times: dict[str, float] = {}
        start = time.perf_counter()
        oldest = max(1, self.version - s["max_staleness"])
        batch = experience.get_batch(s["tokens_per_rank"], min_version=oldest, timeout=120)
        shown = demos.get_batch(s["demo_tokens_per_rank"], timeout=120) if s["demo_tokens_per_rank"] else []
        times["wait for batch"] = time.perf_counter() - start

        with self.turn():  # colocated with a rollout rank: hwplace calls offload/onload around turns
            entered = time.monotonic()
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
            grads = torch.cat([p.grad.flatten() for p in self.params])
            with hwplace.span("all_reduce", op="sum"):  # a wait on the timeline: blocked on the other ranks
                dist.all_reduce(grads)  # sum over ranks, then the mean
            grads /= self.world_size
            offset = 0
            for p in self.params:
                p.grad.copy_(grads[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            times["all_reduce"] = time.perf_counter() - start

            start = time.perf_counter()
            self.optimizer.step()
            weights = torch.cat([p.detach().flatten() for p in self.params])
            low, high = weights.clone(), weights.clone()
            with hwplace.span("all_reduce", op="min, max"):
                dist.all_reduce(low, op=dist.ReduceOp.MIN)
                dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if not torch.equal(low, high):
                raise RuntimeError(f"after step {step} the ranks' weights differ by up to "
                                   f"{(high - low).abs().max().item():.3g}")
            times["optimizer and check"] = time.perf_counter() - start

            start = time.perf_counter()
            self.version += 1
            if self.rank == 0 and self.sync is not None:
                published = self.sync.publish(self.policy.state_dict())
                if published != self.version:
                    raise RuntimeError(f"published version {published}, expected {self.version}")
            times["publish weights"] = time.perf_counter() - start
            result: dict[str, Any] = {"tokens": sum(g["tokens"] for g in batch), "groups": len(batch),
                                      "losses": losses, "times": times, "version": self.version,
                                      "staleness": [self.version - 1 - g["version"] for g in batch],
                                      "reward": [sum(g["rewards"]) / len(g["rewards"]) for g in batch],
                                      "demo_tokens": demo_tokens}
            if self.rank == 0 and (step % s["eval_every"] == 0 or step == s["steps"]):
                result["exact_match"] = rl.exact_match(self.policy, self.held_out)
            self.turns.append((entered, time.monotonic()))
        return result

    def report(self) -> dict[str, Any]:
        return {"turns": self.turns, "swaps": self.swaps, "accelerators": os.environ.get("FAKE_VISIBLE_DEVICES"),
                "weight_bytes": self.weight_bytes}


def take_waiting(channel: hwplace.Channel, most: int) -> list[Any]:
    """Up to ``most`` items that are already in ``channel``, without waiting; another rank may take the last
    one first, so an empty queue ends the batch (checking ``empty()`` first would race with it)."""
    taken: list[Any] = []
    with contextlib.suppress(hwplace.ChannelEmpty):
        while len(taken) < most:
            taken.append(channel.get_nowait())
    return taken


def wait_watching(handle: hwplace.Handle, producers: dict[str, hwplace.Handle]) -> list[Any]:
    """``handle``'s results; a producer that fails first raises its ``WorkerError`` at once."""
    while True:
        for name, producer in producers.items():
            try:
                producer.wait(timeout=0)  # raises the WorkerError of any rank that raised or died
            except TimeoutError:
                continue  # still producing: producers run until the channels close
            raise RuntimeError(f"the {name} workers stopped producing before training was done")
        try:
            return handle.wait(timeout=POLL)
        except TimeoutError:
            pass
        except hwplace.WorkerError as failed:
            if isinstance(failed.__cause__, hwplace.WeightSyncError):  # a rollout it syncs to may have died
                raise_root_cause(failed, producers)
            raise


def raise_root_cause(failed: hwplace.WorkerError, producers: dict[str, hwplace.Handle], grace: float = 10.0) -> None:
    """Raise the ``WorkerError`` of a producer that failed too (the root cause of ``failed``), waiting up to
    ``grace`` s for its executor to notice; return when none did."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        for producer in producers.values():
            try:
                producer.wait(timeout=0)
            except TimeoutError:
                continue
            except hwplace.WorkerError as cause:
                raise cause from failed
        time.sleep(0.1)


DEFAULTS: dict[str, Any] = {
    "steps": 300, "tasks": ["sort", "reverse"], "min_digits": 3, "max_digits": 5, "group_size": 8,
    "prompts_per_batch": 4, "tokens_per_rank": 700, "demo_tokens_per_rank": 20, "micro_batches": 2,
    "learning_rate": 3e-3, "rl_weight": 1.0, "demo_weight": 0.5, "max_staleness": 0, "eval_every": 25,
    "eval_prompts": 200, "seed": 0,
}


def main(job: hwplace.Job) -> dict[str, Any]:
    settings = vars(job.settings(**DEFAULTS))
    settings["trainer_ranks"] = job.placement.get_world_size("trainer")
    started = time.perf_counter()
    run = uuid.uuid4().hex[:8]  # channel names are unique per run, so one process can run the job twice
    prompts = hwplace.Channel.create(f"prompts-{run}", maxsize=16)
    answers = hwplace.Channel.create(f"answers-{run}", maxsize=16)
    experience = hwplace.Channel.create(f"experience-{run}", maxsize=64)
    demos = hwplace.Channel.create(f"demos-{run}", maxsize=32)
    env = job.launch(Env, "env", settings)
    robot = job.launch(Robot, "robot", settings)
    trainer = job.launch(Trainer, "trainer", settings)
    rollout = job.launch(Rollout, "rollout", settings)
    sync = hwplace.WeightSync.create("policy", source="trainer", targets=("rollout",), source_rank=0)
    trainer.attach(sync).wait(timeout=120)
    launched = time.perf_counter()

    producers = {"env": env.serve(prompts, answers, experience, settings["seed"]),
                 "rollout": rollout.generate(sync, prompts, answers, settings["seed"]),
                 "robot": robot.record(demos, settings["seed"])}
    progress = Progress(settings["steps"], "training")
    steps: list[list[dict[str, Any]]] = []
    curve: list[tuple[int, float]] = []
    for step in range(1, settings["steps"] + 1):
        ranks = wait_watching(trainer.step(experience, demos, step), producers)
        steps.append(ranks)
        if "exact_match" in ranks[0]:
            curve.append((step, ranks[0]["exact_match"]))
        reward = sum(r for rank in ranks for r in rank["reward"]) / max(1, sum(len(rank["reward"]) for rank in ranks))
        progress.update(step, f"reward {reward:.2f}" + (f"  exact match {curve[-1][1]:.2f}" if curve else ""))
    trained = time.perf_counter()
    stale = experience.stats().stale  # before the channels close
    for channel in (prompts, answers, experience, demos):
        channel.close()
    produced = {name: handle.wait(timeout=60) for name, handle in producers.items()}
    trainers = trainer.report().wait(timeout=60)
    summary = summarize(settings, steps, curve, produced, trainers, sync, stale,
                        launch=launched - started, training=trained - launched)
    print_summary(summary, file=sys.stdout)
    return summary
