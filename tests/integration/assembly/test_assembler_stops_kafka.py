"""`stacx assemble` stops on SIGTERM and SIGINT like every other `stacx` command: a clean stop
(final stats logged), one line naming the signal, exit status 128 + the signal number."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from assembly_worker import AssemblerProcess, one_group_config


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_assembler_with_one_line_and_128_plus_its_number(
    stop: signal.Signals,
    kafka_bootstrap: str,
    fresh_topic: Callable[..., str],
    app_ids: list[str],
    tmp_path: Path,
) -> None:
    config = one_group_config(fresh_topic, kafka_bootstrap, tmp_path, "stops")
    app_ids.append(config["app_id"])
    with AssemblerProcess(config, tmp_path) as worker:
        worker.wait_for_line("Ready", timeout_s=120)  # the worker started
        worker.proc.send_signal(stop)
        code = worker.proc.wait(timeout=60)
        worker.wait_for_line("assembler final stats", timeout_s=5)
    assert code == 128 + stop.value, worker.lines[-10:]
    assert worker.lines[-1] == f"stacx assemble: stopped by {stop.name}", worker.lines[-10:]
    assert not [line for line in worker.lines if "Traceback" in line], worker.lines


def test_a_worker_that_does_not_settle_in_time_gives_up_with_one_line_and_status_1(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], app_ids: list[str], tmp_path: Path
) -> None:
    """A real join and table recovery take about a second here: with a timeout of 0.3 s the
    watchdog stops the worker while it is still joining, as it would a worker stuck there."""
    config = {**one_group_config(fresh_topic, kafka_bootstrap, tmp_path, "settle"),
              "rebalance_timeout_s": 0.3}
    app_ids.append(config["app_id"])
    with AssemblerProcess(config, tmp_path) as worker:
        code = worker.proc.wait(timeout=120)
        worker.wait_for_line("assembler final stats", timeout_s=5)
    assert code == 1, worker.lines[-10:]
    gave_up = [line for line in worker.lines if "has not finished joining group" in line]
    assert gave_up and "rebalance_timeout_s=0.3" in gave_up[0], worker.lines[-10:]
    last = worker.lines[-1]
    assert last.startswith("stacx assemble: the assembler has not finished joining"), worker.lines[-5:]
    assert not [line for line in worker.lines if "Traceback" in line], worker.lines
    assert not [line for line in worker.lines if "[^---Recovery]: Worker ready" in line], worker.lines
