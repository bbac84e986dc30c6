"""Teacher in the loop: a stronger policy, served by its own inference server, answers for the
student's own states while the student plays.

`TeacherInTheLoop` is an InferenceClient the evaluator calls like any other; each call is one
student state s (the tokens so far):

- `dagger`: with probability beta_i the teacher acts (its greedy action is executed and is the
  label); otherwise the student acts and the teacher is asked for its action on s. The executed
  policy is DAgger's mixture beta_i pi* + (1 - beta_i) pi_i (Ross et al. 2011); i is the
  student's weight version, so beta decays as training publishes versions.
- `opd`: the student acts; the teacher scores the student's tokens (its logprobs of them).
- `aggrevate`: per episode a switch turn t* is drawn; the student acts before it (roll-in), its
  sampled action at t* is the candidate, and the teacher acts after it, so the episode's reward
  estimates the teacher's return-to-go Q*(s_t*, a_t*) (Ross & Bagnell 2014).

The answers ride on the Generation into the trajectory's turns (`teacher_token_ids`,
`teacher_logprobs`, `actor`: backward-compatible schema fields). `DAggerLabels` wraps the
trajectory publisher and turns each episode into one row per labelled state: the state's tokens
(mask 0) then the teacher's action (mask 1). Assembler and trainer (`dagger` recipe) stay plain
consumers. `AggreVaTeRows` publishes one row per episode: the state at t* and the candidate
action, its reward the episode's; the samples of one task form the group, whose mean reward is
the baseline (a task-level baseline: the roll-ins differ, so it is not a per-state V*).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from stacx.rollout.errors import ConfigError
from stacx.rollout.protocols import (
    Generation,
    InferenceClient,
    SamplingParams,
    TrajectoryPublisher,
    VersionSource,
)
from stacx.schemas.records import (
    Trajectory,
    TrajectoryStatus,
    Turn,
    logprobs,
    loss_mask,
    token_ids,
    trajectory_id,
)

__all__ = ["AggreVaTeRows", "BetaSchedule", "DAggerLabels", "TeacherInTheLoop", "TokenScorer",
           "aggrevate_rows", "dagger_rows"]

TeacherMode = Literal["dagger", "opd", "aggrevate"]


@dataclass(kw_only=True, slots=True)
class BetaSchedule:
    """beta_i, the probability that the teacher acts at iteration i (the student's version)."""

    kind: Literal["constant", "exponential", "linear"] = "exponential"
    """`constant` (beta0), `exponential` (beta0 * decay^i, Ross et al.) or `linear` (beta0 down
    to `final` over `horizon` iterations)."""
    beta0: float = 1.0
    """beta at iteration 0 (1: the first iteration is the teacher's, as in DAgger)."""
    decay: float = 0.5
    """Factor per iteration of the exponential schedule."""
    final: float = 0.0
    """End value of the linear schedule."""
    horizon: int = 10
    """Iterations the linear schedule takes to reach `final`."""

    def __post_init__(self) -> None:
        for name in ("beta0", "decay", "final"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"teacher.beta.{name}={getattr(self, name)} must be in [0, 1]")
        if self.kind not in ("constant", "exponential", "linear"):
            raise ConfigError(f"teacher.beta.kind={self.kind!r}: use constant, exponential or linear")
        if self.horizon < 1:
            raise ConfigError(f"teacher.beta.horizon={self.horizon} must be >= 1")

    def __call__(self, iteration: int) -> float:
        i = max(iteration, 0)
        if self.kind == "constant":
            return self.beta0
        if self.kind == "exponential":
            return self.beta0 * self.decay**i
        return self.beta0 + (self.final - self.beta0) * min(i / self.horizon, 1.0)


class TokenScorer(Protocol):
    """Teacher-forced logprobs of `input_ids[start:]` (stacx.rollout.inference.InferenceClient.score)."""

    async def score(self, input_ids: list[int], start: int) -> list[float]: ...


class TeacherInTheLoop:
    """An InferenceClient mixing a student and a teacher server per state (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        url: str | None = None
        """Base URL of the teacher's inference server (`stacx rollout` builds its client)."""
        mode: TeacherMode = "dagger"
        """`dagger` (teacher labels, beta mixture), `opd` (teacher logprobs of student tokens) or
        `aggrevate` (student roll-in, one candidate action, teacher to the end)."""
        switch_turns: int = 4
        """AggreVaTe: the switch turn t* is uniform in [0, switch_turns)."""
        beta: BetaSchedule = field(default_factory=BetaSchedule)
        """Who acts (dagger): the teacher with probability beta_i."""
        label_temperature: float = 0.0
        """Temperature of the teacher's labels (0: its greedy action, the expert's choice)."""
        seed: int = 0
        """Seed of the mixture's coin flips."""

        def __post_init__(self) -> None:
            if self.mode not in ("dagger", "opd", "aggrevate"):
                raise ConfigError(f"teacher.mode={self.mode!r}: use dagger, opd or aggrevate")
            if self.switch_turns < 1:
                raise ConfigError(f"teacher.switch_turns={self.switch_turns} must be >= 1")
            if self.label_temperature < 0:
                raise ConfigError(f"teacher.label_temperature={self.label_temperature} must be >= 0")

    def __init__(self, config: Config, *, student: InferenceClient, teacher: InferenceClient,
                 scorer: TokenScorer | None = None, versions: VersionSource | None = None) -> None:
        if config.mode == "opd" and scorer is None:
            raise ConfigError("teacher.mode=opd needs a scorer (the teacher server's `score`)")
        self.config = config
        self.student = student
        self.teacher = teacher
        self.scorer = scorer
        self.versions = versions
        self._coin = random.Random(config.seed)
        self.num_teacher_actions = 0
        self.num_student_actions = 0

    def episode(self) -> InferenceClient:
        """The client of one episode: AggreVaTe draws its switch turn here; other modes are
        stateless."""
        if self.config.mode != "aggrevate":
            return self
        return _SwitchEpisode(self, self._coin.randrange(self.config.switch_turns))

    def beta(self) -> float:
        return self.config.beta(self.versions.current() if self.versions is not None else 0)

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        if self.config.mode == "aggrevate":
            raise ConfigError("teacher.mode=aggrevate keeps state per episode: generate through "
                              "`episode()` (the evaluator does)")
        if self.config.mode == "opd":
            return await self._scored(list(input_ids), params)
        label_params = dataclasses.replace(params, temperature=self.config.label_temperature)
        if self._coin.random() < self.beta():
            label = await self.teacher.generate(input_ids, label_params)
            self.num_teacher_actions += 1
            return dataclasses.replace(label, teacher_ids=list(label.output_ids),
                                       teacher_logprobs=list(label.logprobs), actor="teacher")
        own = await self.student.generate(input_ids, params)
        label = await self.teacher.generate(input_ids, label_params)
        self.num_student_actions += 1
        return dataclasses.replace(own, teacher_ids=list(label.output_ids), actor="student")

    async def _scored(self, input_ids: list[int], params: SamplingParams) -> Generation:
        assert self.scorer is not None
        own = await self.student.generate(input_ids, params)
        self.num_student_actions += 1
        scores: list[float] = []
        if own.output_ids:
            scores = await self.scorer.score(input_ids + list(own.output_ids), len(input_ids))
        return dataclasses.replace(own, teacher_logprobs=scores, actor="student")


class _SwitchEpisode:
    """One AggreVaTe episode: the student before turn `switch_turn`, its candidate at it, then
    the teacher."""

    def __init__(self, loop: TeacherInTheLoop, switch_turn: int) -> None:
        self.loop = loop
        self.switch_turn = switch_turn
        self.turn = 0

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        k, self.turn = self.turn, self.turn + 1
        if k > self.switch_turn:
            label_params = dataclasses.replace(params, temperature=self.loop.config.label_temperature)
            own = await self.loop.teacher.generate(input_ids, label_params)
            self.loop.num_teacher_actions += 1
            return dataclasses.replace(own, teacher_logprobs=list(own.logprobs), actor="teacher")
        own = await self.loop.student.generate(input_ids, params)
        self.loop.num_student_actions += 1
        return dataclasses.replace(own, actor="candidate" if k == self.switch_turn else "student")


def aggrevate_rows(trajectory: Trajectory) -> list[Trajectory]:
    """The episode's AggreVaTe row: the state before the candidate turn (the last student turn
    when the episode ended during the roll-in: nothing was left for the teacher) and the
    candidate action (mask 1); reward = the episode's, the teacher's return-to-go from there."""
    if trajectory.status is TrajectoryStatus.FAILED:
        return []
    student = [k for k, t in enumerate(trajectory.turns)
               if t.role == "assistant" and t.actor in ("student", "candidate")]
    chosen = next((k for k in student if trajectory.turns[k].actor == "candidate"),
                  student[-1] if student else None)
    if chosen is None or chosen == 0:
        return []
    state = np.concatenate([np.asarray(t.token_ids, dtype=np.int32)
                            for t in trajectory.turns[:chosen]])
    turn = trajectory.turns[chosen]
    row = _row(trajectory, chosen, state, np.asarray(turn.token_ids, dtype=np.int32), turn)
    row.group_id, row.sample_index = trajectory.group_id, trajectory.sample_index
    row.trajectory_id = trajectory_id(trajectory.task_id, f"{trajectory.group_id}/aggrevate",
                                      trajectory.sample_index, trajectory.policy_version)
    row.turns[1].actor, row.metadata["aggrevate_turn"] = turn.actor, str(chosen)
    return [row]


def dagger_rows(trajectory: Trajectory) -> list[Trajectory]:
    """One training row per assistant turn that carries a teacher label: the student's state
    before the turn (mask 0), then the teacher's action (mask 1). Failed episodes give none."""
    if trajectory.status is TrajectoryStatus.FAILED:
        return []
    rows: list[Trajectory] = []
    context: list[np.ndarray] = []
    for k, turn in enumerate(trajectory.turns):
        label = np.asarray(turn.teacher_token_ids, dtype=np.int32)
        if turn.role == "assistant" and len(label) and context:
            rows.append(_row(trajectory, k, np.concatenate(context), label, turn))
        context.append(np.asarray(turn.token_ids, dtype=np.int32))
    return rows


def _row(trajectory: Trajectory, k: int, state: np.ndarray, label: np.ndarray,
         turn: Turn) -> Trajectory:
    group = f"{trajectory.group_id}/{trajectory.sample_index}/s{k}"
    ids = np.concatenate([state, label])
    return Trajectory(
        trajectory_id=trajectory_id(trajectory.task_id, group, 0, trajectory.policy_version),
        group_id=group, sample_index=0, task_id=trajectory.task_id,
        task_type=trajectory.task_type, model_name=trajectory.model_name,
        policy_version=trajectory.policy_version,
        turns=[Turn(role="user", text="", token_ids=token_ids(state)),
               Turn(role="assistant", text="", token_ids=token_ids(label), actor="teacher",
                    teacher_token_ids=token_ids(label), policy_version=turn.policy_version)],
        token_ids=token_ids(ids),
        loss_mask=loss_mask(np.concatenate([np.zeros(len(state)), np.ones(len(label))])),
        logprobs=logprobs(np.zeros(len(ids))),  # the label was not sampled by the student
        temperature=1.0, prompt_length=len(state), rewards=dict(trajectory.rewards),
        reward=trajectory.reward, status=TrajectoryStatus.COMPLETED,
        metadata={"source_trajectory": trajectory.trajectory_id, "dagger_state": str(k),
                  "actor": turn.actor or ""},
    )


class DAggerLabels:
    """A TrajectoryPublisher that publishes each episode's DAgger rows (`dagger_rows`) instead
    of the episode. Use it with an assembler whose group size is 1 (each state its own group)."""

    rows = staticmethod(dagger_rows)

    def __init__(self, publisher: TrajectoryPublisher) -> None:
        self.publisher = publisher
        self.num_rows = 0

    async def publish(self, trajectory: Trajectory) -> None:
        for row in self.rows(trajectory):
            await self.publisher.publish(row)
            self.num_rows += 1

    async def close(self) -> None:
        await self.publisher.close()


class AggreVaTeRows(DAggerLabels):
    """A TrajectoryPublisher that publishes each episode's AggreVaTe row (`aggrevate_rows`); the
    group size stays the number of samples per task."""

    rows = staticmethod(aggrevate_rows)
