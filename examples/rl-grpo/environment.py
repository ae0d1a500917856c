"""The GRPO example's workers that need no model: environments that pose prompts and score answers with the rule, and
robots that record scripted demonstrations. Neither this module nor task.py imports torch, so these processes
start in a fraction of a second and hold no copy of it."""

from __future__ import annotations

import contextlib
import os
import random
import time
from typing import Any

import task  # beside this file

import hwplace


class Env(hwplace.Worker):
    """Poses prompts (prompt ``n`` of the job's data cursor is always the same one), and scores the rollouts'
    answers with the rule into group-relative advantages."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.task = task.task_of(settings)
        self.group = settings["group_size"]

    def serve(self, channel: hwplace.Channel, seed: int) -> dict[str, Any]:
        made = scored = 0
        busy = 0.0
        try:
            while True:
                # pose what the driver's cursor handed out: each prompt acknowledges its number, in one step
                with contextlib.suppress(hwplace.ChannelEmpty):
                    while True:
                        number = channel.get_nowait("cursor", ack=False)
                        prompt = task.make_prompt(random.Random(f"prompt-{seed}-{number['n']}"), self.task)
                        channel.put({"id": number["n"], "prompt": prompt}, queue_name="prompts", ack=number)
                        made += 1
                try:  # score what comes back: held until the scored group is in (put with ack=)
                    item = channel.get("answers", timeout=0.05, ack=False)
                except hwplace.ChannelTimeout:
                    continue
                start = time.perf_counter()
                rewards = [task.reward(item["prompt"], a) for a in item["answers"]]
                group = {**item, "rewards": rewards, "advantages": task.group_advantages(rewards, self.group),
                         "tokens": sum(len(item["prompt"]) + len(a) for a in item["answers"])}
                busy += time.perf_counter() - start
                channel.put(group, weight=group["tokens"], queue_name="experience", version=item["version"],
                            ack=item)
                scored += 1
        except hwplace.ChannelClosed:  # the driver closes the channel when training is done
            return {"prompts": made, "scored": scored, "busy": busy}


class Robot(hwplace.Worker):
    """Drives its own robot (the fake backend names it in FAKE_ROBOTS) through scripted demonstrations."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.task = task.task_of(settings)
        self.attempt = 0

    def on_restart(self, info: hwplace.RestartInfo) -> None:
        self.attempt = info.attempt

    def record(self, demos: hwplace.Channel, seed: int, epoch: int) -> dict[str, Any]:
        robot = os.environ["FAKE_ROBOTS"]  # this process's robot, and no other
        rng = random.Random(f"robot-{seed}-{robot}-{epoch}-{self.attempt}")
        made = 0
        busy = 0.0
        try:
            while True:
                start = time.perf_counter()
                prompt = task.make_prompt(rng, self.task)
                answer = task.solve(prompt)
                time.sleep(0.002 * len(answer))  # a robot moves in real time
                busy += time.perf_counter() - start
                demos.put({"prompt": prompt, "answer": answer}, weight=len(prompt) + len(answer))
                made += 1
        except hwplace.ChannelClosed:
            return {"demos": made, "busy": busy, "robot": robot}
