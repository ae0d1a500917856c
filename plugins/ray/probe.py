"""What runs on each node during discovery, as a Ray task pinned there: the node's rank variable and hardware."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import hwplace
from hwplace.executor import detect_here
from hwplace_plugins.ray.ranks import RANK_VARIABLE


def inspect_node(
    declared: Mapping[str, Sequence[Mapping[str, Any]]],
) -> tuple[str | None, str, dict[str, tuple[hwplace.Device, ...]], dict[str, str]]:
    """This node's ``HWPLACE_NODE_RANK`` (or ``None``), hostname, and what every backend detects here."""
    hardware, problems = detect_here(declared)
    return os.environ.get(RANK_VARIABLE), socket.gethostname(), hardware, problems


def free_port() -> int:
    """A TCP port that is free on this node now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])
