"""Prompts and answers: OpenAI requests -> exact token ids, generations -> OpenAI responses.

The proxy renders chat prompts with the served model's own tokenizer and chat template, exactly
as the built-in server's OpenAI route does (tools Qwen2-style; `tool_choice` `required` or a
named function primes the assistant turn with the opening of a call), so a call through the
proxy gets the same answer as the same call to the server's `/v1/chat/completions`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stacx.rollout.inference.detokenize import token_bytes
from stacx.rollout.inference.openai_api import ChatCompletionRequest, CompletionRequest
from stacx.rollout.inference.openai_routes import chat_message, streamed_content, tool_primer
from stacx.rollout.inference.prompt_limits import encode_within
from stacx.rollout.proxy.errors import UnsupportedRequestError

__all__ = ["PromptRenderer", "RenderedPrompt", "chat_message", "streamed_content"]


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """Token ids sent to the server; `primer` is the start of the assistant turn we forced."""

    ids: list[int]
    primer: str = ""


DEFAULT_MAX_PROMPT_TOKENS = 1 << 17
"""Prompt bound when the served model's context length is not known."""


class PromptRenderer:
    """Applies the model's chat template and tokenizer (a Hugging Face tokenizer); a prompt
    surely longer than `max_tokens` is refused before it is all tokenized."""

    def __init__(self, tokenizer: Any, max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.max_tokens = max_tokens

    def encode(self, text: str, field: str = "prompt") -> list[int]:
        return encode_within(self.tokenizer, text, self.max_tokens, field)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def chat(self, body: ChatCompletionRequest) -> RenderedPrompt:
        messages = [m.for_template(i) for i, m in enumerate(body.messages)]
        tools = body.tools if body.uses_tools else None
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        primer = tool_primer(body) if body.uses_tools else ""
        return RenderedPrompt(ids=self.encode(str(text) + primer, "messages"), primer=primer)

    def completion(self, body: CompletionRequest) -> RenderedPrompt:
        prompts = body.prompts()
        if len(prompts) != 1:
            raise UnsupportedRequestError(
                "prompt", f"has {len(prompts)} prompts; send one prompt per call through the proxy"
            )
        prompt = prompts[0]
        ids = list(prompt) if isinstance(prompt, list) else self.encode(prompt)
        if not ids:
            raise UnsupportedRequestError("prompt", "is empty; send at least one token")
        if len(ids) > self.max_tokens:  # the server would refuse it too, after receiving it all
            raise UnsupportedRequestError(
                "prompt", f"has {len(ids)} tokens, more than the context length {self.max_tokens}"
            )
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise UnsupportedRequestError(
                "prompt", f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})"
            )
        return RenderedPrompt(ids=ids)

    def token_text(self, token: int) -> str:
        return self.decode([token])

    def token_bytes(self, token: int) -> list[int]:
        """The token's own bytes (half a character stays half: not the text's U+FFFD)."""
        return list(token_bytes(self.tokenizer, token))


def request_messages_json(body: ChatCompletionRequest) -> str:
    """The messages as the client sent them (what `AgentInteraction.messages` stores)."""
    return json.dumps([m.model_dump(exclude_none=True) for m in body.messages])
