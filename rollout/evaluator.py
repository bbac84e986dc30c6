"""Evaluator: one async multi-turn episode from a task to a training-ready `Trajectory`.

render prompt -> generate (ids + logprobs) -> scaffold parses an action -> acquire -> env step
through the gateway -> release (finally) -> append the observation -> ... until done, max turns,
max tokens or timeout -> reward (verifier in the sandbox, or a reward function).

Environment and model failures end the episode with status FAILED and the reason; they never
propagate. Cancellation propagates after the sandbox is closed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from opentelemetry.trace import SpanKind
from pydantic import NonNegativeFloat, PositiveFloat, PositiveInt

from stacx.producers.tracing import span
from stacx.rollout.blackbox.adapter import EpisodeSpec, build_external, is_external
from stacx.rollout.blackbox.join import external_metadata, join_calls
from stacx.rollout.blackbox.runner import ScaffoldOutputError, ScaffoldRunner, gateway_endpoint
from stacx.rollout.errors import (
    ConfigError,
    EnvironmentStepError,
    EpisodeError,
    InferenceCallError,
    RewardError,
)
from stacx.rollout.protocols import (
    Action,
    EnvironmentFactory,
    EnvironmentSession,
    EpisodeInference,
    ExecResult,
    Generation,
    InferenceClient,
    Message,
    RewardFunction,
    SamplingParams,
    Scaffold,
    TaskGroup,
    Tokenizer,
)
from stacx.rollout.resources import EvaluatorDemand, ResourcePool, Resources
from stacx.rollout.rewards import Verifier, get_reward, get_verifier, reward_components
from stacx.rollout.scaffolds import build_scaffold
from stacx.rollout.tokens import ChatFormat, TokenBuffer
from stacx.schemas.config import Probability
from stacx.schemas.plugins import first_line
from stacx.schemas.records import (
    TaskSample,
    ToolCall,
    Trajectory,
    TrajectoryStatus,
    Turn,
    logprobs,
    now_ms,
    token_ids,
    trajectory_id,
)

if TYPE_CHECKING:
    from stacx.rollout.blackbox.capture import CallCapture

__all__ = ["EpisodeStats", "Evaluator"]

VERIFIER = "verifier"
_PROMPT_CACHE_SIZE = 1024
MAX_EPISODE_S = 12 * 3600.0
"""Longest episode (and sandbox lifetime) the engine supports."""
_SANDBOX_SLACK_S = 120.0
"""Sandbox lifetime beyond the episode budget: creating it and closing it take time too."""


@dataclass(kw_only=True, slots=True)
class EpisodeStats:
    """Time spent inside external calls, for the engine-overhead figure."""

    num_steps: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0


@dataclass(slots=True)
class _Episode:
    """Mutable state of one running episode."""

    group: TaskGroup
    sample_index: int
    start_version: int
    buffer: TokenBuffer = field(default_factory=TokenBuffer)
    turns: list[Turn] = field(default_factory=list)
    prompt_length: int = 0
    answer: str | None = None
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED
    error: str | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    env: EnvironmentSession | None = None
    inference: InferenceClient | None = None
    """This episode's client when the evaluator's offers one per episode (`EpisodeInference`)."""

    def stop(self, reason: str, status: TrajectoryStatus = TrajectoryStatus.COMPLETED) -> None:
        self.status = status
        self.metadata["stop_reason"] = reason


class Evaluator:
    """Runs episodes of one evaluator kind (a scaffold + reward + limits, per task type)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        scaffold: str = "retool"
        """Built-in: retool | terminal | single_turn; black-box (a process per episode, its model
        calls captured by the agent proxy): mini-swe-agent | terminus-2 | openhands; or any registered one,
        `package.module:Factory`, or an entry point in `stacx.scaffolds` / `stacx.blackbox_scaffolds`."""
        scaffold_options: dict[str, Any] = field(default_factory=dict)
        """Keyword options of the scaffold (e.g. system_prompt; a black-box one's driver options)."""
        reward: str = "exact_answer"
        """`verifier` (scored in the sandbox by `verifier`), or a reward function: registered
        (exact_answer, exact_match), `package.module:function`, or an entry point in `stacx.rewards`."""
        reward_options: dict[str, Any] = field(default_factory=dict)
        """Keyword options bound to the reward function."""
        verifier: str = "harbor"
        """With `reward: verifier`: harbor (the task's tests), `package.module:function`, or an
        entry point in `stacx.verifiers`."""
        verifier_options: dict[str, Any] = field(default_factory=dict)
        """Keyword options bound to the verifier."""
        max_turns: PositiveInt = 8
        """Model turns per episode."""
        max_tokens: PositiveInt = 2048
        """Whole sequence length (prompt + generated + observations)."""
        max_new_tokens: PositiveInt = 256
        """Tokens per model turn."""
        temperature: NonNegativeFloat = 1.0
        """Sampling temperature."""
        top_p: Probability = 1.0
        """Nucleus sampling mass."""
        top_k: int = -1
        """Top-k (-1 = off)."""
        episode_timeout_s: PositiveFloat = 600.0
        """Wall-clock limit of one episode (status TIMED_OUT), at most 12 h; its sandbox lives
        as long (and is renewed while the episode runs)."""
        step_timeout_s: PositiveFloat = 30.0
        """Limit of one command in the sandbox."""
        episode: dict[str, float] = field(default_factory=lambda: {"sandboxes": 1, "memory_mb": 512})
        """Resources held for the whole episode (sandbox count is 0 for sandbox-less scaffolds)."""
        step: dict[str, float] = field(default_factory=lambda: {"cpu": 1.0})
        """Resources acquired around each environment step (from the local pool)."""
        generate: dict[str, float] = field(default_factory=lambda: {"generations": 1})
        """Resources acquired around each model call (from the global pool)."""

        def __post_init__(self) -> None:
            for name in ("max_turns", "max_tokens", "max_new_tokens"):
                if getattr(self, name) < 1:
                    raise ConfigError(f"evaluator.{name} = {getattr(self, name)}; use >= 1")
            for name in ("episode_timeout_s", "step_timeout_s"):
                if getattr(self, name) <= 0:
                    raise ConfigError(f"evaluator.{name} = {getattr(self, name)}; use > 0")
            if self.episode_timeout_s > MAX_EPISODE_S:
                raise ConfigError(
                    f"evaluator.episode_timeout_s = {self.episode_timeout_s}; use <= {MAX_EPISODE_S:g} (12 h)"
                )

    def __init__(
        self,
        config: Config,
        *,
        name: str,
        tokenizer: Tokenizer,
        inference: InferenceClient,
        environments: EnvironmentFactory | None,
        global_pool: ResourcePool,
        model_name: str = "policy",
        scaffold: Scaffold | None = None,
        reward_fn: RewardFunction | None = None,
        capture: CallCapture | None = None,
    ) -> None:
        self.config = config
        self.name = name
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.inference = inference
        self.environments = environments
        self.global_pool = global_pool
        self.model_name = model_name
        self.capture = capture
        self.runner: ScaffoldRunner | None = None
        if scaffold is None and is_external(config.scaffold):
            self.runner = self._runner(config)
            scaffold = self.runner.adapter
        self.scaffold = scaffold or build_scaffold(config.scaffold, **config.scaffold_options)
        self.reward_fn = reward_fn if reward_fn is not None else self._reward_from_config()
        self.verifier: Verifier | None = None
        if self.reward_fn is None:
            self.verifier = get_verifier(config.verifier, config.verifier_options)
        self.demand = self._demand()
        self.stats = EpisodeStats()
        self._prompts: dict[str, list[int]] = {}
        if self.scaffold.needs_sandbox and environments is None:
            raise ConfigError(
                f"evaluator {name!r}: scaffold {self.scaffold.name!r} needs a sandbox "
                "gateway; configure `sandbox`"
            )

    def _runner(self, config: Config) -> ScaffoldRunner:
        if self.capture is None:
            raise ConfigError(
                f"evaluator {self.name!r}: scaffold {config.scaffold!r} is a black-box scaffold and "
                "needs the agent proxy; set `inference.url` (the rollout service starts the proxy)"
            )
        return ScaffoldRunner(build_external(config.scaffold, config.scaffold_options))

    def _reward_from_config(self) -> RewardFunction | None:
        if self.config.reward == VERIFIER:
            if not self.scaffold.needs_sandbox:
                raise ConfigError(
                    f"evaluator {self.name!r}: reward `verifier` needs a sandbox "
                    f"scaffold, not {self.scaffold.name!r}"
                )
            return None
        return get_reward(self.config.reward, self.config.reward_options)

    def _demand(self) -> EvaluatorDemand:
        where = f"evaluators.{self.name}"
        episode = dict(self.config.episode)
        if not self.scaffold.needs_sandbox:
            episode = {k: v for k, v in episode.items() if k not in ("sandboxes", "memory_mb")}
        return EvaluatorDemand(
            name=self.name,
            episode=Resources.from_mapping(episode, where=f"{where}.episode"),
            step=Resources.from_mapping(self.config.step, where=f"{where}.step"),
            generate=Resources.from_mapping(self.config.generate, where=f"{where}.generate"),
        )

    # -- episode -------------------------------------------------------------------------------

    async def run(
        self, group: TaskGroup, sample_index: int, local: ResourcePool, *, policy_version: int = 0
    ) -> Trajectory:
        """Play one episode in `local` (the pool drawn for it) and return its trajectory."""
        episode = _Episode(group=group, sample_index=sample_index, start_version=policy_version)
        if isinstance(self.inference, EpisodeInference):
            episode.inference = self.inference.episode()
        started = time.monotonic()
        try:
            if self.runner is not None:  # install its environment outside the episode's budget
                await self.runner.prepare()
            await self._run_limited(episode, local)
        except EpisodeError as exc:
            self._fail(episode, TrajectoryStatus.FAILED, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug in a scaffold/tokenizer must not kill the manager
            self._fail(episode, TrajectoryStatus.FAILED, f"unexpected {type(exc).__name__}: {exc}")
        finally:
            await self._close_env(episode)
        episode.metadata["duration_ms"] = str(int((time.monotonic() - started) * 1000))
        return self._trajectory(episode)

    async def _run_limited(self, episode: _Episode, local: ResourcePool) -> None:
        agent_s, verifier_s = _task_timeouts(episode.group.task)
        if agent_s is not None and self.verifier is not None:
            await self._run_harbor(episode, local, agent_s, verifier_s or self.config.episode_timeout_s)
            return
        timeout = asyncio.timeout(self.config.episode_timeout_s)
        try:
            async with timeout:
                await self._play(episode, local)
                if episode.status is not TrajectoryStatus.FAILED:
                    await self._score(episode)
        except TimeoutError:
            if not timeout.expired():
                raise
            self._fail(
                episode,
                TrajectoryStatus.TIMED_OUT,
                f"episode exceeded episode_timeout_s={self.config.episode_timeout_s}",
            )

    async def _run_harbor(self, episode: _Episode, local: ResourcePool, agent_s: float,
                          verifier_s: float) -> None:
        """A task with its own agent timeout (Harbor's `[agent] timeout_sec`), as Harbor runs a
        trial: the agent gets the task's time; the tests run after the agent ends, timed out
        included, and their reward counts (the episode stays TIMED_OUT)."""
        timeout = asyncio.timeout(agent_s)
        try:
            async with timeout:
                await self._play(episode, local)
        except TimeoutError:
            if not timeout.expired():
                raise
            self._fail(episode, TrajectoryStatus.TIMED_OUT,
                       f"agent exceeded the task's [agent] timeout_sec = {agent_s:g} s; its tests ran")
        if episode.status is TrajectoryStatus.FAILED or episode.env is None:
            return
        scoring = asyncio.timeout(verifier_s + _SANDBOX_SLACK_S)  # test.sh has its own limit inside
        try:
            async with scoring:
                await self._score(episode)
        except TimeoutError:
            if not scoring.expired():
                raise
            self._fail(episode, TrajectoryStatus.TIMED_OUT, f"the task's tests exceeded {verifier_s:g} s")

    def _fail(self, episode: _Episode, status: TrajectoryStatus, reason: str) -> None:
        episode.status = status
        episode.error = reason
        episode.rewards = {"reward": 0.0}

    async def _play(self, episode: _Episode, local: ResourcePool) -> None:
        if self.runner is not None:
            await self._play_external(episode, local, self.runner)
            return
        messages = self.scaffold.initial_messages(episode.group.task)
        prompt = self._prompt_ids(episode.group, messages)
        episode.buffer.add_context(prompt)
        episode.prompt_length = len(prompt)
        episode.turns.append(Turn(role="user", text=messages[-1]["content"], token_ids=token_ids(prompt)))
        if self.scaffold.needs_sandbox:
            episode.env = await self._open_env(episode)
        for turn_index in range(self.config.max_turns):
            if not await self._turn(episode, local, turn_index):
                return
        episode.stop("max_turns", TrajectoryStatus.TRUNCATED)

    async def _play_external(self, episode: _Episode, local: ResourcePool, runner: ScaffoldRunner) -> None:
        """A black-box scaffold plays the whole episode; its captured calls become the tokens."""
        assert self.capture is not None
        env = episode.env = await self._open_env(episode)
        key = f"{episode.group.group_id}-{episode.sample_index}-{uuid.uuid4().hex[:8]}"
        url, token = gateway_endpoint(env)
        spec = EpisodeSpec(
            episode_id=key,
            task_id=episode.group.task.task_id,
            instruction=episode.group.task.prompt,
            model_base_url=self.capture.base_url(key),
            model_name=self.capture.model_name,
            gateway_url=url,
            gateway_token=token,
            sandbox_session=env.session_id,
            max_turns=self.config.max_turns,
            max_new_tokens=self.config.max_new_tokens,
            temperature=self.config.temperature,
            step_timeout_s=self.config.step_timeout_s,
            options=dict(runner.adapter.options),
        )
        try:
            async with local.lease(self.demand.step):
                outcome = await runner.run(spec)
        finally:
            calls = await self.capture.take(key)
        joined = join_calls(calls, self.tokenizer.decode)
        episode.buffer, episode.turns, episode.prompt_length = (
            joined.buffer,
            joined.turns,
            joined.prompt_length,
        )
        episode.metadata.update(external_metadata(outcome.result, joined))
        if not calls:
            raise ScaffoldOutputError(f"scaffold {runner.adapter.name!r} made no model calls")
        episode.stop(str(outcome.result.get("exit_status", "scaffold_done")))

    def _prompt_ids(self, group: TaskGroup, messages: list[Message]) -> list[int]:
        """Rendered once per group: its n samples share the prompt."""
        cached = self._prompts.get(group.group_id)
        if cached is None:
            if len(self._prompts) >= _PROMPT_CACHE_SIZE:
                self._prompts.pop(next(iter(self._prompts)))
            cached = self._prompts[group.group_id] = self.chat.prompt_ids(messages)
        return cached

    async def _turn(self, episode: _Episode, local: ResourcePool, turn_index: int) -> bool:
        """One model turn (and its step); False when the episode is over."""
        room = self.config.max_tokens - len(episode.buffer)
        if room <= 0:
            episode.stop("max_tokens", TrajectoryStatus.TRUNCATED)
            return False
        generation = await self._generate(episode, min(self.config.max_new_tokens, room))
        text = self.tokenizer.decode(generation.output_ids)
        action = self.scaffold.parse(text, finish_reason=generation.finish_reason)
        if generation.weight_version is None:
            generation.weight_version = episode.start_version
        episode.turns.append(self._assistant_turn(text, generation, action, turn_index))
        if action.kind == "answer":
            episode.answer = action.answer
            episode.stop("answer")
            return False
        if action.kind == "invalid":
            truncated = generation.finish_reason == "length"
            episode.stop(
                "max_new_tokens" if truncated else "invalid_action",
                TrajectoryStatus.TRUNCATED if truncated else TrajectoryStatus.COMPLETED,
            )
            episode.metadata["reward_reason"] = action.reason
            return False
        if action.kind != "exec":
            return True
        result = await self._step(episode, local, action)
        return self._observe(episode, action, result, generation)

    async def _generate(self, episode: _Episode, max_new_tokens: int) -> Generation:
        params = SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            top_k=self.config.top_k,
            stop=list(self.scaffold.stop),
        )
        started = time.perf_counter()
        async with self.global_pool.lease(self.demand.generate):
            with span("stacx.rollout", f"text_completion {self.model_name}", kind=SpanKind.CLIENT,
                      attributes=self._generate_attributes(params, len(episode.buffer))) as sp:
                try:
                    client = episode.inference or self.inference
                    generation = await client.generate(list(episode.buffer.ids), params)
                except EpisodeError:
                    raise
                except Exception as exc:
                    raise InferenceCallError(f"generate failed: {type(exc).__name__}: {exc}") from exc
                if sp is not None:
                    sp.set_attributes(_usage_attributes(generation))
        self.stats.generate_s += time.perf_counter() - started
        if len(generation.output_ids) != len(generation.logprobs):
            raise InferenceCallError(
                f"server returned {len(generation.output_ids)} ids but {len(generation.logprobs)} logprobs"
            )
        episode.buffer.add_generated(generation.output_ids, generation.logprobs)
        return generation

    def _generate_attributes(self, params: SamplingParams, prompt_tokens: int) -> dict[str, Any]:
        """GenAI semantic conventions for one generate call."""
        return {
            "gen_ai.operation.name": "text_completion",
            "gen_ai.provider.name": "stacx",
            "gen_ai.request.model": self.model_name,
            "gen_ai.request.max_tokens": params.max_new_tokens,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.usage.input_tokens": prompt_tokens,
        }

    def _assistant_turn(self, text: str, generation: Generation, action: Action, turn_index: int) -> Turn:
        calls = []
        if action.kind == "exec":
            calls = [
                ToolCall(id=f"call-{turn_index}", name=action.tool_name, arguments=action.tool_arguments)
            ]
        return Turn(
            role="assistant",
            text=text,
            token_ids=token_ids(generation.output_ids),
            tool_calls=calls,
            policy_version=generation.weight_version,
            started_at_ms=now_ms(),
            teacher_token_ids=token_ids(generation.teacher_ids or []),
            teacher_logprobs=logprobs(generation.teacher_logprobs or []),
            actor=generation.actor,
        )

    async def _step(self, episode: _Episode, local: ResourcePool, action: Action) -> ExecResult:
        assert episode.env is not None, "exec action in a sandbox-less scaffold"
        started = time.perf_counter()
        async with local.lease(self.demand.step):
            with span("stacx.rollout", "sandbox.exec", kind=SpanKind.CLIENT,
                      attributes={"stacx.sandbox_id": episode.env.session_id}) as sp:
                try:
                    result = await episode.env.exec(
                        action.command, stdin=action.stdin, timeout_s=self.config.step_timeout_s
                    )
                except EpisodeError:
                    raise
                except Exception as exc:
                    raise EnvironmentStepError(f"exec failed: {type(exc).__name__}: {exc}") from exc
                if sp is not None:
                    sp.set_attribute("stacx.exit_code", result.exit_code)
        self.stats.env_s += time.perf_counter() - started
        self.stats.num_steps += 1
        return result

    def _observe(self, episode: _Episode, action: Action, result: ExecResult, generation: Generation) -> bool:
        observation = self.scaffold.observe(action, result)
        if observation.inline:
            ids = self.tokenizer.encode(observation.text)
        else:
            after_eos = bool(generation.output_ids) and (
                generation.output_ids[-1] in self.tokenizer.eos_token_ids
            )
            ids = self.chat.message_ids(observation.role, observation.text, after_eos=after_eos)
        if len(episode.buffer) + len(ids) >= self.config.max_tokens:
            episode.stop("max_tokens", TrajectoryStatus.TRUNCATED)
            return False
        episode.buffer.add_context(ids)
        episode.turns.append(
            Turn(
                role="tool",
                text=observation.text,
                token_ids=token_ids(ids),
                observation=observation.text,
                duration_ms=result.duration_ms,
            )
        )
        # one exit code per tool turn, in turn order (`stacx view` shows them beside the turns)
        codes = episode.metadata.get("exit_codes")
        episode.metadata["exit_codes"] = f"{codes},{result.exit_code}" if codes else str(result.exit_code)
        return True

    # -- sandbox and reward --------------------------------------------------------------------

    async def _open_env(self, episode: _Episode) -> EnvironmentSession:
        assert self.environments is not None
        try:
            with span("stacx.rollout", "sandbox.create", kind=SpanKind.CLIENT):
                env = await self.environments.open(
                    episode.group.task,
                    cpus=max(self.demand.step.cpu, self.demand.episode.cpu, 0.1),
                    memory_mb=self.demand.episode.memory_mb or 512,
                    lifetime_s=_lifetime_s(episode.group.task, self.config.episode_timeout_s),
                )
        except EpisodeError:
            raise
        except Exception as exc:
            raise EnvironmentStepError(f"sandbox create failed: {type(exc).__name__}: {exc}") from exc
        episode.metadata["sandbox_id"] = env.session_id
        return env

    async def _close_env(self, episode: _Episode) -> None:
        env, episode.env = episode.env, None
        if env is None:
            return
        try:
            with span("stacx.rollout", "sandbox.close", kind=SpanKind.CLIENT):
                await asyncio.shield(env.close())
        except Exception as exc:  # the gateway's reaper removes it; record why
            episode.metadata["close_error"] = f"{type(exc).__name__}: {exc}"

    async def _score(self, episode: _Episode) -> None:
        if self.reward_fn is not None:
            episode.rewards = self._score_answer(episode)
            return
        assert episode.env is not None and self.verifier is not None
        try:
            with span("stacx.rollout", "sandbox.verify", kind=SpanKind.CLIENT):
                result = await self.verifier(episode.env, episode.group.task)
        except EpisodeError:
            raise
        except Exception as exc:
            raise RewardError(f"verifier failed: {type(exc).__name__}: {exc}") from exc
        source = f"verifier {self.config.verifier!r}"
        episode.rewards = reward_components(result, source=source, verifier=True)

    def _score_answer(self, episode: _Episode) -> dict[str, float]:
        assert self.reward_fn is not None
        try:
            data = json.loads(episode.group.task.data or "{}")
        except json.JSONDecodeError as exc:
            raise RewardError(f"task {episode.group.task.task_id}: data is not JSON ({exc})") from exc
        if episode.answer is None:
            episode.metadata.setdefault("reward_reason", "no final answer")
        source = f"reward {self.config.reward!r}"
        try:
            result = self.reward_fn(episode.answer, data)
        except Exception as exc:  # a user's reward function: the episode fails with one line
            raise RewardError(f"{source} raised {first_line(exc)}") from exc
        return reward_components(result, source=source)

    def _trajectory(self, episode: _Episode) -> Trajectory:
        ids, mask, lps = episode.buffer.arrays()
        task = episode.group.task
        metadata = {
            "evaluator": self.name,
            "scaffold": self.scaffold.name,
            "num_turns": str(sum(t.role == "assistant" for t in episode.turns)),
            "num_tool_calls": str(sum(len(t.tool_calls) for t in episode.turns)),
            **episode.metadata,
        }
        if episode.answer is not None:
            metadata["answer"] = episode.answer[:200]
        return Trajectory(
            trajectory_id=trajectory_id(
                task.task_id, episode.group.group_id, episode.sample_index, episode.start_version
            ),
            group_id=episode.group.group_id,
            sample_index=episode.sample_index,
            task_id=task.task_id,
            task_type=task.task_type,
            model_name=self.model_name,
            policy_version=episode.start_version,
            turns=episode.turns,
            token_ids=ids,
            loss_mask=mask,
            logprobs=lps,
            teacher_logprobs=_teacher_logprobs(episode.turns),
            temperature=self.config.temperature if self.config.temperature > 0 else 1.0,
            prompt_length=episode.prompt_length,
            rewards=episode.rewards,
            reward=float(episode.rewards.get("reward", 0.0)),
            status=episode.status,
            error=episode.error,
            metadata=metadata,
        )


def _task_timeouts(task: TaskSample) -> tuple[float | None, float | None]:
    """The task's own agent and verifier timeouts in seconds (Harbor tasks carry them in their
    data as `agent_timeout_s`, `verifier_timeout_s`); None where it has none."""
    try:
        data = json.loads(task.data or "{}")
    except json.JSONDecodeError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    found = [data.get(key) for key in ("agent_timeout_s", "verifier_timeout_s")]
    agent, verifier = (float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                       else None for v in found)
    return agent, verifier


def _lifetime_s(task: TaskSample, episode_timeout_s: float) -> float:
    """How long the episode's sandbox may live: the episode, or the task's agent and verifier
    timeouts when they are longer, plus slack."""
    agent, verifier = _task_timeouts(task)
    own = (agent or 0.0) + (verifier or 0.0)
    return min(max(episode_timeout_s, own) + _SANDBOX_SLACK_S, MAX_EPISODE_S)


def _teacher_logprobs(turns: list[Turn]) -> np.ndarray:
    """Token-aligned teacher logprobs of the student's turns (0 elsewhere); empty when no turn
    has them (no teacher in the loop, or it only gave labels)."""
    scored = [t.role == "assistant" and t.actor == "student" and len(t.teacher_logprobs) > 0
              and len(t.teacher_logprobs) == len(t.token_ids) for t in turns]
    if not any(scored):
        return logprobs([])
    parts = [np.asarray(t.teacher_logprobs if ok else np.zeros(len(t.token_ids)), dtype=np.float32)
             for t, ok in zip(turns, scored, strict=True)]
    return logprobs(np.concatenate(parts))


def _usage_attributes(generation: Generation) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.usage.output_tokens": len(generation.output_ids),
        "gen_ai.response.finish_reasons": [str(generation.finish_reason)],
    }
    if generation.weight_version is not None:
        attributes["stacx.policy_version"] = generation.weight_version
    return attributes
