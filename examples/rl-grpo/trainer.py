"""The GRPO example's trainer: one data-parallel rank, whose state a restarted rank is re-seeded with."""

from __future__ import annotations

import os
import time
from typing import Any

import policy as rl  # beside this file
import task
import torch
import torch.distributed as dist
from resilience import Collective

import hwplace


class Trainer(hwplace.Worker):
    """One data-parallel rank: GRPO on token-weighted batches, gloo all_reduce, a weight publish per step.

    Its state (``state_dict``) is what a restarted rank is re-seeded with and what a snapshot keeps: the weights,
    the optimizer, the run's version of the weights and the history (the ids of the prompts each step trained on).
    """

    def __init__(self, settings: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        self.settings = settings
        self.task = task.task_of(settings)
        torch.manual_seed(settings["seed"] + self.rank)  # different on purpose: attach() makes them alike
        self.policy = rl.Policy(self.task.max_len)
        self.params = list(self.policy.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=settings["learning_rate"])
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.params)
        self.collective = Collective(self.rank, self.world_size)
        self.stash: dict[str, Any] | None = None
        self.turns: list[tuple[float, float]] = []
        self.swaps = 0
        self.held_out = task.held_out(self.task, settings["eval_prompts"])
        self.sync: hwplace.WeightSync | None = None
        self.version = 0  # the run's version of these weights (0: never published)
        self.offset = 0  # the run's version minus the sync's (a resumed run's sync counts from 1 again)
        self.published = -1  # len(history) when rank 0 last published
        self.history: list[list[str]] = []  # per optimizer step, the ids of the prompts every rank trained on
        self.trained: set[str] = set()
        # taken and not acknowledged yet (kept across a failed step), with the channel each came from
        self.pending: list[tuple[hwplace.Channel, list[Any]]] = []
        self.pending_at = 0  # len(history) when the pending batch was taken
        self.redelivered = 0  # items taken again after a step trained on them: acknowledged, not trained again
        self.reposed = 0  # stale experience whose prompt went back to be sampled again
        self.reposing = 0  # of those, the ones since the last step (told to the other ranks with the step)
        self.seen: list[tuple[int, int, float, int]] = []  # the same for each experience item: who made it, when
        self.firsts: dict[tuple[int, int], tuple[float, int]] = {}  # per rollout process: first item's time, version
        self.fresh = False  # a restarted process, until reform() re-seeds it

    def on_restart(self, info: hwplace.RestartInfo) -> None:
        self.fresh = True

    def attach(self, sync: hwplace.WeightSync) -> tuple[int, int]:
        """Form the collective, give every rank rank 0's weights (the resumed ones in a resumed run) and publish
        them; the run's version of them and the offset from the sync's numbers."""
        self.sync = sync
        self.collective.form(0)
        with self.turn():
            with hwplace.span("broadcast"):  # a wait on the timeline (hwplace run --trace): blocked on rank 0
                for param in self.params:
                    dist.broadcast(param.data, src=0)
            self._publish(first=True)
        return self.version, self.offset

    def reform(self, sync: hwplace.WeightSync, generation: int, kept: dict[str, Any] | None) -> None:
        """After a rank died: form the collective anew and give every rank the state of the live rank that got
        furthest (a restarted rank has nothing), or, when every rank restarted, ``kept``: the state the driver
        kept of the last step it saw. Then acknowledge what the adopted history already trained on."""
        self.sync = sync
        self.collective.form(generation)
        with self.turn():
            everyone: list[Any] = [None] * self.world_size
            dist.all_gather_object(everyone, (not self.fresh, len(self.history)))
            live = [rank for rank in range(self.world_size) if everyone[rank][0]]
            if live:
                seed = max(live, key=lambda r: everyone[r][1])
                state = [self.state_dict() if self.rank == seed else None]
                dist.broadcast_object_list(state, src=seed)
                if self.rank != seed:
                    self.load_state_dict(state[0])
            elif kept is not None:
                self.load_state_dict(kept)
                self.published = -1  # what the source published after that step died with it: publish again
            else:
                raise RuntimeError("every trainer rank restarted before the first step: there is no state to re-seed "
                                   "them from")
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
        for channel, taken in self.pending:
            channel.ack(taken)
        self.pending = []

    def _take(self, channel: hwplace.Channel, demos: hwplace.Channel) -> list[dict[str, Any]]:
        """This step's items, held (``ack=False``) until the step is done and kept across a failed step: enough
        experience that is fresh (not older than ``max_staleness`` versions) and new to the history (an item a
        step trained on comes back when its taker died after the step), then the demonstrations. The prompt of
        stale experience goes back to the prompts, to be sampled again with the newest weights: never lost."""
        s = self.settings
        if self.pending and len(self.history) > self.pending_at:  # the last step trained on it
            self._acknowledge()
        if not self.pending:
            self.pending_at = len(self.history)
            oldest = max(1, self.version - s["max_staleness"])
            weight = 0
            while weight < s["tokens_per_rank"]:
                taken = channel.get_batch(s["tokens_per_rank"] - weight, "experience", timeout=120, ack=False)
                kept = []
                for group in taken:
                    self.seen.append((group["rollout"], group["attempt"], group["made"], group["version"]))
                    if group["version"] < oldest and group["id"] not in self.trained:  # put back, acknowledged
                        channel.put({"id": group["id"], "prompt": group["prompt"]}, queue_name="prompts",
                                    ack=[group])
                        self.reposing += 1
                        continue
                    kept.append(group)
                    weight += group["tokens"] if group["id"] not in self.trained else 0
                self.pending.append((channel, kept))
            if s["demo_tokens_per_rank"]:
                self.pending.append((demos, demos.get_batch(s["demo_tokens_per_rank"], timeout=120, ack=False)))
        return [item for _, taken in self.pending for item in taken]

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

    def step(self, channel: hwplace.Channel, demos: hwplace.Channel) -> dict[str, Any]:
        s = self.settings
        times: dict[str, float] = {}
        start = time.perf_counter()
        taken = self._take(channel, demos)
        batch = [item for item in taken if "id" in item and item["id"] not in self.trained]
        again = [item for item in taken if "id" in item and item["id"] in self.trained]
        shown = [item for item in taken if "id" not in item]
        times["wait for batch"] = time.perf_counter() - start

        with self.turn():  # colocated with a rollout rank: hwplace calls offload/onload around turns
            entered = time.monotonic()
            everyone: list[Any] = [None] * self.world_size  # every rank records the whole step:
            with hwplace.span("all_gather"):
                dist.all_gather_object(everyone, ([g["id"] for g in batch], self.reposing, len(again), self.seen))
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
            with hwplace.span("all_reduce", op="sum"):  # past this, every rank's batch is in the step
                dist.all_reduce(grads)  # the sum over ranks, then the mean
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
            self.reposed += sum(rank[1] for rank in everyone)
            self.reposing, self.seen = 0, []
            self.redelivered += sum(rank[2] for rank in everyone)
            for process, attempt, made, version in (row for rank in everyone for row in rank[3]):
                if made < self.firsts.get((process, attempt), (made + 1, 0))[0]:
                    self.firsts[process, attempt] = (made, version)
            weights = torch.cat([p.detach().flatten() for p in self.params])
            low, high = weights.clone(), weights.clone()
            with hwplace.span("all_reduce", op="min, max"):
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
            step = len(self.history)  # the batch is acknowledged when the driver has this step's result
            result: dict[str, Any] = {"step": step, "trained": len(self.trained),
                                      "tokens": sum(g["tokens"] for g in batch), "groups": len(batch),
                                      "losses": losses, "times": times, "version": self.version,
                                      "published_at": published_at,
                                      "staleness": [self.version - 1 - g["version"] for g in batch],
                                      "reward": [sum(g["rewards"]) / len(g["rewards"]) for g in batch],
                                      "demo_tokens": demo_tokens}
            if self.rank == 0 and (step % s["eval_every"] == 0 or step == s["steps"]):
                result["exact_match"] = rl.exact_match(self.policy, self.held_out)
            if self.rank == 0:  # for the driver to keep: what re-seeds the ranks if every one of them dies
                result["state"] = self.state_dict()
            self.turns.append((entered, time.monotonic()))
        return result

    def state_dict(self) -> dict[str, Any]:
        with self.turn():  # the weights are on the accelerator
            return {"policy": {k: v.clone() for k, v in self.policy.state_dict().items()},
                    "optimizer": self.optimizer.state_dict(), "version": self.version, "offset": self.offset,
                    "published": self.published, "history": self.history, "redelivered": self.redelivered,
                    "reposed": self.reposed, "firsts": self.firsts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.turn():
            self.policy.load_state_dict(state["policy"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.offset, self.published = state["version"], state["offset"], state["published"]
        self.history = [list(ids) for ids in state["history"]]
        self.trained = {i for ids in self.history for i in ids}
        self.redelivered, self.reposed = state["redelivered"], state["reposed"]
        self.firsts = dict(state["firsts"])

    def report(self) -> dict[str, Any]:
        return {"turns": self.turns, "swaps": self.swaps, "accelerators": os.environ.get("FAKE_VISIBLE_DEVICES"),
                "weight_bytes": self.weight_bytes, "history": self.history, "redelivered": self.redelivered,
                "reposed": self.reposed, "firsts": self.firsts}
