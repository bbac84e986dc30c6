"""Run metrics, the live view, the report files, preflight and the SFT batch packing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from stacx.infra.pipeline.config import SFTConfig, parse_spec
from stacx.infra.pipeline.errors import MissingComponentError
from stacx.infra.pipeline.monitor import EvalPoint, RunMetrics
from stacx.infra.pipeline.report import plot_curve, write_report
from stacx.infra.pipeline.view import render, status_line
from stacx.schemas.records import Trajectory, TrajectoryStatus, WeightVersion


def _trajectory(version: int, reward: float, tools: int, status: str = "COMPLETED") -> Trajectory:
    return Trajectory(trajectory_id=f"t{version}{reward}{tools}", group_id="g", sample_index=0,
                      task_id="x", task_type="arithmetic_tool", model_name="policy",
                      policy_version=version, reward=reward, status=TrajectoryStatus(status),
                      metadata={"num_tool_calls": str(tools)})


def test_metrics_aggregate_reward_tool_use_and_staleness_per_version() -> None:
    m = RunMetrics(started=0.0)
    m.observe_weights(WeightVersion(model_name="policy", version=2, path="/w"))
    m.observe_trajectory(_trajectory(1, 1.0, 1), now=10.0)
    m.observe_trajectory(_trajectory(1, 0.0, 0), now=10.0)
    m.observe_trajectory(_trajectory(2, 1.0, 2, "FAILED"), now=10.0)
    assert m.reward_curve() == [
        {"version": 1, "mean_reward": 0.5, "tool_rate": 0.5, "episodes": 2},
        {"version": 2, "mean_reward": 1.0, "tool_rate": 1.0, "episodes": 1}]
    assert m.by_version[2].failed == 1
    assert m.mean_staleness() == pytest.approx(2 / 3)
    assert m.events_per_s(window_s=30.0, now=20.0) == pytest.approx(3 / 20.0)
    assert m.latest_training_stats() is not None and m.latest_training_stats()[0] == 2


def test_older_weight_versions_do_not_move_the_policy_version_back() -> None:
    m = RunMetrics(started=0.0)
    m.observe_weights(WeightVersion(model_name="policy", version=3, path="/w"))
    m.observe_weights(WeightVersion(model_name="policy", version=1, path="/w"))
    assert m.policy_version == 3 and len(m.trainer_steps) == 1


def test_view_and_status_line_show_every_figure() -> None:
    from rich.console import Console

    m = RunMetrics()
    m.observe_trajectory(_trajectory(0, 1.0, 1))
    m.evals.append(EvalPoint(version=0, success=0.31, tool_rate=0.3, num_episodes=10, wall_s=1))
    line = status_line(m, target_steps=20)
    for label in ("policy version", "mean reward", "held-out success", "tool-use rate",
                  "staleness", "events/s"):
        assert label in line
    console = Console(record=True, width=120)
    console.print(render(m, title="t", target_steps=20))
    assert "0.31 at v0" in console.export_text()


def test_report_and_curve_are_written(tmp_path: Path) -> None:
    m = RunMetrics()
    for v in range(3):
        m.observe_trajectory(_trajectory(v, v / 2, 1))
    m.evals.append(EvalPoint(version=2, success=0.8, tool_rate=0.9, num_episodes=4, wall_s=3))
    png = plot_curve(tmp_path / "curve.png", m, title="test", min_episodes=1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path = write_report(tmp_path / "r" / "report.json", {"success_after": 0.8})
    assert json.loads(path.read_text()) == {"success_after": 0.8}


def test_preflight_reports_an_unreachable_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    from stacx.infra.pipeline import preflight

    monkeypatch.setattr(preflight, "_ports_problems", lambda spec: [])
    spec = parse_spec({"bootstrap_servers": "127.0.0.1:1",
                       "pipeline": {"model": {"tiny": {}}, "tasks": {"topic": "stacx.tasks"}},
                       "gateway": {"backend": "process"},
                       "rollout": {"data": {"samples_per_task": 8}}})
    with pytest.raises(MissingComponentError, match="Kafka at 127.0.0.1:1 did not answer"):
        preflight.check_all(spec)


def test_demonstration_batches_mask_observations_and_are_valid(tmp_path: Path) -> None:
    from quickstart_plugin import arithmetic

    from stacx.infra.pipeline.sft import DemonstrationEncoder, demonstration_batches
    from stacx.rollout.models import make_tokenizer
    from stacx.rollout.tokens import HFTokenizer
    from stacx.trainer import validate_batch

    source = arithmetic().ArithmeticTasks(num_train=4, num_heldout=4, skill_tool_fraction=1.0)
    tokenizer = HFTokenizer(make_tokenizer())
    encoder = DemonstrationEncoder(tokenizer=tokenizer)
    batches = demonstration_batches(
        source.demonstration, encoder, SFTConfig(steps=2, skill_steps=2, batch_size=16),
        end_token="<|im_end|>")
    assert len(batches) == 2 and batches[0].batch_id != batches[1].batch_id
    batch = batches[0]
    validate_batch(batch)
    start, length = int(batch.offsets[0]), int(batch.lengths[0])
    ids = batch.token_ids[start:start + length]
    mask = batch.loss_mask[start:start + length]
    trained = tokenizer.decode([int(i) for i, m in zip(ids, mask, strict=True) if m])
    assert trained.startswith("<tool_call>print(") and trained.endswith("</answer><|im_end|>")
    assert "<tool_response>" not in trained  # observations are never trained on
    assert int(batch.prompt_lengths[0]) == int(np.argmax(mask))
    prompt = tokenizer.decode([int(i) for i in ids[: int(batch.prompt_lengths[0])]])
    assert prompt.startswith("<|im_start|>user\nWhat is ") and "system" not in prompt


def test_the_monitor_keeps_one_episode_trace_per_policy_version() -> None:
    from stacx.infra.pipeline.monitor import TopicMonitor

    m = RunMetrics(started=0.0)
    monitor = TopicMonitor(m, bootstrap_servers="127.0.0.1:1", trajectories_topic="t", batches_topic="b",
                           weights_topic="w", model_name="policy")
    first = f"00-{'a' * 32}-{'1' * 16}-01".encode()
    monitor._dispatch(_trajectory(1, 1.0, 1), {})  # untraced: no id
    monitor._dispatch(_trajectory(1, 0.0, 0), {"traceparent": first})
    monitor._dispatch(_trajectory(1, 0.0, 1), {"traceparent": f"00-{'b' * 32}-{'2' * 16}-01".encode()})
    monitor._dispatch(_trajectory(2, 0.0, 1), None)
    assert m.by_version[1].trace_id == "a" * 32
    assert m.by_version[2].trace_id == ""


def test_without_a_terminal_a_status_line_comes_in_every_stage(caplog: pytest.LogCaptureFixture) -> None:
    """Off a terminal (`make demo | tee`), the status line is logged by a ticker of its own: the
    SFT warm start, which calls no refresh, is not minutes of silence."""
    from types import SimpleNamespace

    from stacx.infra.pipeline.orchestrator import Pipeline

    run = SimpleNamespace(
        layout=SimpleNamespace(run_id="r"), cfg=SimpleNamespace(live=True, steps=20),
        metrics=RunMetrics(started=0.0, stage="SFT warm start: step 7/450"), _tick=Pipeline._tick,
    )
    with caplog.at_level("INFO", logger="stacx.infra.pipeline.orchestrator"):
        with Pipeline._live(run):  # type: ignore[arg-type]
            for _ in range(200):  # an upper bound against a hang, not a timing assertion
                if "SFT warm start: step 7/450" in caplog.text:
                    break
                time.sleep(0.05)
    assert "stage: SFT warm start: step 7/450" in caplog.text
