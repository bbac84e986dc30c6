"""The delayed-feedback join: logged calls x feedback events -> rewarded trajectories.

Per session (both topics are keyed by session id, so one partition holds all of a session):

- a call extends the open trajectory or closes it and starts another (`TrajectoryBuilder`);
  a closed trajectory waits for feedback;
- a feedback event names a session (rewarding all its unfinished trajectories) or one call
  (rewarding the trajectory holding it). It joins when it was created within `window_s` of the
  trajectory's last call; it closes an open trajectory (feedback ends the episode). A
  trajectory with feedback is emitted at once, or when its window ends if `wait_for_window`
  (then every feedback of the window is combined);
- feedback created after the window, or for a trajectory already finished, is *late*: it goes
  to the DLQ with the reason. Feedback naming nothing known is held for one window (its calls
  may still be on their way), then dead-lettered as unmatched;
- at each tick, trajectories whose window ended without feedback are *unrewarded*: dropped or
  emitted with `default_reward` (`unrewarded`), counted either way.

Times are event times (`created_at_ms`): for the window test of a feedback event, and for
expiring windows, which a tick ends at its partition's watermark (`consumers/oncall/clock.py`:
the slowest input's event time, less `grace_s`), so a lagging or restarted worker loses no
feedback that was on time. Emitted trajectories have deterministic ids and the join
is at-least-once: consumers drop duplicates by trajectory id.
"""

from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from stacx.consumers.oncall.trajectories import OpenTrajectory, TrajectoryBuilder
from stacx.schemas.records import AgentInteraction, Feedback, Trajectory

__all__ = ["FeedbackJoin", "JoinStats", "Joined", "Rejected", "SessionState", "feedback_id"]

log = logging.getLogger(__name__)

Unrewarded = Literal["drop", "default"]


def feedback_id(feedback: Feedback, topic: str, partition: int, offset: int) -> str:
    """The feedback's own id (`metadata.feedback_id`), else its Kafka coordinates (stable)."""
    return feedback.metadata.get("feedback_id") or f"{topic}:{partition}:{offset}"


@dataclass(kw_only=True, slots=True)
class JoinStats:
    """What the join did (per process)."""

    interactions: int = 0
    duplicate_interactions: int = 0
    merged_calls: int = 0
    new_trajectory_reasons: dict[str, int] = field(default_factory=dict)
    feedback: int = 0
    feedback_joined: int = 0
    feedback_late: int = 0
    feedback_unmatched: int = 0
    feedback_held: int = 0
    trajectories_rewarded: int = 0
    unrewarded_dropped: int = 0
    unrewarded_defaulted: int = 0
    invalid: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True, slots=True)
class Joined:
    """A trajectory ready to train on."""

    trajectory: Trajectory


@dataclass(kw_only=True, slots=True)
class Rejected:
    """An event for the DLQ, with why."""

    reason: str
    error_type: str


@dataclass(kw_only=True, slots=True)
class _Pending:
    """A closed trajectory waiting for its window to end (or for feedback)."""

    trajectory: OpenTrajectory
    feedback: list[dict[str, Any]] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class SessionState:
    """All the join keeps about one session (one value of the `sessions` table)."""

    partition: int = 0
    open: OpenTrajectory | None = None
    pending: list[_Pending] = field(default_factory=list)
    early_feedback: list[dict[str, Any]] = field(default_factory=list)
    """Feedback that matched nothing yet: kept one window, then dead-lettered."""
    finished_ids: list[str] = field(default_factory=list)
    """Interaction ids of finished trajectories (recent ones): late feedback is recognised."""
    finished_until_ms: int = 0
    """Last call time of the newest finished trajectory."""
    feedback_ids: list[str] = field(default_factory=list)
    """Recent feedback ids, to ignore redelivered feedback."""
    num_trajectories: int = 0

    def to_bytes(self) -> bytes:
        data = {
            "partition": self.partition,
            "open": self.open.to_dict() if self.open else None,
            "pending": [{"trajectory": p.trajectory.to_dict(), "feedback": p.feedback} for p in self.pending],
            "early_feedback": self.early_feedback,
            "finished_ids": self.finished_ids,
            "finished_until_ms": self.finished_until_ms,
            "feedback_ids": self.feedback_ids,
            "num_trajectories": self.num_trajectories,
        }
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> SessionState:
        data = json.loads(raw)
        opened = data.pop("open")
        pending = data.pop("pending")
        return cls(
            open=OpenTrajectory.from_dict(opened) if opened else None,
            pending=[
                _Pending(trajectory=OpenTrajectory.from_dict(p["trajectory"]), feedback=p["feedback"])
                for p in pending
            ],
            **data,
        )


class FeedbackJoin:
    """The join's logic over a `sessions` table (a Faust table in the worker, a dict in tests)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        window_s: float = 3600.0
        """Feedback joins a trajectory created at most this long after its last call."""
        wait_for_window: bool = False
        """Emit at the window's end, combining every feedback of the window (False: at the first)."""
        unrewarded: Unrewarded = "drop"
        """Trajectories without feedback at the window's end: `drop` or emit with `default_reward`."""
        grace_s: float = 10.0
        """How far behind the newest event of its input an event may still arrive (several
        producers, retries): windows end this long after the event-time watermark passes them."""
        default_reward: float = 0.0
        """Reward of unrewarded trajectories under `unrewarded: default`."""
        forget_after_s: float = 24 * 3600.0
        """A session with nothing open is forgotten this long after its last call (late feedback
        for it is then unmatched rather than late)."""
        max_tokens: int = 32_768
        """Longest trajectory; a call that would exceed it starts a new one."""
        max_finished_ids: int = 1_000
        """Interaction ids of finished trajectories remembered per session (late detection)."""

        def __post_init__(self) -> None:
            if self.window_s <= 0:
                raise ValueError(f"join.window_s={self.window_s}: use a positive number of seconds")
            if self.grace_s < 0:
                raise ValueError(f"join.grace_s={self.grace_s}: use a non-negative number of seconds")
            if self.unrewarded not in ("drop", "default"):
                raise ValueError(f"join.unrewarded={self.unrewarded!r}: use drop or default")

    def __init__(
        self, config: Config, sessions: MutableMapping[str, bytes], stats: JoinStats | None = None
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.stats = stats or JoinStats()
        self.builder = TrajectoryBuilder(config.max_tokens)
        self.stats.new_trajectory_reasons = self.builder.reasons

    @property
    def window_ms(self) -> int:
        return int(self.config.window_s * 1000)

    # -- events --------------------------------------------------------------------------------

    def on_interaction(self, interaction: AgentInteraction, *, partition: int = 0) -> list[Joined]:
        """One logged call; returns trajectories emitted because of it (early feedback)."""
        self.stats.interactions += 1
        state = self._load(interaction.session_id, partition)
        if self._seen(state, interaction.interaction_id):
            self.stats.duplicate_interactions += 1
            return []
        before = self.builder.num_merged
        ended = state.open is None and (state.num_trajectories > 0 or bool(state.pending))
        state.open, closed = self.builder.add(
            state.open, interaction, first_reason="after_feedback" if ended else "session_start"
        )
        self.stats.merged_calls += self.builder.num_merged - before
        if closed is not None:
            state.pending.append(_Pending(trajectory=closed))
        out = self._apply_early_feedback(state)
        self._save(interaction.session_id, state)
        return out

    def on_feedback(self, feedback: Feedback, fid: str, *, partition: int = 0) -> list[Joined | Rejected]:
        """One feedback event: joined (maybe emitting), late (DLQ), or held for its calls."""
        self.stats.feedback += 1
        state = self._load(feedback.session_id, partition)
        entry = _feedback_entry(feedback, fid)
        if fid in state.feedback_ids:  # redelivered (at-least-once): already applied
            return []
        state.feedback_ids = [*state.feedback_ids, fid][-self.config.max_finished_ids :]
        out: list[Joined | Rejected] = []
        targets = self._targets(state, feedback.interaction_id)
        if targets:
            out += self._attach(state, targets, entry)
        elif self._is_late(state, feedback):
            self.stats.feedback_late += 1
            out.append(Rejected(reason=self._late_reason(state, feedback), error_type="LateFeedback"))
        else:
            self.stats.feedback_held += 1
            state.early_feedback = [*state.early_feedback, entry]
        self._save(feedback.session_id, state)
        return out

    def on_tick(self, now_ms: int, *, partition: int | None = None) -> list[Joined | Rejected]:
        """End the windows over at `now_ms` (event time: the partition's watermark), of one
        partition's sessions or all."""
        out: list[Joined | Rejected] = []
        for session_id, raw in list(self.sessions.items()):
            state = SessionState.from_bytes(raw)
            if partition is not None and state.partition != partition:
                continue
            out += self._expire(state, now_ms)
            if self._forgettable(state, now_ms):
                del self.sessions[session_id]
                continue
            updated = state.to_bytes()
            if updated != raw:
                self.sessions[session_id] = updated
        return out

    def _forgettable(self, state: SessionState, now_ms: int) -> bool:
        idle = state.open is None and not state.pending and not state.early_feedback
        return idle and now_ms > state.finished_until_ms + int(self.config.forget_after_s * 1000)

    # -- joining -------------------------------------------------------------------------------

    def _targets(self, state: SessionState, interaction_id: str | None) -> list[OpenTrajectory]:
        """The trajectories feedback naming `interaction_id` (None: the whole session) rewards."""
        candidates = [p.trajectory for p in state.pending] + ([state.open] if state.open else [])
        if interaction_id is None:
            return candidates
        return [t for t in candidates if interaction_id in t.interaction_ids]

    def _attach(
        self, state: SessionState, targets: list[OpenTrajectory], entry: dict[str, Any]
    ) -> list[Joined | Rejected]:
        out: list[Joined | Rejected] = []
        joined = 0
        for target in targets:
            if entry["created_at_ms"] > target.last_ms + self.window_ms:
                continue
            joined += 1
            if state.open is target:  # feedback ends the episode
                state.pending.append(_Pending(trajectory=target))
                state.open = None
            for pending in state.pending:
                if pending.trajectory is target:
                    pending.feedback.append(entry)
        if joined:
            self.stats.feedback_joined += 1
            if not self.config.wait_for_window:
                out += self._emit_rewarded(state)
        else:
            self.stats.feedback_late += 1
            out.append(
                Rejected(
                    reason=f"late feedback: created {entry['created_at_ms']} ms, after "
                    f"the {self.config.window_s:g} s window of its trajectory's last "
                    f"call ({max(t.last_ms for t in targets)} ms)",
                    error_type="LateFeedback",
                )
            )
        return out

    def _apply_early_feedback(self, state: SessionState) -> list[Joined]:
        if not state.early_feedback:
            return []
        held, state.early_feedback = state.early_feedback, []
        out: list[Joined] = []
        for entry in held:
            targets = self._targets(state, entry["interaction_id"])
            if not targets:
                state.early_feedback.append(entry)
                continue
            self.stats.feedback_held -= 1
            out += [r for r in self._attach(state, targets, entry) if isinstance(r, Joined)]
        return out

    def _is_late(self, state: SessionState, feedback: Feedback) -> bool:
        if feedback.interaction_id is not None:
            return feedback.interaction_id in state.finished_ids
        return state.finished_until_ms > 0

    def _late_reason(self, state: SessionState, feedback: Feedback) -> str:
        what = (
            f"call {feedback.interaction_id}" if feedback.interaction_id else f"session {feedback.session_id}"
        )
        return (
            f"late feedback for {what}: its trajectories were already finished (window "
            f"{self.config.window_s:g} s after the last call at {state.finished_until_ms} ms)"
        )

    # -- emitting ------------------------------------------------------------------------------

    def _emit_rewarded(self, state: SessionState) -> list[Joined | Rejected]:
        out: list[Joined | Rejected] = []
        keep: list[_Pending] = []
        for pending in state.pending:
            if pending.feedback:
                out.append(Joined(trajectory=self._finish(state, pending, "feedback")))
            else:
                keep.append(pending)
        state.pending = keep
        return out

    def _expire(self, state: SessionState, now_ms: int) -> list[Joined | Rejected]:
        window = self.window_ms
        if state.open is not None and now_ms > state.open.last_ms + window:
            state.pending.append(_Pending(trajectory=state.open))
            state.open = None
        out: list[Joined | Rejected] = []
        keep: list[_Pending] = []
        for pending in state.pending:
            if now_ms <= pending.trajectory.last_ms + window:
                keep.append(pending)
            elif pending.feedback:
                out.append(Joined(trajectory=self._finish(state, pending, "feedback")))
            else:
                out += self._unrewarded(state, pending)
        state.pending = keep
        still = [e for e in state.early_feedback if now_ms <= e["created_at_ms"] + window]
        for _ in range(len(state.early_feedback) - len(still)):
            self.stats.feedback_held -= 1
            self.stats.feedback_unmatched += 1
            out.append(
                Rejected(
                    reason="unmatched feedback: no call of its session/interaction "
                    f"arrived within {self.config.window_s:g} s",
                    error_type="UnmatchedFeedback",
                )
            )
        state.early_feedback = still
        return out

    def _unrewarded(self, state: SessionState, pending: _Pending) -> list[Joined | Rejected]:
        if self.config.unrewarded == "drop":
            self.stats.unrewarded_dropped += 1
            self._mark_finished(state, pending.trajectory)
            return []
        self.stats.unrewarded_defaulted += 1
        return [Joined(trajectory=self._finish(state, pending, "default"))]

    def _finish(self, state: SessionState, pending: _Pending, source: str) -> Trajectory:
        rewards = (
            _combine(pending.feedback) if source == "feedback" else {"default": self.config.default_reward}
        )
        reward = float(np.sum(list(rewards.values())))
        meta = {
            "reward_source": source,
            "feedback_ids": ",".join(e["id"] for e in pending.feedback),
            "first_feedback_ms": str(min((e["created_at_ms"] for e in pending.feedback), default=0)),
        }
        trajectory = pending.trajectory.to_trajectory(
            sample_index=state.num_trajectories, reward=reward, rewards=rewards, metadata=meta
        )
        state.num_trajectories += 1
        if source == "feedback":
            self.stats.trajectories_rewarded += 1
        self._mark_finished(state, pending.trajectory)
        return trajectory

    def _mark_finished(self, state: SessionState, trajectory: OpenTrajectory) -> None:
        ids = [*state.finished_ids, *trajectory.interaction_ids]
        state.finished_ids = ids[-self.config.max_finished_ids :]
        state.finished_until_ms = max(state.finished_until_ms, trajectory.last_ms)

    # -- state ---------------------------------------------------------------------------------

    def _load(self, session_id: str, partition: int) -> SessionState:
        raw = self.sessions.get(session_id)
        return SessionState.from_bytes(raw) if raw is not None else SessionState(partition=partition)

    def _save(self, session_id: str, state: SessionState) -> None:
        self.sessions[session_id] = state.to_bytes()

    @staticmethod
    def _seen(state: SessionState, interaction_id: str) -> bool:
        open_ids = state.open.interaction_ids if state.open else []
        pending_ids = [i for p in state.pending for i in p.trajectory.interaction_ids]
        return (
            interaction_id in open_ids
            or interaction_id in pending_ids
            or interaction_id in state.finished_ids
        )


def _feedback_entry(feedback: Feedback, fid: str) -> dict[str, Any]:
    return {
        "id": fid,
        "session_id": feedback.session_id,
        "interaction_id": feedback.interaction_id,
        "reward": float(feedback.reward),
        "source": feedback.source,
        "components": dict(feedback.components),
        "created_at_ms": int(feedback.created_at_ms),
    }


def _combine(entries: list[dict[str, Any]]) -> dict[str, float]:
    """Reward per source: the mean of that source's feedback (a user who rates twice counts once)."""
    by_source: dict[str, list[float]] = {}
    for e in entries:
        by_source.setdefault(e["source"], []).append(float(e["reward"]))
    return {source: float(np.mean(values)) for source, values in by_source.items()}
