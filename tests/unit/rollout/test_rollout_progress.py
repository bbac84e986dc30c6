"""Progress output and the CLI report render from a real (fake-backed) run."""

from __future__ import annotations

import argparse

from rich.console import Console

from stacx.infra.commands import rollout as rollout_command
from stacx.infra.config_flags import config_overrides, resolve_lazy_flags
from stacx.rollout.data import ListTaskSource
from stacx.rollout.fakes import FakeEnvironments, FakeTokenizer, MemoryPublisher, ScriptedInference
from stacx.rollout.manager import RolloutManager
from stacx.rollout.progress import _render, live_progress, metrics_line, reward_table
from stacx.schemas.records import TaskSample


async def test_metrics_render_after_a_run() -> None:
    tok = FakeTokenizer()
    tasks = [
        TaskSample(task_id=f"t{i}", task_type="math", prompt="q", data='{"answer": 1}') for i in range(3)
    ]
    manager = RolloutManager(
        RolloutManager.Config(record_task_rewards=True),
        source=ListTaskSource(tasks),
        tokenizer=tok,
        inference=ScriptedInference(tok, lambda c, i: "<answer>1</answer>"),
        publisher=MemoryPublisher(),
        sandbox=FakeEnvironments(),
    )
    async with live_progress(manager, enabled=False):
        summary = await manager.run()
    metrics = manager.metrics()
    assert metrics["episodes_done"] == 3 and metrics["mean_reward_by_type"] == {"math": 1.0}
    assert "done=3" in metrics_line(metrics) and "completed=3" in metrics_line(metrics)
    console = Console(record=True, width=120)
    console.print(_render(metrics))
    console.print(reward_table({"math": (3, 1.0)}))
    text = console.export_text()
    assert "episodes done" in text and "math" in text and "1.000" in text
    report = rollout_command._report(summary)
    assert report["mean_reward_by_task"] == {"t0": 1.0, "t1": 1.0, "t2": 1.0}
    assert report["by_status"] == {"COMPLETED": 3}


def test_cli_registers_rollout_and_eval() -> None:
    parser = argparse.ArgumentParser()
    rollout_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["eval", "cfg.yaml", "--samples", "3", "--json", "out.json"])
    assert args.func is rollout_command._eval and args.samples == 3 and args.json_out == "out.json"
    rollout = parser._subparsers._group_actions[0].choices["rollout"]  # type: ignore[union-attr]
    resolve_lazy_flags(rollout)  # the flags generated from RolloutConfig (what `stacx rollout` adds)
    args = parser.parse_args(["rollout", "cfg.yaml", "--num_groups", "5", "--progress", "false"])
    assert args.func is rollout_command._rollout
    assert config_overrides(args) == {"num_groups": 5, "progress": False}


def test_cli_reports_a_bad_config_without_a_traceback(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.yaml"
    path.write_text("data: {path: x.jsonl}\nmanager: {max_concurrent: 3}\n")
    args = argparse.Namespace(config=str(path), explain=False)
    assert rollout_command._rollout(args) == 2
    assert "bad.yaml: manager.max_concurrent: unknown field; valid fields:" in capsys.readouterr().err
