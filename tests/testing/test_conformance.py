"""The conformance kit itself: it passes a well-behaved backend and catches each kind of broken one."""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

GOOD = '''
import time

import hwplace

class Good(hwplace.HardwareBackend):
    name = "good-tpu"
    kind = "accelerator"

    def detect(self, configs):
        return [hwplace.Device(i, "Good TPU", properties={"chip": f"c{i}"}) for i in range(2)]

    def isolation_env(self, devices):
        return {"GOOD_CHIPS": ",".join(d.properties.get("chip", str(d.index)) for d in devices)}

    def check_config(self, config):
        if config:
            raise ValueError("good-tpu takes no configs")

@hwplace.hookimpl
def hwplace_hardware_backends():
    return [Good()]
'''


def run_kit(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    pytester.makepyfile(my_backend=textwrap.dedent(source))
    pytester.makepyfile(test_kit='''
        from hwplace.testing import BackendConformance
        import my_backend

        class TestIt(BackendConformance):
            plugin = my_backend
            backend_name = "good-tpu"
    ''')
    return pytester.runpytest("-q", "-p", "no:cacheprovider", "-p", "no:hwplace")


def test_a_well_behaved_backend_passes(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, GOOD)
    result.assert_outcomes(passed=19, skipped=1)  # skipped: "none here" when devices are here


@pytest.mark.parametrize(("change", "failing", "message"), [
    (("return [hwplace.Device(i,", "raise OSError('driver gone'); return [hwplace.Device(i,"),
     "test_devices_are_numbered_from_zero", "detect raised OSError"),
    (("for i in range(2)]", "for i in range(2)][1:]"), "test_devices_are_numbered_from_zero",
     "detect returned device indexes \\[1\\]; expected 0..n-1 in order"),
    (("return [hwplace.Device(i, \"Good TPU\", properties={\"chip\": f\"c{i}\"}) for i in range(2)]", "return []"),
     "test_none_here_says_why", "found nothing without saying why"),
    (("return {\"GOOD_CHIPS\"", "return {\"GOOD_CHIPS\": \"all\"}; {\"GOOD_CHIPS\""),
     "test_isolation_tells_devices_apart", "two devices get the same isolation variables"),
    (("raise ValueError(\"good-tpu takes no configs\")", "raise KeyError(config['missing'])"),
     "test_odd_configs_are_refused", "refuse a bad entry with ValueError"),
    (("def detect(self, configs):\n", "def detect(self, configs):\n        time.sleep(30)\n"),
     "test_detect_finishes_within_its_time_bound", "detect did not finish within 1 s"),
])
def test_each_kind_of_broken_backend_is_caught(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                               change: tuple[str, str], failing: str, message: str) -> None:
    source = GOOD.replace(*change)
    assert source != GOOD
    monkeypatch.setenv("HWPLACE_DETECT_TIMEOUT", "1")  # bounds the sleeping backend's run
    result = run_kit(pytester, source)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1
    result.stdout.re_match_lines([rf".*{failing}.*"], consecutive=False)
    result.stdout.re_match_lines([rf".*{message}.*"], consecutive=False)
