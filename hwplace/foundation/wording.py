"""Small helpers that keep hwplace's messages consistent: plurals, rank lists, did-you-mean, an error's first
line."""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable, Mapping, Sequence


def plural(count: int, word: str, words: str | None = None) -> str:
    """``"1 node"``, ``"2 nodes"``; ``words`` for an irregular plural."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def first_line(error: BaseException) -> str:
    """The first non-blank line of ``error``'s message, stripped (its type's name if it has none): how a message
    quotes an underlying error without its traceback or detail."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(error).__name__


def did_you_mean(word: str, choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, or ``""``. A word ``aliases`` knows (``gpu`` for
    ``cuda``) suggests its choice when that is one, before any spelling that merely looks alike."""
    names = [str(c) for c in choices]
    known = (aliases or {}).get(word.strip().lower())
    if known is not None and known in names:
        return f"; did you mean {known!r}?"
    close = difflib.get_close_matches(word, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def ranks_text(ranks: Sequence[int], word: str = "node") -> str:
    """``"node 3"``, or ``"nodes 0-3,7"`` for ascending ranks."""
    if len(ranks) == 1:
        return f"{word} {ranks[0]}"
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return f"{word}s " + ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 120


def safe_repr(value: object, *, short: bool = True) -> str:
    """``repr(value)``, shortened for a message unless ``short`` is off; a description when ``__repr__`` raises."""
    try:
        return _SHORT.repr(value) if short else repr(value)
    except Exception as exc:
        return f"<{type(value).__name__} object; its repr raised {type(exc).__name__}>"
