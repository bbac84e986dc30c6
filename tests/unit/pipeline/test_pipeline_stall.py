"""The pipeline cannot stall silently (infra/pipeline/stall.py and the orchestrator's progress check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.consumers.assembly import FailurePolicy, SampleFilter
from stacx.consumers.assembly.testing import make_trajectory
from stacx.infra.pipeline.config import load_spec, parse_spec
from stacx.infra.pipeline.errors import PipelineConfigError, ServiceError, StallError
from stacx.infra.pipeline.monitor import RunMetrics, assembler_drop_reason, assembler_keeps
from stacx.infra.pipeline.orchestrator import Pipeline
from stacx.infra.pipeline.stall import Progress, StallWatch, diagnose, error_tail, likely_stuck
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import WedgingBackend, serve_gateway
from stacx.schemas.records import TrajectoryStatus, WeightVersion

REPO = Path(__file__).resolve().parents[3]


def test_watch_counts_seconds_since_the_last_change() -> None:
    watch = StallWatch(timeout_s=60)
    assert watch.observe(Progress(0, 0, 0), now=100.0) == 0
    assert watch.observe(Progress(0, 0, 0), now=130.0) == 30
    assert not watch.stalled(Progress(0, 0, 0), now=159.0)
    assert watch.stalled(Progress(0, 0, 0), now=160.0)
    assert watch.observe(Progress(1, 0, 0), now=170.0) == 0  # one trajectory resets it


@pytest.mark.parametrize(
    ("progress", "gateway_problem", "service"),
    [
        (Progress(500, 3, 3), "the Docker engine is not answering", "gateway"),
        (Progress(200, 4, 2), None, "trainer"),
        (Progress(200, 2, 2), None, "assembler"),  # 200 >= 3 batches of 64
        (Progress(0, 0, 0), None, "rollout"),
        (Progress(150, 2, 2), None, "rollout"),  # a partial batch: the assembler waits for more
        (Progress(200, 2, 2, usable=150), None, "rollout"),  # 50 failed: dropped by the assembler
        (Progress(250, 2, 2, usable=200), None, "assembler"),
    ],
)
def test_likely_stuck_stage(progress: Progress, gateway_problem: str | None, service: str) -> None:
    assert likely_stuck(progress, trajectories_per_batch=64, gateway_problem=gateway_problem)[0] == service


def test_failed_trajectories_the_assembler_drops_do_not_blame_the_assembler() -> None:
    """A deleted task folder: every episode fails, the assembler drops them all (its default
    failure policy), so the stage to look at is the rollout, not the assembler."""
    filtering = SampleFilter.Config()
    metrics = RunMetrics(keeps=assembler_keeps(filtering), drop_reason=assembler_drop_reason(filtering))
    for index in range(200):
        status = TrajectoryStatus.TRUNCATED if index % 2 else TrajectoryStatus.FAILED
        metrics.observe_trajectory(make_trajectory(f"g{index // 8}", index % 8, status=status))
    for index in range(8):
        metrics.observe_trajectory(make_trajectory("ok", index))
    progress = Progress(metrics.num_trajectories, 0, 0, usable=metrics.num_usable_trajectories,
                        dropped=tuple(metrics.dropped.most_common(3)))
    assert (progress.trajectories, progress.usable) == (208, 8)
    service, why = likely_stuck(progress, trajectories_per_batch=64, gateway_problem=None)
    assert service == "rollout", why
    assert "200 of 208 trajectories on the topic are dropped by the assembler (" in why
    assert "100 status TRUNCATED is not in assembler.filtering.ok_statuses [COMPLETED]" in why
    assert "100 status FAILED is not in assembler.filtering.ok_statuses" in why
    assert "failed or too stale" not in why  # a TRUNCATED episode is no failure


def test_the_usable_count_follows_the_assembler_filtering_section() -> None:
    """Flagged failures are trained on (counted); stale samples are dropped (not counted)."""
    keeps = assembler_keeps(SampleFilter.Config(failure_policy=FailurePolicy.FLAG, max_staleness=1))
    metrics = RunMetrics(keeps=keeps)
    metrics.observe_trajectory(make_trajectory("a", 0, status=TrajectoryStatus.FAILED))
    metrics.observe_weights(WeightVersion(model_name="policy", version=3, path="/w/3"))
    metrics.observe_trajectory(make_trajectory("b", 0, policy_version=1))  # lag 2 > 1: stale
    metrics.observe_trajectory(make_trajectory("c", 0, policy_version=2))
    assert (metrics.num_trajectories, metrics.num_usable_trajectories) == (3, 2)


def test_error_tail_prefers_error_lines(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    log.write_text("step 1\nERROR rank0: allreduce failed\nstep 2 waiting\nstep 2 waiting\n")
    assert "allreduce failed" in error_tail(log)
    assert "step 2 waiting" not in error_tail(log)
    assert "no log at" in error_tail(tmp_path / "absent.log")


def test_diagnosis_names_stage_reason_log_lines_and_logs_dir(tmp_path: Path) -> None:
    (tmp_path / "trainer.log").write_text("INFO ok\nTraceback (most recent call last):\nValueError: nan\n")
    text = diagnose(
        Progress(120, 3, 1), stalled_s=301, trajectories_per_batch=64, gateway_problem=None, logs_dir=tmp_path
    )
    assert "nothing moved for 301s" in text
    assert "Most likely stuck: trainer (2 batch(es)" in text
    assert "ValueError: nan" in text and str(tmp_path) in text and "stall_timeout_s" in text


def test_a_rollout_worker_idle_with_unread_tasks_is_named_in_the_diagnosis(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's own stall line (tasks unread on its partitions, polls returning none) is what
    the diagnosis quotes when the rollout holds the run up."""
    import asyncio
    import logging

    from stacx.rollout.task_stream import KafkaTaskSource

    class Stranded:
        def poll(self, timeout: float) -> None:
            return None

        def lag(self) -> dict[tuple[str, int], int]:
            return {("stacx.tasks", 3): 7723}

        def resume(self) -> None:
            pass

    config = KafkaTaskSource.Config(bootstrap_servers="unused", poll_timeout_s=0, stranded_check_s=1e-9,
                                    max_idle_polls=3)
    source = KafkaTaskSource(config, consumer=Stranded())
    with caplog.at_level(logging.ERROR):
        assert asyncio.run(source.next_group()) is None
    lines = [f"ERROR {record.name}: {record.getMessage()}\n" for record in caplog.records]
    (tmp_path / "rollout.log").write_text("".join(lines))
    text = diagnose(Progress(40, 5, 5), stalled_s=301, trajectories_per_batch=8, gateway_problem=None,
                    logs_dir=tmp_path)
    assert "Most likely stuck: rollout" in text
    assert "rollout worker stalled: 7723 unread tasks on stacx.tasks/3 (7723)" in text


def test_stall_timeout_is_validated() -> None:
    with pytest.raises(PipelineConfigError, match="stall_timeout_s"):
        parse_spec({"pipeline": {"stall_timeout_s": 0}})


def test_orchestrator_stops_a_stalled_run_naming_the_wedged_engine(tmp_path: Path) -> None:
    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    spec.pipeline.runs_dir = str(tmp_path)
    pipeline = Pipeline(spec)
    backend = WedgingBackend()
    try:
        with serve_gateway(backend, token=None, config=SessionManager.Config(owner="stall")) as url:
            pipeline.spec.gateway["port"] = int(url.rsplit(":", 1)[1])
            import httpx

            assert httpx.post(f"{url}/v1/sessions", json={}, timeout=30).status_code == 503
            watch = StallWatch(timeout_s=5)
            watch.observe(pipeline._progress(), now=0.0)  # nothing has moved since t=0
            watch._since = -10.0
            with pytest.raises(StallError) as info:
                pipeline._check_progress(watch)
    finally:
        backend.release.set()
        backend.guard.close()
    message = str(info.value)
    assert "Most likely stuck: gateway" in message
    assert "Docker engine" in message and "not answering" in message
    assert str(pipeline.layout.logs_dir) in message


@pytest.mark.parametrize(("server", "target", "ok"), [("7", 7, True), ("9", 7, True), ("6", 7, False)])
def test_final_swap_wait_accepts_the_published_version_or_a_later_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str, target: int, ok: bool) -> None:
    """The trainer may step once more on batches assembled before the rollout stopped: a server
    ahead of the last version the monitor saw has the final weights."""
    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    spec.pipeline.runs_dir = str(tmp_path)
    pipeline = Pipeline(spec)
    monkeypatch.setattr(pipeline, "_server_version", lambda: server)
    if ok:
        pipeline._await_swap(target, timeout_s=1.0)
        return
    with pytest.raises(ServiceError, match=f"still reports weight_version {server}"):
        pipeline._await_swap(target, timeout_s=1.0)
