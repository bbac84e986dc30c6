"""Service processes and their supervision, with real (shell) subprocesses and a fake clock."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stacx.infra.pipeline.errors import ServiceError
from stacx.infra.pipeline.services import (
    RestartBudget,
    RestartPolicy,
    ServiceProcess,
    ServiceSpec,
    Supervisor,
)


def _shell(name: str, script: str, **kwargs: object) -> ServiceSpec:
    return ServiceSpec(name=name, args=["-c", script], program=["/bin/sh"], **kwargs)  # type: ignore[arg-type]


def _wait_exit(service: ServiceProcess) -> None:
    assert service.proc is not None
    service.proc.wait(timeout=60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    return state != "Z"


def _wait_gone(pid: int) -> bool:
    for _ in range(600):  # an upper bound against a hang, not a timing assertion
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_stop_kills_the_group_even_when_the_main_process_is_dead(tmp_path: Path) -> None:
    """Break 3: the trainer's main process was killed, its ranks hung on; stop() returned early
    because the leader was dead, and the ranks stayed forever."""
    child_pid = tmp_path / "child.pid"
    service = ServiceProcess(_shell("trainer", f"sleep 300 & echo $! > {child_pid}; exit 0"),
                             tmp_path).start()
    _wait_exit(service)
    orphan = int(child_pid.read_text())
    assert _alive(orphan)
    service.stop()
    assert _wait_gone(orphan)


def test_a_rank_finishing_its_sigterm_after_the_main_process_is_not_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A clean stop: the main process exits on SIGTERM first and its rank a moment later. The
    rank ends by itself (its exit status says so) and nothing is reported as left behind."""
    child_status = tmp_path / "child.status"
    script = (
        f"sh -c 'trap \"sleep 1; echo done > {child_status}; exit 0\" TERM; "
        "while true; do sleep 0.1; done' & "
        "trap 'exit 0' TERM; while true; do sleep 0.1; done"
    )
    service = ServiceProcess(_shell("trainer", script), tmp_path).start()
    time.sleep(1.0)  # both traps installed
    with caplog.at_level("WARNING", logger="stacx.infra.pipeline.services"):
        service.stop()
    assert child_status.read_text().strip() == "done"
    assert "left behind" not in caplog.text


def test_a_rank_ignoring_sigterm_is_killed_after_the_grace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    child_pid = tmp_path / "child.pid"
    script = (
        f"sh -c 'trap \"\" TERM; while true; do sleep 0.1; done' & echo $! > {child_pid}; "
        "trap 'exit 0' TERM; while true; do sleep 0.1; done"
    )
    service = ServiceProcess(_shell("trainer", script), tmp_path).start()
    time.sleep(1.0)
    with caplog.at_level("WARNING", logger="stacx.infra.pipeline.services"):
        service.stop()
    assert _wait_gone(int(child_pid.read_text()))
    assert "trainer: killed the processes its main process left behind" in caplog.text


def test_restart_budget_backs_off_and_runs_out() -> None:
    budget = RestartBudget(RestartPolicy(max_restarts=3, window_s=100, backoff_s=1,
                                         max_backoff_s=3))
    assert [budget.next_delay(t) for t in (0, 1, 2)] == [1, 2, 3]
    assert budget.next_delay(3) is None
    assert budget.next_delay(100.5) == 3  # the crash at t=0 left the window; two remain in it
    assert budget.next_delay(150) == 2  # only the crash at t=100.5 is still in the window


def test_restart_policy_names_the_bad_field() -> None:
    with pytest.raises(ValueError, match="max_backoff_s"):
        RestartPolicy(backoff_s=10, max_backoff_s=1)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_supervisor_restarts_after_the_backoff_then_gives_up(tmp_path: Path) -> None:
    clock = _Clock()
    supervisor = Supervisor(RestartPolicy(max_restarts=2, window_s=1000, backoff_s=5,
                                          max_backoff_s=60), clock=clock)
    marker = tmp_path / "runs"
    service = ServiceProcess(_shell("rollout", f"echo run >> {marker}; exit 3"), tmp_path).start()
    supervisor.add(service)
    _wait_exit(service)
    assert supervisor.poll() == []  # crash noticed: restart due in 5 s
    clock.now = 4.9
    assert supervisor.poll() == []
    clock.now = 5.0
    assert supervisor.poll() == ["rollout"]
    _wait_exit(service)
    clock.now = 6.0
    assert supervisor.poll() == []  # second crash: 10 s
    clock.now = 16.0
    assert supervisor.poll() == ["rollout"]
    _wait_exit(service)
    with pytest.raises(ServiceError, match=r"service rollout exited with status 3 and has used "
                                           r"its restart budget \(2 restarts within 1000s\)"):
        supervisor.poll()
    assert marker.read_text().count("run") == 3 and supervisor.restarts == {"rollout": 2}


def test_a_finished_service_is_not_restarted(tmp_path: Path) -> None:
    supervisor = Supervisor(RestartPolicy(backoff_s=0), clock=_Clock())
    service = ServiceProcess(_shell("trainer", "exit 0", finishes=True), tmp_path).start()
    supervisor.add(service)
    _wait_exit(service)
    assert supervisor.poll() == [] and supervisor.poll() == []
    assert supervisor.finished("trainer") and supervisor.restarts == {"trainer": 0}


def test_a_service_that_finishes_before_it_is_waited_for_counts_as_ready(tmp_path: Path) -> None:
    """The trainer starts with the inference server now; with a few steps it was done before the
    run waited for it, and the run failed on "service trainer exited with status 0"."""
    done = ServiceProcess(_shell("trainer", "exit 0", finishes=True), tmp_path).start()
    _wait_exit(done)
    done.wait_ready(60)
    crashed = ServiceProcess(_shell("assembler", "exit 0"), tmp_path).start()  # not one that finishes
    _wait_exit(crashed)
    with pytest.raises(ServiceError, match="exited with status 0"):
        crashed.wait_ready(60)
    failed = ServiceProcess(_shell("trainer", "exit 3", finishes=True), tmp_path).start()
    _wait_exit(failed)
    with pytest.raises(ServiceError, match="exited with status 3"):
        failed.wait_ready(60)


NANOBIND_EXIT = r"nanobind: leaked 3 instances!\n - leaked type torch._C.X\nnanobind: leaked 1 types!"


def test_a_service_refusing_its_config_is_not_restarted_and_its_own_line_is_the_error(tmp_path: Path) -> None:
    """Exit status 2 is a configuration error: a restart fails the same way, so none is tried, and
    the run's error quotes the command's `stacx train: ...` line, not the interpreter's exit noise."""
    supervisor = Supervisor(RestartPolicy(backoff_s=0), clock=_Clock())
    marker = tmp_path / "runs"
    script = (f"echo run >> {marker}; echo 'stacx train: f.yaml: trainer.role_options.policy.kl_bta: no such "
              f"option' >&2; printf '{NANOBIND_EXIT}\\n' >&2; exit 2")
    service = ServiceProcess(_shell("trainer", script), tmp_path).start()
    supervisor.add(service)
    _wait_exit(service)
    with pytest.raises(ServiceError) as info:
        supervisor.poll()
    message = str(info.value)
    assert message.startswith("service trainer refused its configuration (exit status 2, not restarted)")
    assert message.endswith("stacx train: f.yaml: trainer.role_options.policy.kl_bta: no such option")
    assert "nanobind" not in message and "leaked" not in message
    assert marker.read_text().count("run") == 1 and supervisor.restarts == {"trainer": 0}


def test_without_a_command_line_the_error_is_the_log_tail_without_exit_noise(tmp_path: Path) -> None:
    script = f"echo 'ValueError: boom' >&2; printf '{NANOBIND_EXIT}\\n' >&2; exit 1"
    service = ServiceProcess(_shell("rollout", script), tmp_path).start()
    _wait_exit(service)
    with pytest.raises(ServiceError) as info:
        service.check_alive()
    assert str(info.value).endswith("ValueError: boom"), str(info.value)
