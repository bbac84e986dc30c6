"""In-memory fakes of every rollout seam: tests and the engine benchmark need no services."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stacx.rollout.protocols import (
    ExecResult,
    Generation,
    Message,
    SamplingParams,
)
from stacx.schemas.records import TaskSample, Trajectory

__all__ = [
    "FakeCapture",
    "FakeEnvironments",
    "FakeSession",
    "FakeTokenizer",
    "MemoryPublisher",
    "ScriptedInference",
    "StaticVersion",
]

_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


class FakeTokenizer:
    """Greedy longest-match over a few multi-char tokens, else one id per character.

    Multi-char tokens make re-tokenisation lossy on purpose: ids [ord('4'), ord('2')] decode to
    "42", which encodes back to the single id of "42".
    """

    def __init__(self, extra_tokens: Sequence[str] = ("42", "<tool_call>", "</tool_call>")) -> None:
        self.vocab = {tok: 1_000_000 + i for i, tok in enumerate([*_SPECIALS, *extra_tokens])}
        self.inverse = {i: tok for tok, i in self.vocab.items()}
        self.by_length = sorted(self.vocab, key=len, reverse=True)
        self.eos_token_ids = frozenset({self.vocab["<|im_end|>"], self.vocab["<|endoftext|>"]})

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            tok = next((t for t in self.by_length if text.startswith(t, i)), None)
            ids.append(self.vocab[tok] if tok else ord(text[i]))
            i += len(tok) if tok else 1
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.inverse.get(i) or chr(i) for i in ids)

    def render_chat(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


Policy = Callable[[str, int], str]
"""(decoded context, call index) -> the text the model 'generates'."""


class ScriptedInference:
    """Generates scripted text, encoded with the tokenizer; logprob of token k is -(k+1)/100.

    `split_ids` emits one id per character (never the multi-char tokens), so tests can check that
    generated ids are kept as generated.
    """

    def __init__(
        self,
        tokenizer: FakeTokenizer,
        policy: Policy,
        *,
        version: Callable[[], int] = lambda: 0,
        split_ids: bool = False,
        eos: bool = True,
        delay_s: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.version = version
        self.split_ids = split_ids
        self.eos = eos
        self.delay_s = delay_s
        self.calls: list[tuple[list[int], SamplingParams]] = []
        self.num_active = 0
        self.max_active = 0

    def _ids(self, text: str) -> list[int]:
        return [ord(c) for c in text] if self.split_ids else self.tokenizer.encode(text)

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        self.calls.append((list(input_ids), params))
        self.num_active += 1
        self.max_active = max(self.max_active, self.num_active)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            text = self.policy(self.tokenizer.decode(input_ids), len(self.calls) - 1)
        finally:
            self.num_active -= 1
        stopped = next((s for s in params.stop if s in text), None)
        if stopped:
            text = text[: text.index(stopped) + len(stopped)]
        ids = self._ids(text)
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        elif self.eos and not stopped:
            ids.append(self.tokenizer.vocab["<|im_end|>"])
        lps = [-(k + 1) / 100 for k in range(len(ids))]
        return Generation(output_ids=ids, logprobs=lps, weight_version=self.version(), finish_reason=finish)


Handler = Callable[[str, str | None], ExecResult]


def python_eval_handler(command: str, stdin: str | None) -> ExecResult:
    """Runs `print(<expr>)` lines by `eval` of the expression (numeric expressions only; tests)."""
    out = []
    for line in (stdin or "").splitlines():
        line = line.strip()
        if line.startswith("print(") and line.endswith(")"):
            try:
                out.append(str(eval(line[6:-1], {"__builtins__": {}}, {})))  # noqa: S307
            except Exception as exc:
                return ExecResult(exit_code=1, stderr=f"{type(exc).__name__}: {exc}\n")
    return ExecResult(exit_code=0, stdout="".join(f"{x}\n" for x in out))


@dataclass(kw_only=True, slots=True)
class FakeSession:
    session_id: str
    handler: Handler
    verify_rewards: dict[str, float] = field(default_factory=lambda: {"reward": 1.0})
    fail_exec: bool = False
    closed: bool = False
    commands: list[str] = field(default_factory=list)
    delay_s: float = 0.0

    async def exec(
        self, command: str, *, stdin: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        assert not self.closed, "exec on a closed session"
        self.commands.append(command)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_exec:
            raise ConnectionError("gateway unreachable")
        return self.handler(command, stdin)

    async def verify(self) -> dict[str, float]:
        return dict(self.verify_rewards)

    async def close(self) -> None:
        self.closed = True


class FakeEnvironments:
    """Creates `FakeSession`s and remembers them, so tests can check none is left open."""

    def __init__(
        self,
        handler: Handler = python_eval_handler,
        *,
        fail_exec: bool = False,
        fail_open: bool = False,
        delay_s: float = 0.0,
    ) -> None:
        self.handler = handler
        self.fail_exec = fail_exec
        self.fail_open = fail_open
        self.delay_s = delay_s
        self.sessions: list[FakeSession] = []
        self.lifetimes: list[float | None] = []
        """`lifetime_s` of every open() call."""
        self._ids = itertools.count()

    async def open(
        self, task: TaskSample, *, cpus: float, memory_mb: int, lifetime_s: float | None = None
    ) -> FakeSession:
        self.lifetimes.append(lifetime_s)
        if self.fail_open:
            raise RuntimeError("no capacity")
        session = FakeSession(
            session_id=f"fake-{next(self._ids)}",
            handler=self.handler,
            fail_exec=self.fail_exec,
            delay_s=self.delay_s,
        )
        self.sessions.append(session)
        return session

    @property
    def open_sessions(self) -> list[FakeSession]:
        return [s for s in self.sessions if not s.closed]


class MemoryPublisher:
    """Collects published trajectories in a list."""

    def __init__(self) -> None:
        self.published: list[Trajectory] = []
        self.closed = False

    async def publish(self, trajectory: Trajectory) -> None:
        self.published.append(trajectory)

    async def close(self) -> None:
        self.closed = True


class StaticVersion:
    """A policy version set by hand (tests) or never changing."""

    def __init__(self, version: int = 0) -> None:
        self.version = version

    def current(self) -> int:
        return self.version


class FakeCapture:
    """Stands in for `CallCapture` where no scaffold process runs (config checks): no calls."""

    model_name = "fake"

    def base_url(self, episode_id: str) -> str:
        return f"http://127.0.0.1:9/s/{episode_id}/v1"

    async def take(self, episode_id: str) -> list[Any]:
        return []
