"""The learning half of the GRPO example, free of hwplace: the task made in code, its rule-based reward, a small
transformer policy trained from scratch, sampling, and GRPO's group-relative loss.

The task: a prompt is a list of digits and an instruction (sort them, or reverse them); the answer is the
digits in that order, then an end token. The reward checks the answer position by position; exact match is
what the held-out evaluation counts.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional

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


class Policy(nn.Module):
    """A small decoder-only transformer over the task's 15 tokens, trained from scratch."""

    def __init__(self, max_len: int, width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.max_len = max_len
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(max_len, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)
        mask = torch.triu(torch.full((max_len, max_len), float("-inf")), diagonal=1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embed(tokens) + self.position(torch.arange(length, device=tokens.device))
        x = self.blocks(x, mask=self.causal[:length, :length], is_causal=True)
        return self.head(self.norm(x))


@torch.no_grad()
def sample(policy: Policy, prompts: list[list[int]], generator: torch.Generator | None,
           greedy: bool = False) -> tuple[list[list[int]], list[list[float]]]:
    """Answers to the prompts (up to the end token) and the log-probability of each answer token.

    Prompts of one length decode together, so every row sits at the positions it is trained at.
    """
    answers: list[list[int]] = [[] for _ in prompts]
    logps: list[list[float]] = [[] for _ in prompts]
    by_length: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(i)
    for length, rows in by_length.items():
        tokens = torch.tensor([prompts[i] for i in rows], dtype=torch.long)
        open_rows = list(range(len(rows)))
        for _ in range(policy.max_len - length):
            logits = policy(tokens)[:, -1, :]
            logits[:, PAD] = -math.inf
            probs = functional.log_softmax(logits, dim=-1)
            chosen = probs.argmax(-1) if greedy else torch.multinomial(probs.exp(), 1, generator=generator).squeeze(-1)
            tokens = torch.cat([tokens, chosen[:, None]], dim=1)
            still = []
            for row in open_rows:
                token = int(chosen[row])
                answers[rows[row]].append(token)
                logps[rows[row]].append(float(probs[row, token]))
                if token != END:
                    still.append(row)
            open_rows = still
            if not open_rows:
                break
    return answers, logps


def group_advantages(rewards: list[float], group: int) -> list[float]:
    """GRPO's advantage: each answer's reward against the mean and spread of its prompt's group."""
    out = []
    for start in range(0, len(rewards), group):
        chunk = rewards[start:start + group]
        mean = sum(chunk) / len(chunk)
        spread = math.sqrt(sum((r - mean) ** 2 for r in chunk) / len(chunk))
        out += [(r - mean) / (spread + 1e-4) for r in chunk]
    return out


def _batch(sequences: list[tuple[list[int], list[int]]], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt+answer tokens, and a mask of the answer positions (as predicted positions)."""
    tokens = torch.full((len(sequences), max_len), PAD, dtype=torch.long)
    mask = torch.zeros((len(sequences), max_len - 1))
    for i, (prompt, answer) in enumerate(sequences):
        row = [*prompt, *answer][:max_len]
        tokens[i, :len(row)] = torch.tensor(row)
        mask[i, len(prompt) - 1:len(row) - 1] = 1.0
    return tokens, mask


def token_logps(policy: Policy, tokens: torch.Tensor) -> torch.Tensor:
    logits = policy(tokens[:, :-1])
    return functional.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)


def grpo_loss(policy: Policy, samples: list[dict[str, Any]], clip: float = 0.2) -> tuple[torch.Tensor, int]:
    """The clipped policy-gradient loss over answer tokens, summed (divide by the tokens of the whole batch).

    Each sample holds ``prompt``, ``answer``, ``logps`` (the behaviour policy's, for the importance ratio when
    the batch is off-policy) and ``advantage``.
    """
    tokens, mask = _batch([(s["prompt"], s["answer"]) for s in samples], policy.max_len)
    new = token_logps(policy, tokens)
    old = torch.zeros_like(new)
    advantage = torch.zeros_like(new)
    for i, s in enumerate(samples):
        start = len(s["prompt"]) - 1
        old[i, start:start + len(s["logps"])] = torch.tensor(s["logps"][: new.shape[1] - start])
        advantage[i] = s["advantage"]
    ratio = torch.exp(new - old)
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage)
    return -(surrogate * mask).sum(), int(mask.sum())


def demo_loss(policy: Policy, demos: list[dict[str, Any]]) -> tuple[torch.Tensor, int]:
    """Cross-entropy on demonstrated answers, summed over their tokens (the auxiliary term)."""
    tokens, mask = _batch([(d["prompt"], d["answer"]) for d in demos], policy.max_len)
    return -(token_logps(policy, tokens) * mask).sum(), int(mask.sum())


@torch.no_grad()
def exact_match(policy: Policy, prompts: list[list[int]]) -> float:
    answers, _ = sample(policy, prompts, None, greedy=True)
    return sum(a == solve(p) for p, a in zip(prompts, answers, strict=True)) / len(prompts)
