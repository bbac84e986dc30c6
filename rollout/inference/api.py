"""HTTP request bodies (pydantic). Unknown fields are rejected (422 naming the field).

Field names follow SGLang's `/generate`, `/update_weights_from_disk` and OpenAI's chat and
completions APIs, so one client works against the built-in server and SGLang.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollout.inference.sampling import SamplingParams

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "GenerateRequest",
    "SamplingParamsBody",
    "UpdateWeightsRequest",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _as_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


class SamplingParamsBody(_Body):
    """`sampling_params` of `/generate` (SGLang names and defaults)."""

    max_new_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: Literal[1] = 1

    def to_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=_as_list(self.stop),
            stop_token_ids=self.stop_token_ids or [],
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
        )


class GenerateRequest(_Body):
    """SGLang `POST /generate` (one prompt per request; no streaming)."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParamsBody = Field(default_factory=SamplingParamsBody)
    return_logprob: bool = False
    logprob_start_len: Literal[-1] = -1
    """Only output-token logprobs are supported."""
    top_logprobs_num: Literal[0] = 0
    rid: str | None = None
    stream: Literal[False] = False


class UpdateWeightsRequest(_Body):
    """SGLang `POST /update_weights_from_disk`."""

    model_path: str = Field(min_length=1)
    weight_version: str | None = None
    load_format: Literal["auto", "safetensors"] | None = None
    abort_all_requests: bool = False
    """Abort running requests instead of letting them finish on the old weights."""
    flush_cache: bool = True

    @field_validator("weight_version", mode="before")
    @classmethod
    def _version_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class CompletionRequest(_Body):
    """OpenAI `POST /v1/completions` (legacy logprobs; n = 1)."""

    model: str | None = None
    prompt: str | list[int]
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    stop: str | list[str] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=0)
    """Only the chosen token's logprob is returned, so 0 is the one accepted value."""
    n: Literal[1] = 1
    stream: Literal[False] = False
    seed: int | None = None
    user: str | None = None

    def to_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=_as_list(self.stop),
        )


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatCompletionRequest(_Body):
    """OpenAI `POST /v1/chat/completions` (n = 1; tool calls parsed from `<tool_call>` tags)."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: Literal[0] | None = None
    n: Literal[1] = 1
    stream: Literal[False] = False
    seed: int | None = None
    user: str | None = None
    return_token_ids: bool = False
    """Also return prompt and completion token ids (vLLM's extension)."""

    def to_params(self, default_max_tokens: int) -> SamplingParams:
        limit = self.max_completion_tokens or self.max_tokens or default_max_tokens
        return SamplingParams(
            max_new_tokens=limit,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=_as_list(self.stop),
        )
