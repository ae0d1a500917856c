"""hwplace.foundation.wording.first_line: how every message quotes an underlying error (the executors' too, through
hwplace.executor)."""

from __future__ import annotations

import hwplace.executor
from hwplace.foundation.wording import first_line


def test_first_line_is_the_first_non_blank_line_stripped_or_the_error_s_type() -> None:
    assert first_line(RuntimeError("\n  the peer is gone  \ntraceback ...")) == "the peer is gone"
    assert first_line(TimeoutError()) == "TimeoutError"
    assert first_line(ValueError(" \n \n")) == "ValueError"
    assert hwplace.executor.first_line is first_line
