"""CPU priority (``runtime.priority``): the background services default to niceness 10 and every other
to 0, ``--nice`` / ``RALLY_NICE`` override it (0 to 19, nothing else), a host runs at its most urgent
service's, and a process lowers its own priority but never raises it (run in child processes: the test's
own priority stays as it is)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from rallypoint.runtime.cohost import host_niceness
from rallypoint.runtime.config import CPU_NICE, ServiceConfig, add_common_args


def _config(service: str, *argv: str) -> ServiceConfig:
    return ServiceConfig.from_args(service, add_common_args(argparse.ArgumentParser()).parse_args(argv))


def test_background_services_run_at_10_and_the_rest_at_0() -> None:
    assert {name: _config(name).niceness for name in CPU_NICE} == dict.fromkeys(CPU_NICE, 10)
    waited_on = ("api", "scheduler", "job-controller", "health-monitor", "checkpoint", "predictor")
    for service in (*waited_on, "inventory", "agent"):
        assert _config(service).niceness == 0


def test_the_option_and_the_environment_override_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(CPU_NICE) == {"projector", "preemption"}
    assert _config("projector", "--nice", "0").niceness == 0
    assert _config("api", "--nice", "5").niceness == 5
    monkeypatch.setenv("RALLY_NICE", "3")
    assert _config("predictor").niceness == 3


@pytest.mark.parametrize("value", ["-5", "20", "ten"])
def test_a_niceness_outside_0_to_19_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _config("api", "--nice", value)
    assert "--nice" in capsys.readouterr().err


def test_a_host_runs_at_its_most_urgent_services_priority() -> None:
    async def main(_ctx: object) -> int:
        return 0

    background = [(main, _config("projector")), (main, _config("preemption"))]
    assert host_niceness(background) == 10
    assert host_niceness([*background, (main, _config("job-controller"))]) == 0


def _niceness_after(asked: int, start: int = 0) -> int:
    """The niceness a child process started at ``start`` has after ``lower_cpu_priority(asked)``."""
    code = (
        "import os; from rallypoint.runtime.priority import lower_cpu_priority; "
        f"os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), {start})); "
        f"print(lower_cpu_priority({asked}), os.getpriority(os.PRIO_PROCESS, 0))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    said, read = (int(v) for v in out.split())
    assert said == read
    return read


def test_a_process_lowers_its_priority_and_never_raises_it() -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)  # children start at ours (a test run may itself be niced)
    assert _niceness_after(10) == max(own, 10)
    assert _niceness_after(0) == own
    assert _niceness_after(5, start=15) == max(own, 15)  # started lower than asked: stays so
