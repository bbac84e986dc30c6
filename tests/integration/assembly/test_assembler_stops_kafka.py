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
