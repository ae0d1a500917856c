"""The fake backends pass the conformance kit every backend author runs."""

from __future__ import annotations

import pytest

from hwplace.testing import BackendConformance
from hwplace_plugins import fake


@pytest.fixture(autouse=True)
def _four_fake_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLACE_FAKE_ACCELERATORS", "4")


class TestFakeAccelerator(BackendConformance):
    plugin = fake
    backend_name = "fake-accelerator"


class TestFakeRobot(BackendConformance):
    plugin = fake
    backend_name = "fake-robot"
    configs = ({"name": "left"}, {"name": "right", "unhealthy": "gripper jammed"})


class TestFakeAcceleratorAbsent(BackendConformance):
    """With no HWPLACE_FAKE_ACCELERATORS, it finds none and says why."""

    plugin = fake
    backend_name = "fake-accelerator"

    @pytest.fixture(autouse=True)
    def _none(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("HWPLACE_FAKE_ACCELERATORS", raising=False)
