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

    def extend(self, tokens: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The logits after the last of ``tokens`` (rows, new positions), which follow the positions ``cache``
        holds (each layer's keys and values, grown in place by these): ``forward``'s arithmetic with the same
        weights, each position computed once however long the sampled answer grows."""
        start = cache[0][0].shape[2] if cache else 0
        rows, new = tokens.shape
        x = self.embed(tokens) + self.position(torch.arange(start, start + new, device=tokens.device))
        for index, layer in enumerate(self.blocks.layers):
            attention = layer.self_attn
            heads = attention.num_heads
            qkv = functional.linear(layer.norm1(x), attention.in_proj_weight, attention.in_proj_bias)
            q, k, v = qkv.view(rows, new, 3, heads, -1).permute(2, 0, 3, 1, 4)
            if index < len(cache):
                k, v = torch.cat([cache[index][0], k], 2), torch.cat([cache[index][1], v], 2)
                cache[index] = (k, v)
            else:
                cache.append((k, v))
            mixed = functional.scaled_dot_product_attention(q, k, v, is_causal=start == 0 and new > 1)
            x = x + attention.out_proj(mixed.transpose(1, 2).reshape(rows, new, -1))
            x = x + layer.linear2(layer.activation(layer.linear1(layer.norm2(x))))
        return self.head(self.norm(x[:, -1]))


@torch.no_grad()
def sample(policy: Policy, prompts: list[list[int]], generator: torch.Generator | None,
           greedy: bool = False) -> tuple[list[list[int]], list[list[float]]]:
    """Answers to the prompts (up to the end token) and the log-probability of each answer token.

    Every row sits at the positions it is trained at (its prompt from position 0), and all rows decode together:
    from the shortest prompt on, a row still in its prompt takes its prompt's next token, the others a sampled one.
    """
    lengths = torch.tensor([len(p) for p in prompts])
    tokens = torch.full((len(prompts), policy.max_len), PAD, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        tokens[i, :len(prompt)] = torch.tensor(prompt)
    answers: list[list[int]] = [[] for _ in prompts]
    logps: list[list[float]] = [[] for _ in prompts]
    cache: list[tuple[torch.Tensor, torch.Tensor]] = []
    start = int(lengths.min())
    logits = policy.extend(tokens[:, :start], cache)
    open_rows = torch.ones(len(prompts), dtype=torch.bool)
    for position in range(start, policy.max_len):
        logits[:, PAD] = -math.inf
        probs = functional.log_softmax(logits, dim=-1)
        chosen = probs.argmax(-1) if greedy else torch.multinomial(probs.exp(), 1, generator=generator).squeeze(-1)
        answering = open_rows & (lengths <= position)
        chosen = torch.where(answering, chosen, tokens[:, position])
        taken = probs.gather(-1, chosen[:, None]).squeeze(-1)
        for row, token, logp in zip(answering.nonzero().squeeze(-1).tolist(), chosen[answering].tolist(),
                                    taken[answering].tolist(), strict=True):
            answers[row].append(token)
            logps[row].append(logp)
        open_rows &= ~(answering & (chosen == END))
        if not open_rows.any() or position + 1 == policy.max_len:
            break
        tokens[:, position] = chosen
        logits = policy.extend(chosen[:, None], cache)
    return answers, logps


PADDING = functional.one_hot(torch.tensor(PAD), VOCAB).bool()  # the logit that sampling leaves out


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
    """Each next token's log-probability under the policy as it samples: never the padding token. Its logit is
    the lowest finite value rather than -inf, so a padded position's log-probability stays finite and the masks
    that leave it out (a product with 0) give 0, not NaN."""
    logits = policy(tokens[:, :-1])
    logits = logits.masked_fill(PADDING, torch.finfo(logits.dtype).min)
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
