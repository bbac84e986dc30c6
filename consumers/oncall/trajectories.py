"""Trajectories from logged calls: the prefix-merge rule.

Consecutive calls of one session become one trajectory while each call's prompt extends the
previous prompt + completion token for token; the tokens between the two (the tool result, the
user's next message, the template's markers) are loss-masked, only generated tokens get mask 1.
Otherwise the open trajectory is closed and a new one starts, and `reasons` counts why:

- `session_start`: the session's first call;
- `after_feedback`: the session's previous trajectory was ended by its feedback;
- `history_changed`: the prompt differs from the previous prompt (the client dropped, edited or
  summarised earlier turns, or another conversation runs under the same session id);
- `response_rerendered`: the prompt repeats the previous prompt but not the previous
  completion's tokens (the client re-rendered the answer, e.g. re-serialised a tool call, or
  this is another sample of the same prompt);
- `model_changed`: another served model answered;
- `temperature_changed`: the call was sampled at another temperature than the open trajectory's
  calls (a trajectory has one temperature: the trainer rescales its logits by it, and the
  logprobs of every merged call must have been taken at it);
- `max_length`: merging would exceed `max_tokens`.

Legend: P = prompt tokens of a call, C = its completion tokens, L = tokens of the open trajectory.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stacx.schemas.records import AgentInteraction, Trajectory, TrajectoryStatus, Turn

__all__ = ["OpenTrajectory", "TrajectoryBuilder", "interaction_split", "trajectory_id_for"]

REASONS = (
    "session_start",
    "after_feedback",
    "history_changed",
    "response_rerendered",
    "model_changed",
    "temperature_changed",
    "max_length",
)


def trajectory_id_for(session_id: str, first_interaction_id: str) -> str:
    """Deterministic: the same calls always make the same trajectory id (consumers dedupe)."""
    key = f"oncall\x1f{session_id}\x1f{first_interaction_id}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def interaction_split(interaction: AgentInteraction) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, completion ids, completion logprobs) of one logged call.

    The prompt length comes from `metadata["prompt_length"]` (the proxy sets it), else from the
    loss mask (the prompt is the masked prefix). Raises ValueError for inconsistent events.
    """
    ids = [int(t) for t in interaction.token_ids]
    if "prompt_length" in interaction.metadata:
        num_prompt = int(interaction.metadata["prompt_length"])
    else:
        mask = list(interaction.loss_mask)
        num_prompt = mask.index(1) if 1 in mask else len(ids)
    if not 0 < num_prompt <= len(ids):
        raise ValueError(f"prompt_length {num_prompt} does not fit {len(ids)} token ids")
    lps = [float(x) for x in interaction.logprobs]
    if lps and len(lps) != len(ids):
        raise ValueError(f"{len(lps)} logprobs for {len(ids)} token ids")
    return ids[:num_prompt], ids[num_prompt:], lps[num_prompt:] if lps else [0.0] * (len(ids) - num_prompt)


@dataclass(kw_only=True, slots=True)
class OpenTrajectory:
    """A trajectory being built from one session's calls (JSON-serialisable state)."""

    trajectory_id: str
    session_id: str
    model_name: str
    agent_name: str
    task_type: str
    start_reason: str
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    last_prompt_length: int = 0
    """Length of the last call's prompt (where its completion starts)."""
    interaction_ids: list[str] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    call_times_ms: list[int] = field(default_factory=list)
    temperature: float = 1.0
    episode_id: str = ""

    @property
    def last_ms(self) -> int:
        return self.call_times_ms[-1] if self.call_times_ms else 0

    def append(
        self, prompt: list[int], completion: list[int], lps: list[float], interaction: AgentInteraction
    ) -> None:
        """Add one call whose prompt extends this trajectory (mask 0 on the new prompt part)."""
        new_part = prompt[len(self.token_ids) :]  # [P - L]
        self.last_prompt_length = len(prompt)
        self.token_ids += new_part + completion
        self.loss_mask += [0] * len(new_part) + [1] * len(completion)
        self.logprobs += [0.0] * len(new_part) + lps
        self.interaction_ids.append(interaction.interaction_id)
        self.policy_versions.append(int(interaction.policy_version))
        self.responses.append(interaction.response)
        self.call_times_ms.append(int(interaction.created_at_ms))

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpenTrajectory:
        return cls(**data)

    def to_trajectory(
        self, *, sample_index: int, reward: float, rewards: dict[str, float], metadata: dict[str, str]
    ) -> Trajectory:
        """The training-ready record (one assistant turn per merged call)."""
        turns = [
            Turn(role="assistant", text=text, policy_version=version, started_at_ms=at)
            for text, version, at in zip(
                self.responses, self.policy_versions, self.call_times_ms, strict=True
            )
        ]
        return Trajectory(
            trajectory_id=self.trajectory_id,
            group_id=self.session_id,
            sample_index=sample_index,
            task_id=self.episode_id or self.session_id,
            task_type=self.task_type,
            model_name=self.model_name,
            policy_version=min(self.policy_versions, default=0),
            turns=turns,
            token_ids=np.asarray(self.token_ids, dtype=np.int32),
            loss_mask=np.asarray(self.loss_mask, dtype=np.uint8),
            logprobs=np.asarray(self.logprobs, dtype=np.float32),
            temperature=self.temperature,
            prompt_length=self.prompt_length,
            rewards=rewards,
            reward=reward,
            status=TrajectoryStatus.COMPLETED,
            metadata={
                "session_id": self.session_id,
                "agent_name": self.agent_name,
                "start_reason": self.start_reason,
                "interaction_ids": ",".join(self.interaction_ids),
                "policy_versions": ",".join(map(str, self.policy_versions)),
                "last_interaction_ms": str(self.last_ms),
                **metadata,
            },
        )


class TrajectoryBuilder:
    """Applies the prefix-merge rule (module docstring) and counts why trajectories start."""

    def __init__(self, max_tokens: int = 32_768) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens}: a trajectory needs at least one token")
        self.max_tokens = max_tokens
        self.reasons: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.num_merged = 0
        """Calls appended to an open trajectory."""

    def add(
        self,
        current: OpenTrajectory | None,
        interaction: AgentInteraction,
        *,
        first_reason: str = "session_start",
    ) -> tuple[OpenTrajectory, OpenTrajectory | None]:
        """Add one call: (the open trajectory now, the one it closed or None). `first_reason`
        names why a trajectory starts when none is open."""
        prompt, completion, lps = interaction_split(interaction)
        reason = self.break_reason(current, interaction, prompt, completion)
        if current is None:
            reason = first_reason
        if reason is None:
            assert current is not None
            current.append(prompt, completion, lps, interaction)
            self.num_merged += 1
            return current, None
        self.reasons[reason] += 1
        fresh = self.start(interaction, reason)
        fresh.append(prompt, completion, lps, interaction)
        return fresh, current

    def break_reason(
        self,
        current: OpenTrajectory | None,
        interaction: AgentInteraction,
        prompt: list[int],
        completion: list[int],
    ) -> str | None:
        """Why this call cannot extend `current` (None: it can)."""
        if current is None:
            return "session_start"
        if interaction.model_name != current.model_name:
            return "model_changed"
        if _temperature(interaction.metadata.get("temperature")) != current.temperature:
            return "temperature_changed"
        context = current.token_ids  # [L]
        if prompt[: len(context)] != context:
            return (
                "response_rerendered"
                if _common_prefix(prompt, context) >= current.last_prompt_length
                else "history_changed"
            )
        if len(prompt) + len(completion) > self.max_tokens:
            return "max_length"
        return None

    @staticmethod
    def start(interaction: AgentInteraction, reason: str) -> OpenTrajectory:
        meta = interaction.metadata
        prompt_length = len(interaction_split(interaction)[0])
        return OpenTrajectory(
            trajectory_id=trajectory_id_for(interaction.session_id, interaction.interaction_id),
            session_id=interaction.session_id,
            model_name=interaction.model_name,
            agent_name=interaction.agent_name,
            task_type=interaction.task_type,
            start_reason=reason,
            prompt_length=prompt_length,
            temperature=_temperature(meta.get("temperature")),
            episode_id=meta.get("episode_id", ""),
        )


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _temperature(value: str | None) -> float:
    """The logprobs' temperature: 0 (greedy) or unknown means 1 (see Trajectory.temperature)."""
    try:
        t = float(value) if value else 1.0
    except ValueError:
        return 1.0
    return t if t > 0 else 1.0
