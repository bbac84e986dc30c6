"""The seams of the rollout engine: every I/O dependency is one of these small Protocols.

Real implementations live in `stacx.rollout.adapters` (inference client, sandbox gateway client, Kafka);
in-memory fakes for tests live in `stacx.rollout.fakes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from stacx.schemas.records import TaskSample, Trajectory

__all__ = [
    "Action",
    "EnvironmentFactory",
    "EnvironmentSession",
    "EpisodeInference",
    "ExecResult",
    "Generation",
    "InferenceClient",
    "Message",
    "Observation",
    "RewardFunction",
    "SamplingParams",
    "Scaffold",
    "TaskGroup",
    "TaskSource",
    "Tokenizer",
    "TrajectoryPublisher",
    "VersionSource",
]

Message = dict[str, str]
"""A chat message: {"role": ..., "content": ...}."""


@dataclass(kw_only=True, slots=True)
class SamplingParams:
    """Sampling parameters sent with each generate call (SGLang names)."""

    max_new_tokens: int = 256
    """Upper bound on generated tokens for this call."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k cut-off (-1 = off)."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (the scaffold's, e.g. `</tool_call>`)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop token ids."""


@dataclass(kw_only=True, slots=True)
class Generation:
    """One generate call's result: the ids exactly as sampled and their logprobs."""

    output_ids: list[int]
    logprobs: list[float]
    weight_version: int | None
    """Version of the weights that generated this (None: the server did not say)."""
    finish_reason: str
    """`stop` (EOS / stop string), `length` or `abort`."""
    teacher_ids: list[int] | None = None
    """Teacher in the loop (rollout/teacher.py): the teacher's action on this call's state."""
    teacher_logprobs: list[float] | None = None
    """Teacher in the loop: the teacher's logprobs of `output_ids` (scored for OPD, or its own when
    it acted)."""
    actor: str | None = None
    """Teacher in the loop: `student` or `teacher`, whoever produced `output_ids`."""


@runtime_checkable
class InferenceClient(Protocol):
    """Generates token ids with per-token logprobs from input ids."""

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation: ...


@runtime_checkable
class EpisodeInference(Protocol):
    """An inference client with per-episode state (e.g. AggreVaTe's switch turn): the evaluator
    asks it for a fresh client at the start of every episode."""

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation: ...

    def episode(self) -> InferenceClient: ...


@runtime_checkable
class Tokenizer(Protocol):
    """What the evaluator needs from a tokenizer (an HF tokenizer through `HFTokenizer`)."""

    eos_token_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def render_chat(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str: ...


@dataclass(kw_only=True, slots=True)
class ExecResult:
    """Outcome of one command in a sandbox."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    timed_out: bool = False
    duration_ms: int = 0


@runtime_checkable
class EnvironmentSession(Protocol):
    """One sandbox for one episode, reached through the gateway."""

    session_id: str

    async def exec(
        self, command: str, *, stdin: str | None = None, timeout_s: float | None = None
    ) -> ExecResult: ...

    async def verify(self) -> dict[str, float]:
        """Run the task's verifier; named reward components (`reward` is the final one)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class EnvironmentFactory(Protocol):
    """Creates sandbox sessions (the gateway client)."""

    async def open(
        self, task: TaskSample, *, cpus: float, memory_mb: int, lifetime_s: float | None = None
    ) -> EnvironmentSession:
        """A session for `task` with these limits, kept for `lifetime_s` (the episode's budget)."""
        ...


@dataclass(kw_only=True, slots=True)
class Action:
    """What the scaffold read out of one model turn. Never raises: bad output -> `invalid`."""

    kind: str
    """`exec` (run `command` in the sandbox), `answer` (final), `continue` or `invalid`."""
    command: str = ""
    stdin: str | None = None
    tool_name: str = ""
    tool_arguments: str = "{}"
    answer: str | None = None
    reason: str = ""
    """Why the output is invalid (becomes the trajectory's reward comment)."""


@dataclass(kw_only=True, slots=True)
class Observation:
    """What goes back to the model after a step: text, and how it is framed in tokens."""

    text: str
    role: str = "tool"
    inline: bool = True
    """True: appended inside the current assistant turn (ReTool); False: a new chat message."""


@runtime_checkable
class Scaffold(Protocol):
    """Agent runtime: turns model text into actions and results into observations."""

    name: str
    needs_sandbox: bool
    stop: list[str]

    def initial_messages(self, task: TaskSample) -> list[Message]: ...

    def parse(self, text: str, *, finish_reason: str) -> Action: ...

    def observe(self, action: Action, result: ExecResult) -> Observation: ...


class RewardFunction(Protocol):
    """Scores a final answer against the task payload; returns named components."""

    def __call__(self, answer: str | None, data: Mapping[str, Any]) -> dict[str, float]: ...


@dataclass(kw_only=True, slots=True)
class TaskGroup:
    """One task to sample `num_samples` times under a shared group id (a GRPO group)."""

    group_id: str
    task: TaskSample
    num_samples: int
    epoch: int = 0
    seq: int = 0
    """Arrival order, set by the scheduler (FIFO ties)."""
    source_ref: Any = None
    """Opaque handle for `TaskSource.ack` (e.g. a Kafka event)."""


@runtime_checkable
class TaskSource(Protocol):
    """Yields task groups; `None` when exhausted (a stream source may never be)."""

    async def next_group(self) -> TaskGroup | None: ...

    async def ack(self, group: TaskGroup) -> None:
        """All samples of `group` are published (commit the consumer offset)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class TrajectoryPublisher(Protocol):
    async def publish(self, trajectory: Trajectory) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class VersionSource(Protocol):
    """The newest policy version the trainer has published."""

    def current(self) -> int: ...
