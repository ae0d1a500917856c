"""The learning half of the GRPO example, free of hwplace: a small transformer policy over the task's tokens
(task.py), trained from scratch, sampling, and GRPO's clipped loss."""

from __future__ import annotations

import math
from typing import Any

import torch
from task import END, PAD, VOCAB, solve  # beside this file
from torch import nn
from torch.nn import functional


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
