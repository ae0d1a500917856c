"""hwplace.errors: one hierarchy; every error crosses processes (a worker's exception) with its fields."""

from __future__ import annotations

import pickle
import queue

import pytest

import hwplace
import hwplace.errors

ERRORS = [
    hwplace.ConfigError("cluster.num_nodes", "must be at least 1", value=0, allowed="1 to 100000"),
    hwplace.PlacementError("ranks overlap", component="actor", text="0-3,2-5", span=(4, 7), rank=2),
    hwplace.PluginError("two plugins are named 'x'", plugins=("x", "y")),
    hwplace.WorkerError("run() raised ValueError: no", group="actor", rank=1, node_rank=0, remote_traceback="tb"),
    hwplace.ChannelClosed("closed"),
    hwplace.ChannelLost("lost"),
    hwplace.CallCancelled("group 'g' rank 0 on node 0: run() was cancelled"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_an_error_pickles_with_its_message_and_fields(error: hwplace.HwplaceError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)


def test_errors_carry_their_public_module_name() -> None:
    assert hwplace.ConfigError.__module__ == "hwplace.errors"
    assert pickle.dumps(hwplace.ConfigError("a", "b")).count(b"hwplace.errors") == 1
    assert [name for name in hwplace.errors.__all__ if getattr(hwplace.errors, name).__module__ != "hwplace.errors"] \
        == []  # every one of them, ChannelNotHeld too


def test_the_hierarchy_matches_the_standard_errors_users_catch() -> None:
    assert issubclass(hwplace.ConfigError, ValueError)
    assert issubclass(hwplace.PlacementError, ValueError)
    assert issubclass(hwplace.WorkerError, RuntimeError)
    assert issubclass(hwplace.ChannelEmpty, queue.Empty)
    assert issubclass(hwplace.ChannelFull, queue.Full)
    assert issubclass(hwplace.ChannelTimeout, TimeoutError)
    assert all(issubclass(type(e), hwplace.HwplaceError) for e in ERRORS)
