"""The GRPO example's sampling (examples/rl-grpo/policy.py): decoding with a cache of keys and values is the
policy's own arithmetic. The log-probabilities a rollout records are the ones the trainer computes for the same
answers under the same weights (GRPO's importance ratio is 1 on-policy), greedy answers are the full forward's,
and every row keeps its prompt at the positions it is trained at, prompts of different lengths in one batch."""

from __future__ import annotations

import importlib
import random
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "rl-grpo"))  # as its workers import it
rl: Any = importlib.import_module("policy")
task: Any = importlib.import_module("task")


def trained_a_little(seed: int) -> Any:
    """A policy whose weights are not the initial ones (so agreement is not an accident of small logits)."""
    torch.manual_seed(seed)
    model = rl.Policy(task.Task().max_len)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    return model


def prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [task.make_prompt(rng, task.Task()) for _ in range(count)]


def test_extending_the_cache_gives_the_full_forward_logits_at_every_position() -> None:
    model = trained_a_little(1)
    tokens = torch.randint(0, task.VOCAB - 1, (6, model.max_len))
    full = model(tokens)
    with torch.no_grad():
        for prefix in (1, 4, 7):
            cache: list[Any] = []
            logits = model.extend(tokens[:, :prefix], cache)
            torch.testing.assert_close(logits, full[:, prefix - 1], rtol=1e-5, atol=1e-5)
            for position in range(prefix, model.max_len):
                logits = model.extend(tokens[:, position:position + 1], cache)
                torch.testing.assert_close(logits, full[:, position], rtol=1e-5, atol=1e-5)
            assert [k.shape[2] for k, _ in cache] == [model.max_len] * len(model.blocks.layers)


def test_recorded_logps_are_the_trainers_for_the_same_answers() -> None:
    model = trained_a_little(2)
    batch = prompts(12, 3)
    assert len({len(p) for p in batch}) == 3  # three prompt lengths decode together
    answers, logps = rl.sample(model, batch, torch.Generator().manual_seed(4))
    tokens, mask = rl._batch(list(zip(batch, answers, strict=True)), model.max_len)
    trained = rl.token_logps(model, tokens)
    for i, (prompt, answer) in enumerate(zip(batch, answers, strict=True)):
        assert answer
        assert answer[-1] == task.END or len(prompt) + len(answer) == model.max_len, answer
        assert task.PAD not in answer
        assert len(logps[i]) == len(answer) == int(mask[i].sum())
        start = len(prompt) - 1
        torch.testing.assert_close(torch.tensor(logps[i]), trained[i, start:start + len(answer)],
                                   rtol=1e-4, atol=1e-4)


def test_greedy_answers_are_the_full_forwards_one_row_at_a_time() -> None:
    model = trained_a_little(5)
    batch = prompts(9, 6)
    answers, _ = rl.sample(model, batch, None, greedy=True)
    for prompt, answer in zip(batch, answers, strict=True):
        row = list(prompt)
        with torch.no_grad():
            while len(row) < model.max_len:
                logits = model(torch.tensor([row]))[0, -1]
                logits[task.PAD] = -float("inf")
                row.append(int(logits.argmax()))
                if row[-1] == task.END:
                    break
        assert answer == row[len(prompt):]


def test_the_losses_are_finite_where_answers_are_padded() -> None:
    model = trained_a_little(7)
    batch = [p for p in prompts(40, 8) if len(p) < 7][:6]  # short prompts: their rows end in padding
    answers = [task.solve(p) for p in batch]
    demo, tokens = rl.demo_loss(model, [{"prompt": p, "answer": a} for p, a in zip(batch, answers, strict=True)])
    assert tokens == sum(len(a) for a in answers)
    samples = [{"prompt": p, "answer": a, "logps": [-1.0] * len(a), "advantage": 1.0}
               for p, a in zip(batch, answers, strict=True)]
    grpo, _ = rl.grpo_loss(model, samples)
    assert torch.isfinite(demo)
    assert torch.isfinite(grpo)
    (demo + grpo).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
