"""SFT transcripts of a black-box scaffold: its first model call with a known answer, as tokens.

A demonstration is (task instruction, answer text). The prompt is what the scaffold sends first
(`ExternalScaffold.first_messages`), rendered by the agent proxy's own renderer
(`stacx.rollout.proxy.render.PromptRenderer`), so the ids are exactly those a captured episode starts
with; the answer follows as generated tokens (loss mask 1) closed by the end-of-turn token, as the
inference server returns a finished completion. One-call episodes (the answer ends the episode,
e.g. a mini-swe-agent action that submits) are then token for token what GRPO trains on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stacx.rollout.blackbox.adapter import ExternalScaffold
from stacx.rollout.errors import ConfigError
from stacx.rollout.inference.openai_api import ChatCompletionRequest
from stacx.rollout.proxy.render import PromptRenderer

__all__ = ["TranscriptRenderer"]


@dataclass(slots=True)
class TranscriptRenderer:
    """Token ids and loss mask of one-call transcripts of `adapter` under `tokenizer`."""

    adapter: ExternalScaffold
    tokenizer: Any
    """A Hugging Face tokenizer (the policy's)."""

    def __post_init__(self) -> None:
        if self.tokenizer.eos_token_id is None:
            raise ConfigError("the policy's tokenizer has no eos_token; transcripts end with it")

    def prompt_ids(self, instruction: str) -> list[int]:
        body = ChatCompletionRequest.model_validate({"messages": self.adapter.first_messages(instruction)})
        return PromptRenderer(self.tokenizer).chat(body).ids

    def encode(self, instruction: str, answer: str) -> tuple[list[int], list[int]]:
        """(token ids, loss mask): the rendered first call, then `answer` and end-of-turn."""
        prompt = self.prompt_ids(instruction)
        completion = [*PromptRenderer(self.tokenizer).encode(answer), int(self.tokenizer.eos_token_id)]
        return prompt + completion, [0] * len(prompt) + [1] * len(completion)
