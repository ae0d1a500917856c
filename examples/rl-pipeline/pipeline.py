"""A small RL pipeline on hwplace, end to end.

Environment processes (plain nodes) pose tasks; rollout generators (accelerators) turn them into trajectories
of very different lengths; robot processes (one per robot) record demonstrations. Both kinds of trajectory go
into one channel, weighted by length. Data-parallel trainer ranks each take a batch of a fixed number of tokens
(``get_batch``), split it into micro-batches of even size (``balanced_split``), train a small torch policy,
average the gradients with gloo ``all_reduce`` and check that every rank's weights stay identical.

    hwplace run examples/rl-pipeline/pipeline.yaml --nodes 1x4
"""

from __future__ import annotations

import collections
import os
import random
import sys
import time
import uuid
from typing import Any

import hwplace

VOCAB = 64  # token ids; a trajectory's next token is its last plus 1, 2 or 3: a pattern the policy can learn
DECODE_RATE = 40_000  # tokens a second a (fake) accelerator generates: rollouts sleep for it, not run a model
POLL = 0.25  # seconds between looks at the producers while a training step runs


def continue_sequence(rng: random.Random, start: list[int], length: int) -> list[int]:
    tokens = list(start)
    for _ in range(length):
        tokens.append((tokens[-1] + rng.choice((1, 2, 3))) % VOCAB)
    return tokens


class Env(hwplace.Worker):
    """An environment on a plain node: poses tasks (a prompt and how long the answer will be)."""

    def serve(self, tasks: hwplace.Channel, seed: int) -> dict[str, Any]:
        rng = random.Random(f"env-{seed}-{self.rank}")
        made, busy = 0, 0.0
        while True:
            start = time.perf_counter()
            task = {"prompt": [rng.randrange(VOCAB)], "length": min(int(16 * rng.paretovariate(1.2)), 480)}
            busy += time.perf_counter() - start
            try:
                tasks.put(task)
            except hwplace.ChannelClosed:  # the driver closes the channels when training is done
                return {"tasks": made, "busy": busy}
            made += 1


class Rollout(hwplace.Worker):
    """A generator on its own accelerators: answers tasks with trajectories, weighted by their length."""

    def generate(self, tasks: hwplace.Channel, trajectories: hwplace.Channel, seed: int) -> dict[str, Any]:
        rng = random.Random(f"rollout-{seed}-{self.rank}")
        made, busy = 0, 0.0
        try:
            while True:
                task = tasks.get()
                start = time.perf_counter()
                tokens = continue_sequence(rng, task["prompt"], task["length"])
                time.sleep(len(tokens) / DECODE_RATE)
                trajectory = {"tokens": tokens, "reward": 1.0, "source": "rollout"}
                busy += time.perf_counter() - start
                trajectories.put(trajectory, weight=len(tokens))
                made += 1
        except hwplace.ChannelClosed:
            return {"trajectories": made, "busy": busy, "accelerators": os.environ.get("FAKE_VISIBLE_DEVICES")}


class Robot(hwplace.Worker):
    """Drives its own robot (the fake backend names it in FAKE_ROBOTS) and records demonstrations."""

    def record(self, trajectories: hwplace.Channel, seed: int) -> dict[str, Any]:
        robot = os.environ["FAKE_ROBOTS"]  # this process's robot, and no other
        rng = random.Random(f"robot-{seed}-{robot}")
        made, busy = 0, 0.0
        try:
            while True:
                start = time.perf_counter()
                length = rng.randint(24, 96)
                time.sleep(length / 2000)  # a robot moves in real time
                tokens = continue_sequence(rng, [rng.randrange(VOCAB)], length)
                busy += time.perf_counter() - start
                trajectories.put({"tokens": tokens, "reward": 2.0, "source": "robot"}, weight=len(tokens))
                made += 1
        except hwplace.ChannelClosed:
            return {"trajectories": made, "busy": busy, "robot": robot}


class Trainer(hwplace.Worker):
    """One data-parallel rank of a small next-token policy, trained with reward-weighted cross-entropy."""

    def __init__(self, seed: int, micro_batches: int, learning_rate: float) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo")  # hwplace set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
        torch.manual_seed(seed + self.rank)  # different on purpose: the broadcast makes every rank start alike
        self.model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), torch.nn.Linear(64, VOCAB))
        self.params = list(self.model.parameters())
        for param in self.params:
            dist.broadcast(param.data, src=0)
        self.optimizer = torch.optim.SGD(self.params, lr=learning_rate)
        self.micro_batches = micro_batches
        self.steps = 0

    def step(self, trajectories: hwplace.Channel, tokens: int) -> dict[str, Any]:
        torch, dist = self.torch, self.dist
        times = {}
        start = time.perf_counter()
        batch = trajectories.get_batch(tokens)  # at least `tokens` tokens, less than that plus one trajectory
        times["wait for batch"] = time.perf_counter() - start

        start = time.perf_counter()
        self.optimizer.zero_grad()
        targets_in_batch = sum(len(t["tokens"]) - 1 for t in batch)
        loss_sum = 0.0
        for part in hwplace.balanced_split(batch, self.micro_batches, weight=lambda t: len(t["tokens"])):
            if not part:
                continue
            inputs = torch.tensor([x for t in part for x in t["tokens"][:-1]])
            targets = torch.tensor([x for t in part for x in t["tokens"][1:]])
            rewards = torch.tensor([t["reward"] for t in part for _ in t["tokens"][1:]])
            losses = torch.nn.functional.cross_entropy(self.model(inputs), targets, reduction="none")
            loss = (rewards * losses).sum() / targets_in_batch
            loss.backward()
            loss_sum += loss.item()
        times["forward and backward"] = time.perf_counter() - start

        start = time.perf_counter()
        grads = torch.cat([p.grad.flatten() for p in self.params])
        dist.all_reduce(grads)  # sum over ranks, then the mean
        grads /= self.world_size
        offset = 0
        for p in self.params:
            p.grad.copy_(grads[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        times["all_reduce"] = time.perf_counter() - start

        start = time.perf_counter()
        self.optimizer.step()
        self.steps += 1
        weights = torch.cat([p.detach().flatten() for p in self.params])
        low, high = weights.clone(), weights.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if not torch.equal(low, high):
            raise RuntimeError(f"after step {self.steps} the ranks' weights differ by up to "
                               f"{(high - low).abs().max().item():.3g}")
        times["optimizer and check"] = time.perf_counter() - start
        return {"lengths": [len(t["tokens"]) for t in batch], "sources": [t["source"] for t in batch],
                "loss": loss_sum, "times": times}


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


def main(job: hwplace.Job) -> dict[str, Any]:
    settings = job.settings(steps=40, tokens_per_rank=2048, micro_batches=2, learning_rate=1.0, seed=0)
    started = time.perf_counter()
    run = uuid.uuid4().hex[:8]  # channel names are unique per run, so one process can run the job twice
    tasks = hwplace.Channel.create(f"tasks-{run}", maxsize=32)
    trajectories = hwplace.Channel.create(f"trajectories-{run}", maxsize=64)
    env = job.launch(Env, "env")
    rollout = job.launch(Rollout, "rollout")
    robot = job.launch(Robot, "robot")
    trainer = job.launch(Trainer, "trainer", settings.seed, settings.micro_batches, settings.learning_rate)
    launched = time.perf_counter()

    producers = {"env": env.serve(tasks, settings.seed),
                 "rollout": rollout.generate(tasks, trajectories, settings.seed),
                 "robot": robot.record(trajectories, settings.seed)}
    progress = Progress(settings.steps, "training")
    steps = []
    tokens = 0
    for step in range(settings.steps):
        ranks = wait_watching(trainer.step(trajectories, settings.tokens_per_rank), producers)
        steps.append(ranks)
        tokens += sum(sum(r["lengths"]) for r in ranks)
        elapsed = time.perf_counter() - launched
        progress.update(step + 1, f"loss {sum(r['loss'] for r in ranks) / len(ranks):.3f}  "
                                  f"{tokens / elapsed:,.0f} tokens/s")
    trained = time.perf_counter()
    tasks.close()
    trajectories.close()
    produced = {name: handle.wait(timeout=60) for name, handle in producers.items()}
    summary = summarize(steps, produced, launch=launched - started, training=trained - launched)
    print_summary(summary)
    return summary


def summarize(steps: list[list[dict[str, Any]]], produced: dict[str, list[dict[str, Any]]], *, launch: float,
              training: float) -> dict[str, Any]:
    """What the run did, from every trainer rank's step results and every producer's final report."""
    world = len(steps[0])
    rank_tokens = [sum(sum(step[r]["lengths"]) for step in steps) for r in range(world)]
    sources = collections.Counter(s for step in steps for rank in step for s in rank["sources"])
    per_step = [hwplace.imbalance([sum(rank["lengths"]) for rank in step]) for step in steps]
    equal_counts = []  # the same items dealt out in equal numbers, for comparison
    for step in steps:
        items = [length for rank in step for length in rank["lengths"]]
        equal_counts.append(hwplace.imbalance([sum(items[r::world]) for r in range(world)]))
    stages: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for name, reports in produced.items():
        stages[(name, {"env": "make tasks", "rollout": "generate", "robot": "record demos"}[name])] = \
            [report["busy"] for report in reports]
    for r in range(world):
        for stage in steps[0][r]["times"]:
            stages.setdefault(("trainer", stage), [0.0] * world)[r] += sum(step[r]["times"][stage] for step in steps)
    return {
        "steps": len(steps), "trajectories": sum(sources.values()), "sources": dict(sources),
        "tokens": sum(rank_tokens), "rank_tokens": rank_tokens, "launch_seconds": launch,
        "training_seconds": training, "imbalance": hwplace.imbalance(rank_tokens),
        "worst_step_imbalance": max(per_step), "equal_counts_imbalance": sum(equal_counts) / len(equal_counts),
        "loss_first": sum(r["loss"] for r in steps[0]) / world, "loss_last": sum(r["loss"] for r in steps[-1]) / world,
        "robots": [report["robot"] for report in produced["robot"]],
        "stages": {f"{component}: {stage}": sum(seconds) / len(seconds) for (component, stage), seconds in
                   stages.items()},
    }


def print_summary(s: dict[str, Any]) -> None:
    rate = s["tokens"] / s["training_seconds"]
    print(f"summary: {s['steps']} training steps in {s['training_seconds']:.1f} s "
          f"(workers launched in {s['launch_seconds']:.1f} s)")
    print(f"  items:   {s['trajectories']} trajectories ({s['sources'].get('rollout', 0)} from rollouts, "
          f"{s['sources'].get('robot', 0)} from robots {', '.join(s['robots'])}), {s['tokens']:,} tokens, "
          f"{rate:,.0f} tokens/s")
    print("  balance: tokens per trainer rank " + ", ".join(f"{t:,}" for t in s["rank_tokens"]) +
          f"; imbalance {s['imbalance']:.3f} (worst step {s['worst_step_imbalance']:.3f}; equal counts per rank "
          f"would average {s['equal_counts_imbalance']:.3f} per step)")
    print(f"  weights: identical on every trainer rank after each step; loss {s['loss_first']:.3f} -> "
          f"{s['loss_last']:.3f}")
    print("  time per stage, seconds per process:")
    width = max(map(len, s["stages"]))
    for stage, seconds in s["stages"].items():
        print(f"    {stage:<{width}}  {seconds:7.2f}")
