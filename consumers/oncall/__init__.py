"""On-call RL stream processing: logged calls -> trajectories (prefix merge) -> joined with
delayed feedback -> rewarded trajectories for the online learner. See docs/oncall.md."""

from stacx.consumers.oncall.app import ONCALL_TICK_KEY, OncallJoinApp, ensure_join_topics
from stacx.consumers.oncall.join import FeedbackJoin, Joined, JoinStats, Rejected, SessionState, feedback_id
from stacx.consumers.oncall.trajectories import (
    OpenTrajectory,
    TrajectoryBuilder,
    interaction_split,
    trajectory_id_for,
)

__all__ = [
    "ONCALL_TICK_KEY",
    "FeedbackJoin",
    "JoinStats",
    "Joined",
    "OncallJoinApp",
    "OpenTrajectory",
    "Rejected",
    "SessionState",
    "TrajectoryBuilder",
    "ensure_join_topics",
    "feedback_id",
    "interaction_split",
    "trajectory_id_for",
]
