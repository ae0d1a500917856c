"""The GRPO example's task, made in code, and its rule-based reward: plain Python, free of torch and of hwplace,
so the processes that only pose prompts, score answers and record demonstrations (environment.py) start without
loading torch.

A prompt is a list of digits and an instruction (sort them, or reverse them); the answer is the digits in that
order, then an end token. The reward checks the answer position by position; exact match is what the held-out
evaluation counts.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

DIGITS = 10
SORT, REVERSE, SEP, END, PAD = 10, 11, 12, 13, 14
VOCAB = 15
TASKS = {"sort": SORT, "reverse": REVERSE}


@dataclass(frozen=True)
class Task:
    """One kind of problem: which instructions, and how many digits a prompt has."""

    kinds: tuple[str, ...] = ("sort", "reverse")
    min_digits: int = 3
    max_digits: int = 5

    @property
    def max_len(self) -> int:
        """Prompt (instruction, digits, separator) plus answer (digits, end)."""
        return 2 * self.max_digits + 3


def task_of(settings: dict[str, Any]) -> Task:
    """The task a job's settings ask for."""
    return Task(tuple(settings["tasks"]), settings["min_digits"], settings["max_digits"])


def make_prompt(rng: random.Random, task: Task) -> list[int]:
    kind = rng.choice(task.kinds)
    digits = [rng.randrange(DIGITS) for _ in range(rng.randint(task.min_digits, task.max_digits))]
    return [TASKS[kind], *digits, SEP]


def solve(prompt: list[int]) -> list[int]:
    """The right answer to a prompt, end token included."""
    digits = prompt[1:-1]
    return [*(sorted(digits) if prompt[0] == SORT else digits[::-1]), END]


def reward(prompt: list[int], answer: list[int]) -> float:
    """The rule: the share of answer positions right (an early or missing end token counts as wrong), plus 1 for
    an exact match. Between 0 and 2."""
    target = solve(prompt)
    right = sum(1 for a, b in zip(answer, target, strict=False) if a == b)
    share = right / max(len(target), len(answer))
    return share + (1.0 if answer == target else 0.0)


def held_out(task: Task, count: int, seed: int = 12345) -> list[list[int]]:
    """Prompts for evaluation, made from a seed no training prompt uses."""
    rng = random.Random(f"held-out-{seed}")
    return [make_prompt(rng, task) for _ in range(count)]


def group_advantages(rewards: list[float], group: int) -> list[float]:
    """GRPO's advantage: each answer's reward against the mean and spread of its prompt's group."""
    out = []
    for start in range(0, len(rewards), group):
        chunk = rewards[start:start + group]
        mean = sum(chunk) / len(chunk)
        spread = math.sqrt(sum((r - mean) ** 2 for r in chunk) / len(chunk))
        out += [(r - mean) / (spread + 1e-4) for r in chunk]
    return out
