"""The metric list of docs/metrics.md is what the trackers hold: every series a run logs,
from real producers (a tiny GRPO trainer's published version, the inference server's and the
sandbox gateway's own Prometheus expositions, a real process tree, an evaluation), matches a
documented name, and every documented name is logged."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from stacx.infra.pipeline.evaluation import EvalResult, eval_figures
from stacx.infra.pipeline.tracking import SFT_LOSS
from stacx.infra.tracking import MetricsEndpoint, RunFigures
from stacx.infra.tracking import memory as memory_module
from stacx.infra.tracking.scrape import ScrapeRates
from stacx.rollout.inference.metrics import Metrics
from stacx.sandbox.backends.fake import FakeBackend
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.gateway import create_app
from stacx.sandbox.models import ExecResult
from stacx.sandbox.sessions import SessionManager
from stacx.schemas.records import TrainingBatch, Trajectory, TrajectoryStatus, Turn, WeightVersion

DOC = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"
SECTION = "## Every series"


def documented() -> list[str]:
    """The first-column names of the table under `SECTION`."""
    text = DOC.read_text()
    assert SECTION in text, f"{DOC}: no '{SECTION}' section"
    body = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", body, flags=re.M)


def _pattern(name: str) -> re.Pattern[str]:
    """`rollout/<task_type>/reward_mean` matches any one path part where `<...>` stands."""
    parts = re.split(r"(<[a-z_]+>)", name)
    return re.compile("".join("[^/]+" if p.startswith("<") else re.escape(p) for p in parts) + "$")


def _trajectory(n: int, version: int, reward: float, status: TrajectoryStatus) -> Trajectory:
    return Trajectory(
        trajectory_id=f"t{n}", group_id="g", sample_index=n, task_id=f"task{n}", task_type="math",
        model_name="policy", policy_version=version, reward=reward, rewards={"correct": reward},
        status=status, turns=[Turn(role="user", text="q"), Turn(role="assistant", text="a")],
        metadata={"duration_ms": str(1500 + n)},
        token_ids=np.arange(4, dtype=np.int32), loss_mask=np.array([0, 0, 1, 1], np.uint8),
    )


def _trainer_version(tmp_path: Path) -> WeightVersion:
    """The version a tiny GRPO trainer publishes after one step (its real `step.*` figures)."""
    from stacx.trainer import InMemoryBatchSource, InMemoryWeightPublisher, StacxTrainer
    from stacx.trainer.testing import synthetic_batches, tiny_trainer_config

    publisher = InMemoryWeightPublisher()
    config = tiny_trainer_config("grpo", tmp_path)
    StacxTrainer(config, source=InMemoryBatchSource(synthetic_batches(1)), publisher=publisher).run(1)
    published: WeightVersion = publisher.published[0]
    return published


def _run_figures(tmp_path: Path) -> set[str]:
    figures = RunFigures(settle_versions=1, keeps=lambda t, newest: True)
    for n, status in enumerate([TrajectoryStatus.COMPLETED, TrajectoryStatus.TRUNCATED]):
        figures.observe_trajectory(_trajectory(n, 0, float(n), status), 1000 + n)
    ints = np.zeros(1, np.int32)
    figures.observe_batch(TrainingBatch(
        batch_id="b", model_name="policy", trajectory_ids=["t0"], group_ids=["g"], task_types=["math"],
        policy_versions=ints, offsets=ints, lengths=ints, prompt_lengths=ints,
        token_ids=np.zeros(0, np.int32), loss_mask=np.zeros(0, np.uint8),
        logprobs=np.zeros(0, np.float32), rewards=np.ones(1, np.float32),
    ), 1500)
    version = _trainer_version(tmp_path)
    points = figures.observe_weights(dataclasses.replace(version, version=1), 2000)
    points += figures.observe_weights(dataclasses.replace(version, version=2), 3000)
    figures.note_swap(1, 2400)
    points += figures.swap_points()
    return {name for point in points + figures.flush() for name in point.metrics}


def _inference_figures() -> set[str]:
    metrics = Metrics()
    rates = ScrapeRates(MetricsEndpoint("inference", "http://127.0.0.1:1/metrics"))
    rates.figures(metrics.render(), now=1.0)
    metrics.inc("generated_tokens_total", 5)
    metrics.observe_latency(0.5)
    metrics.observe_batch(2)
    metrics.observe_prefix_cache(1, 2)
    return set(rates.figures(metrics.render(), now=2.0))


async def _gateway_figures() -> set[str]:
    def handler(sandbox: object, request: object) -> ExecResult:
        return ExecResult(exit_code=0, stdout="ok", stderr="", duration_s=0.01)

    manager = SessionManager(SessionManager.Config(owner="metric-list"), FakeBackend(handler))
    transport = httpx.ASGITransport(app=create_app(manager, token="t"))
    config = SandboxClient.Config(base_url="http://gateway", token="t", transport=transport)
    rates = ScrapeRates(MetricsEndpoint("gateway", "http://gateway/metrics"))
    async with manager, SandboxClient(config) as client:
        rates.figures(await client.metrics(), now=1.0)
        async with client.session() as info:
            await client.exec(info.id, "echo")
        return set(rates.figures(await client.metrics(), now=2.0))


def _memory_figures(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    monkeypatch.setattr(memory_module, "gpu_memory_by_pid", lambda: {os.getpid(): 1 << 30})  # a GPU host
    return set(memory_module.service_memory({"trainer": os.getpid()}))


def _pipeline_figures() -> set[str]:
    """What `stacx run` logs itself: each evaluation, and the warm start's loss per SFT step."""
    result = EvalResult(success=0.5, mean_reward=0.5, tool_rate=0.5, num_episodes=4, num_failed=0, version=3,
                        last_version=4, wall_s=1.0)
    return {*eval_figures(result), SFT_LOSS}


async def test_the_documented_metric_list_is_what_the_trackers_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = (_run_figures(tmp_path) | _inference_figures() | await _gateway_figures()
            | _memory_figures(monkeypatch) | _pipeline_figures())
    names = documented()
    patterns = {name: _pattern(name) for name in names}
    undocumented = sorted(h for h in held if not any(p.match(h) for p in patterns.values()))
    never_logged = sorted(n for n, p in patterns.items() if not any(p.match(h) for h in held))
    assert not undocumented, f"logged but not in {DOC.name}: {undocumented}"
    assert not never_logged, f"in {DOC.name} but never logged: {never_logged}"
    assert len(names) == len(set(names)), "a name is listed twice"
