"""OpenAI request bodies (pydantic) for `/v1/completions` and `/v1/chat/completions`.

Fields follow the OpenAI API; the sampling extensions vLLM and SGLang accept (`top_k`, `min_p`,
`repetition_penalty`, `min_tokens`, `ignore_eos`, `stop_token_ids`, `skip_special_tokens`,
`no_stop_trim`, `return_token_ids`, SGLang's `regex`) are accepted too. Unknown fields are ignored
with a logged warning (clients send newer options); options that would change the answer and cannot
be honoured (`suffix`, `best_of` != `n`) are refused by name. Chat's `response_format` (`json_object`,
`json_schema`) constrains decoding (rollout/inference/grammar.py).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stacx.rollout.inference.api import (
    MAX_N,
    SEED_RANGE,
    NullMeansDefault,
    as_list,
    parse_logit_bias,
    warn_unknown,
)
from stacx.rollout.inference.errors import InvalidRequestError
from stacx.rollout.inference.sampling import SAMPLING_EPS, SamplingParams

__all__ = ["ChatCompletionRequest", "ChatMessage", "CompletionRequest", "StreamOptions"]


class _Body(NullMeansDefault):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    def warn_unknown(self, route: str) -> None:
        warn_unknown(self.model_extra, frozenset(), route)


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Body):
    """What both endpoints share."""

    model: str | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    user: str | None = None
    # extensions (vLLM / SGLang)
    top_k: int = Field(default=-1, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    return_token_ids: bool = False
    """Also return prompt and completion token ids (vLLM's extension)."""
    regex: str | None = None
    """Constrain the output to this regular expression (SGLang's extension)."""

    def grammar_schema(self) -> str | None:
        """A JSON schema the output must follow (chat's `response_format`)."""
        return None

    def sampling(self, max_tokens: int, vocab_size: int) -> SamplingParams:
        if self.min_tokens > max_tokens:
            raise InvalidRequestError(
                "min_tokens", f"({self.min_tokens}) must not exceed the token limit ({max_tokens})"
            )
        return SamplingParams(
            max_new_tokens=max_tokens,
            min_new_tokens=self.min_tokens,
            temperature=0.0 if self.temperature < SAMPLING_EPS else self.temperature,
            top_p=self.top_p,
            top_k=-1 if self.top_k == 0 else self.top_k,
            min_p=self.min_p,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=parse_logit_bias(self.logit_bias, vocab_size, "logit_bias"),
            stop=as_list(self.stop),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            no_stop_trim=self.no_stop_trim,
            sampling_seed=self.seed,
            regex=self.regex,
            json_schema=self.grammar_schema(),
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    """OpenAI `POST /v1/completions` (legacy logprobs: up to 20 alternatives per token)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix (insertion) is not supported by the built-in server")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported; the server returns all n samples")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request (a string or token ids)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return [p if isinstance(p, str) else list(p) for p in prompt]  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def for_template(self, index: int) -> dict[str, Any]:
        """The message as the chat template expects it (text content, `developer` as `system`)."""
        message = self.model_dump(
            exclude_none=True, include={"role", "content", "tool_calls", "tool_call_id", "name"}
        )
        if self.role == "developer":
            message["role"] = "system"
        if isinstance(self.content, list):
            texts = []
            for part in self.content:
                if part.get("type") != "text":
                    raise InvalidRequestError(
                        f"messages[{index}].content",
                        f"has a {part.get('type')!r} part; the built-in server takes text parts only",
                    )
                texts.append(str(part.get("text", "")))
            message["content"] = "".join(texts)
        return message


class ChatCompletionRequest(_Sampling):
    """OpenAI `POST /v1/chat/completions` (tool calls parsed from `<tool_call>` blocks)."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None

    @field_validator("tools")
    @classmethod
    def _function_tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(tools or []):
            function = tool.get("function")
            if tool.get("type") != "function" or not isinstance(function, dict):
                raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
            if not isinstance(function.get("name"), str) or not function["name"]:
                raise ValueError(f"tools[{i}].function.name is required (a non-empty string)")
        return tools

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        kind = (self.response_format or {}).get("type", "text")
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(
                f"response_format type {kind!r} is not one of 'text', 'json_object', 'json_schema'"
            )
        if kind == "json_schema" and not isinstance(self._schema(), dict):
            raise ValueError("response_format json_schema needs json_schema.schema (an object)")
        if kind != "text" and self.regex is not None:
            raise ValueError("send either regex or a JSON response_format, not both")
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise ValueError("tool_choice other than 'none'/'auto' needs tools")
        return self

    def _schema(self) -> Any:
        return ((self.response_format or {}).get("json_schema") or {}).get("schema")

    def grammar_schema(self) -> str | None:
        """The JSON schema `response_format` constrains the output to (json_object: any object)."""
        kind = (self.response_format or {}).get("type", "text")
        if kind == "json_object":
            return json.dumps({"type": "object"})
        return json.dumps(self._schema()) if kind == "json_schema" else None

    def forced_tool(self) -> str | None:
        """The function name a named `tool_choice` asks for (checked against `tools`)."""
        if not isinstance(self.tool_choice, dict):
            return None
        name = (self.tool_choice.get("function") or {}).get("name")
        names = [(t.get("function") or {}).get("name") for t in self.tools or []]
        if not isinstance(name, str) or name not in names:
            raise InvalidRequestError(
                "tool_choice", f"names function {name!r}, which is not in tools {names}"
            )
        return name

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"
