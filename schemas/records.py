"""Typed records carried by STACX topics.

Token arrays are numpy arrays in memory and travel as packed little-endian `bytes`
(int32 ids, uint8 loss mask, float32 logprobs); see `schemas/avsc/`.
Timestamps are milliseconds since the Unix epoch (UTC).
"""

from __future__ import annotations

import enum
import hashlib
import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

TokenIds = npt.NDArray[np.int32]
LossMask = npt.NDArray[np.uint8]
Logprobs = npt.NDArray[np.float32]


def now_ms() -> int:
    """Current wall-clock time in epoch milliseconds."""
    return int(time.time() * 1000)


def token_ids(values: object = ()) -> TokenIds:
    return np.asarray(values, dtype=np.int32)


def loss_mask(values: object = ()) -> LossMask:
    return np.asarray(values, dtype=np.uint8)


def logprobs(values: object = ()) -> Logprobs:
    return np.asarray(values, dtype=np.float32)


def trajectory_id(task_id: str, group_id: str, sample_index: int, policy_version: int) -> str:
    """Deterministic id: the same episode always gets the same id, so consumers drop duplicates."""
    key = f"{task_id}\x1f{group_id}\x1f{sample_index}\x1f{policy_version}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class TrajectoryStatus(enum.StrEnum):
    COMPLETED = "COMPLETED"
    TRUNCATED = "TRUNCATED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"


@dataclass(kw_only=True, slots=True)
class ToolCall:
    """One tool invocation the model asked for."""

    id: str
    name: str
    arguments: str
    """JSON-encoded arguments, exactly as the model produced them."""


@dataclass(kw_only=True, slots=True)
class Turn:
    """One message of an episode: a model turn or an environment/tool observation."""

    role: str
    """`system`, `user`, `assistant` or `tool`."""
    text: str
    token_ids: TokenIds = field(default_factory=token_ids)
    tool_calls: list[ToolCall] = field(default_factory=list)
    observation: str | None = None
    policy_version: int | None = None
    """Weight version that generated this turn (assistant turns only)."""
    started_at_ms: int = 0
    duration_ms: int = 0
    teacher_token_ids: TokenIds = field(default_factory=lambda: token_ids())
    """Teacher in the loop: the teacher's action on the state before this turn (DAgger label)."""
    teacher_logprobs: Logprobs = field(default_factory=lambda: logprobs())
    """Teacher in the loop: the teacher's logprobs of this turn's tokens (scored for OPD, or its
    own when it acted)."""
    actor: str | None = None
    """`student` or `teacher`: who acted under a beta mixture (None: no teacher in the loop)."""


@dataclass(kw_only=True, slots=True)
class Trajectory:
    """One sampled episode, training-ready: the exact tokens the model saw and produced."""

    trajectory_id: str
    group_id: str
    sample_index: int
    task_id: str
    task_type: str
    model_name: str
    policy_version: int
    """Weight version at the start of the episode (per-turn versions are in `turns`)."""
    turns: list[Turn] = field(default_factory=list)
    token_ids: TokenIds = field(default_factory=token_ids)
    loss_mask: LossMask = field(default_factory=loss_mask)
    """1 on model-generated tokens, 0 on prompt, observation and template tokens."""
    logprobs: Logprobs = field(default_factory=logprobs)
    """Sampling logprob per token (0.0 where loss_mask is 0)."""
    teacher_logprobs: Logprobs = field(default_factory=lambda: logprobs())
    """Teacher in the loop (OPD): per token, the teacher's logprob of the student's token (0 where
    none was asked); empty when no teacher was asked."""
    temperature: float = 1.0
    """Temperature of the distribution `logprobs` come from, log_softmax(logits / T); 0 (greedy)
    means 1. The trainer recomputes its logprobs at this temperature."""
    prompt_length: int = 0
    rewards: dict[str, float] = field(default_factory=dict)
    reward: float = 0.0
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED
    error: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    created_at_ms: int = field(default_factory=now_ms)


@dataclass(kw_only=True, slots=True)
class TaskSample:
    """One task to roll out (a row of tasks.jsonl, or an event on `stacx.tasks`)."""

    task_id: str
    task_type: str
    prompt: str
    """Instruction shown to the agent."""
    data: str = "{}"
    """JSON-encoded task payload (expected answer, reward-function arguments, ...)."""
    task_dir: str | None = None
    """Harbor-format task directory, when the task runs a verifier in a sandbox."""
    image: str | None = None
    """Sandbox image the task runs in."""
    priority: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    created_at_ms: int = field(default_factory=now_ms)


@dataclass(kw_only=True, slots=True)
class TrainingBatch:
    """Packed, loss-masked sequences ready for one optimiser step.

    Sequence i spans `token_ids[offsets[i]:offsets[i] + lengths[i]]` (same for mask and logprobs).
    """

    batch_id: str
    """Derived from the member trajectory ids: re-assembly yields the same id."""
    model_name: str
    trajectory_ids: list[str]
    group_ids: list[str]
    task_types: list[str]
    policy_versions: npt.NDArray[np.int32]
    offsets: npt.NDArray[np.int32]
    lengths: npt.NDArray[np.int32]
    prompt_lengths: npt.NDArray[np.int32]
    token_ids: TokenIds
    loss_mask: LossMask
    logprobs: Logprobs
    rewards: npt.NDArray[np.float32]
    advantages: npt.NDArray[np.float32] | None = None
    temperatures: npt.NDArray[np.float32] | None = None
    """Per sequence: the sampling temperature of its logprobs (None: all 1)."""
    logprobs_recorded: npt.NDArray[np.uint8] | None = None
    """Per sequence: 1 when `logprobs` holds sampled logprobs, 0 when none were recorded.
    None (older producers): a row whose logprobs are all 0 on its mask counts as not recorded."""
    teacher_logprobs: npt.NDArray[np.float32] | None = None
    """Per token: the teacher's logprob of each token a served teacher scored (OPD), 0 elsewhere;
    None when no teacher was asked."""
    metadata: dict[str, str] = field(default_factory=dict)
    created_at_ms: int = field(default_factory=now_ms)

    @property
    def num_sequences(self) -> int:
        return len(self.trajectory_ids)


@dataclass(kw_only=True, slots=True)
class WeightVersion:
    """A published policy (or other role) checkpoint that inference servers can load."""

    model_name: str
    """Kafka key: the model or role name."""
    version: int
    path: str
    """Directory (or fsspec URL) with HF-layout safetensors."""
    step: int = 0
    format: str = "hf-safetensors"
    trainer_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    """`recipe`, `batch_id`, and `step.<figure>` (STEP_FIGURE_PREFIX): the figures of the step that
    made the version."""
    created_at_ms: int = field(default_factory=now_ms)
    content_hash: str = ""
    """`sha256:<hex>` of the weights ("" from writers before it existed): a version number is
    never announced with two different hashes, and subscribers refuse one that conflicts."""


def export_dir_name(step: int) -> str:
    """The folder the policy exported at `step` gets under its model's export root
    (`v00000006`): zero-padded, so names sort as steps do."""
    return f"v{step:08d}"


STEP_FIGURE_PREFIX = "step."
"""`WeightVersion.metadata` keys `step.<figure>` carry, as exact float text, the figures of the
trainer step that made the version: `loss`, `num_tokens`, `seconds`, and each role's loss terms and
model's grad norm (`policy/kl`, `policy/grad_norm`), so readers of the weights topic (trackers, the
run view) see the trainer's figures per version without asking the trainer."""


@dataclass(kw_only=True, slots=True)
class AgentInteraction:
    """One model call of a deployed agent (on-call RL)."""

    session_id: str
    interaction_id: str
    agent_name: str
    model_name: str
    policy_version: int
    messages: str
    """JSON-encoded chat messages sent to the model."""
    response: str
    token_ids: TokenIds = field(default_factory=token_ids)
    loss_mask: LossMask = field(default_factory=loss_mask)
    logprobs: Logprobs = field(default_factory=logprobs)
    task_type: str = "production"
    metadata: dict[str, str] = field(default_factory=dict)
    created_at_ms: int = field(default_factory=now_ms)


@dataclass(kw_only=True, slots=True)
class Feedback:
    """A (possibly delayed) reward for a session or one of its interactions."""

    session_id: str
    reward: float
    interaction_id: str | None = None
    components: dict[str, float] = field(default_factory=dict)
    source: str = "user"
    metadata: dict[str, str] = field(default_factory=dict)
    created_at_ms: int = field(default_factory=now_ms)


@dataclass(kw_only=True, slots=True)
class DeadLetter:
    """An event that could not be decoded or validated, kept with where it came from and why."""

    source_topic: str
    source_partition: int
    source_offset: int
    reason: str
    error_type: str
    key: bytes | None = None
    value: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    created_at_ms: int = field(default_factory=now_ms)
