"""The run's trackers (`pipeline.tracking`): opened before the services start, fed by a consumer
thread of the orchestrator from the run's topics and the servers' metrics (stacx.infra.tracking)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from stacx.infra.pipeline.config import PipelineSpec
from stacx.infra.pipeline.errors import PipelineConfigError, PipelineError
from stacx.infra.pipeline.layout import RunLayout
from stacx.infra.pipeline.resolve import resolved_config
from stacx.infra.tracking import MetricsEndpoint, RunFigures, TrackingError, TrackingFeed, open_trackers
from stacx.infra.tracking.figures import Keeps
from stacx.infra.tracking.protocols import Outcome

__all__ = ["SFT_LOSS", "TRACKING_DIR", "outcome_of", "start_tracking", "tracking_group"]

SFT_LOSS = "sft/loss"
"""The warm start's loss, logged at each SFT step (its step is the SFT step, not a version)."""

log = logging.getLogger(__name__)

TRACKING_DIR = "tracking"
"""The trackers' folder in `runs/<name>/`: kept when the name runs again (each run is its own
run in every tracker), unlike the rest of the folder."""


def outcome_of(error: BaseException | None) -> Outcome:
    """How the trackers mark a run that ended with `error`: Ctrl-C and SIGTERM (which `stacx`
    turns into KeyboardInterrupt) kill it, any other error fails it."""
    if error is None:
        return "finished"
    return "killed" if isinstance(error, KeyboardInterrupt | SystemExit) else "failed"


def tracking_group(run_id: str) -> str:
    """The feed's consumer group: named after the run, so deleting the run deletes it."""
    return f"stacx-tracking-{run_id}"


def start_tracking(
    spec: PipelineSpec,
    layout: RunLayout,
    *,
    keeps: Keeps,
    inference_url: str,
    gateway_url: str,
    token: str,
    service_pids: Callable[[], Mapping[str, int]] | None = None,
) -> TrackingFeed | None:
    """The started feed of the run's trackers (None: no `pipeline.tracking`); `PipelineError`
    with one line when a tracker cannot be built."""
    tracking = spec.pipeline.tracking
    if tracking is None or not tracking.trackers:
        return None
    try:
        root = layout.root / TRACKING_DIR
        trackers = open_trackers(tracking, name=layout.name, run_id=layout.run_id, root=root)
    except TrackingError as exc:
        raise PipelineError(f"{spec.source}: pipeline.{exc}") from exc
    figures = RunFigures(
        settle_versions=tracking.settle_versions,
        samples_per_version=tracking.samples_per_version,
        success_reward=tracking.success_reward,
        keeps=keeps,
    )
    config = TrackingFeed.Config(
        bootstrap_servers=spec.bootstrap_servers,
        topics=[layout.topics.trajectories, layout.topics.batches, layout.topics.weights],
        group_id=tracking_group(layout.run_id),
        model_name=layout.model_name,
        summary_min_episodes=tracking.summary_min_episodes,
        model_info_url=f"{inference_url}/get_model_info",
        endpoints=[
            MetricsEndpoint("inference", f"{inference_url}/metrics"),
            MetricsEndpoint("gateway", f"{gateway_url}/metrics", {"Authorization": f"Bearer {token}"}),
        ],
    )
    settings = run_config(spec, layout)
    return TrackingFeed(config, trackers, figures, run_config=settings, service_pids=service_pids).start()


def run_config(spec: PipelineSpec, layout: RunLayout) -> dict[str, Any]:
    """What the trackers record as the run's configuration: every service's config with its
    defaults (`stacx run --explain`), not only the keys the user wrote; those too, as `source`."""
    try:
        resolved = resolved_config(spec, layout)
    except PipelineConfigError as exc:  # validated at load: only a model not made yet, say
        log.warning("tracking: the resolved config is not known (%s); the trackers get the file's", exc)
        resolved = {}
    return {
        "run_id": layout.run_id,
        "source": spec.source,
        "pipeline": spec.pipeline.model_dump(mode="json"),
        **resolved,
        "written": {"rollout": spec.rollout, "assembler": spec.assembler, "trainer": spec.trainer},
        "topics": asdict(layout.topics),
    }
