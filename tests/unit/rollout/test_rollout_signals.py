"""SIGTERM stops a rollout promptly (running episodes are cancelled, not drained one by one);
Ctrl-C drains first and cancels on the second press."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from stacx.rollout.service import _install_signals


class RecordingManager:
    def __init__(self) -> None:
        self.modes: list[str] = []

    def stop(self, mode: str = "drain") -> None:
        self.modes.append(mode)


async def _signalled(*signums: signal.Signals) -> tuple[list[str], list[signal.Signals]]:
    manager, received = RecordingManager(), []  # type: ignore[var-annotated]
    loop = asyncio.get_running_loop()
    _install_signals(manager, received)  # type: ignore[arg-type]
    try:
        for signum in signums:
            os.kill(os.getpid(), signum)
            for _ in range(50):
                await asyncio.sleep(0.01)
                if len(received) == signums.index(signum) + 1:
                    break
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return manager.modes, received


async def test_sigterm_cancels_the_running_episodes_at_once() -> None:
    modes, received = await _signalled(signal.SIGTERM)
    assert modes == ["cancel"] and received == [signal.SIGTERM]


async def test_ctrl_c_drains_then_cancels() -> None:
    modes, received = await _signalled(signal.SIGINT, signal.SIGINT)
    assert modes == ["drain", "cancel"] and received[0] is signal.SIGINT


def test_a_signal_stopped_run_exits_128_plus_its_number(monkeypatch: Any, capsys: Any) -> None:
    from stacx.infra.commands import rollout as command
    from stacx.rollout.manager import RolloutSummary

    async def stopped(config: Any, **kwargs: Any) -> RolloutSummary:
        return RolloutSummary(stopped_by=signal.SIGTERM)

    config: Any = type("C", (), {})()
    config.num_groups, config.kafka = None, type("K", (), {"publish": False, "follow_weights": False})()
    config.data = type("D", (), {"topic": None, "task_dirs": None})()
    monkeypatch.setattr(command, "_load", lambda path, args: config)
    monkeypatch.setattr("stacx.rollout.service.run_rollout", stopped)
    args: Any = type("A", (), {"config": "r.yaml", "explain": False})()
    assert command._rollout(args) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == "stacx rollout: stopped by SIGTERM"
