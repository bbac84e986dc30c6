"""SGLang native request bodies (pydantic), normalised into one `NativeItem` per generation.

`GenerateRequest` takes every field of SGLang's `GenerateReqInput`: what the built-in server
implements is typed here; fields it cannot honour (images, LoRA, input embeddings, custom logit
processors, ...) are answered with a clear "not supported" when set; routing and bookkeeping hints
(priority, routing_key, ...) are accepted and ignored; any other top-level field is ignored with a
logged warning, as SGLang does. `sampling_params` follows SGLang's `SamplingParams`: an unknown
key there is an error naming it (SGLang raises too).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stacx.rollout.inference.errors import InvalidRequestError
from stacx.rollout.inference.sampling import SAMPLING_EPS, SamplingParams

__all__ = [
    "MAX_LOGIT_BIAS",
    "NullMeansDefault",
    "SEED_RANGE",
    "UnicodeBody",
    "GenerateRequest",
    "AbortRequest",
    "NativeItem",
    "SamplingParamsBody",
    "UpdateWeightsRequest",
    "as_list",
    "check_unicode",
    "check_not_supported",
    "warn_unknown",
]

log = logging.getLogger(__name__)

MAX_N = 128
"""Most parallel samples of one prompt in one request."""

NOT_SUPPORTED_TOP_LEVEL = frozenset(
    {
        "input_embeds",
        "image_data",
        "video_data",
        "audio_data",
        "lora_path",
        "lora_id",
        "custom_logit_processor",
        "session_params",
        "return_hidden_states",
        "token_ids_logprob",
        "return_routed_experts",
        "return_entropy",
        "return_sampling_mask",
        "return_flat_raw_top_logprobs",
        "positional_embed_overrides",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
        "multi_item_delimiter_indices",
        "max_thinking_tokens",
        "require_reasoning",
    }
)
"""SGLang fields that change what is computed; the built-in server refuses them when set."""

IGNORED_TOP_LEVEL = frozenset(
    {
        "log_metrics",
        "priority",
        "routing_key",
        "routed_dp_rank",
        "data_parallel_rank",
        "disagg_prefill_dp_rank",
        "conversation_id",
        "session_id",
        "extra_key",
        "cache_salt",
        "custom_labels",
        "no_logs",
        "background",
        "received_time",
        "external_trace_header",
        "modalities",
        "http_worker_ipc",
        "return_bytes",
        "return_prompt_token_ids",
        "decode_tp_size",
        "bootstrap_pair_key",
        "kv_router_hint",
        "mm_hashes",
        "mm_content_hashes",
        "use_audio_in_video",
        "video_config",
        "routed_experts_start_len",
        "return_indexer_topk",
        "return_flat_raw_top_logprobs_b64",
        "need_wait_for_mm_inputs",
        "num_items_assigned",
        "encoder_urls",
        "max_dynamic_patch",
        "min_dynamic_patch",
        "image_max_dynamic_patch",
        "video_max_dynamic_patch",
        "images_config",
    }
)
"""SGLang scheduling and bookkeeping hints with no effect on a single built-in server."""


def as_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _is_set(value: Any) -> bool:
    return value not in (None, False, [], {}, "")


def check_not_supported(fields: dict[str, Any], names: frozenset[str], where: str = "") -> None:
    """Raise naming the first field of `names` that is set in `fields`."""
    for name in sorted(names & fields.keys()):
        if _is_set(fields[name]):
            raise InvalidRequestError(
                f"{where}{name}", "is not supported by the built-in server (use SGLang on a GPU host for it)"
            )


def warn_unknown(extra: dict[str, Any] | None, known: frozenset[str], route: str) -> None:
    unknown = sorted(set(extra or {}) - known)
    if unknown:
        log.warning("%s: ignoring unknown fields %s", route, unknown)


MAX_LOGIT_BIAS = 100.0
"""Largest |logit_bias| value (OpenAI's range): beyond it a bias only overflows the logits."""
SEED_RANGE = (-(2**63), 2**63 - 1)
"""Seeds a torch generator takes (a signed 64-bit integer, as in vLLM)."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_unicode(data: Any, path: str = "") -> None:
    """Raise `InvalidRequestError` naming the first string (or key) of a JSON body that holds a
    lone UTF-16 surrogate (`"\\ud800"` decodes to one): no tokenizer can encode it."""
    if isinstance(data, str):
        if not data.isascii() and _SURROGATE.search(data):
            raise InvalidRequestError(
                path or "body", "holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape); "
                "send valid Unicode text"
            )
    elif isinstance(data, dict):
        for key, value in data.items():
            name = f"{path}.{key}" if path else str(key)
            check_unicode(key, name)
            check_unicode(value, name)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            check_unicode(value, f"{path}[{i}]")


class UnicodeBody(BaseModel):
    """A request body whose text must be valid Unicode (checked before any field)."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        check_unicode(data)
        return data


class NullMeansDefault(UnicodeBody):
    """A request body where an explicit null means "use the default" (SGLang and OpenAI alike)."""

    @model_validator(mode="before")
    @classmethod
    def _none_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class _Body(NullMeansDefault):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SamplingParamsBody(_Body):
    """`sampling_params` of `/generate` (SGLang names, ranges and defaults)."""

    max_new_tokens: int = Field(default=128, ge=0)
    min_new_tokens: int = Field(default=0, ge=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    """Accepted; fast tokenizers decode the same either way."""
    no_stop_trim: bool = False
    n: int = Field(default=1, ge=1, le=MAX_N)
    sampling_seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    logit_bias: dict[str, float] | None = None
    stream_interval: int | None = Field(default=None, ge=1)
    custom_params: dict[str, Any] | None = None
    """Accepted; only a custom logit processor (not supported) would read it."""
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None

    @model_validator(mode="after")
    def _check(self) -> SamplingParamsBody:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens}) must not exceed "
                f"max_new_tokens ({self.max_new_tokens})"
            )
        if self.top_k == 0:  # SGLang refuses it too; -1 is "off"
            raise ValueError("top_k = 0 selects no token; use -1 (no top-k) or a value >= 1")
        return self

    def to_params(self, vocab_size: int, where: str = "sampling_params.") -> SamplingParams:
        """Engine parameters; temperatures below the floor mean greedy (as in SGLang)."""
        grammar = {k: getattr(self, k) for k in ("ebnf", "structural_tag")}
        check_not_supported(grammar, frozenset(grammar), where)
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            min_new_tokens=self.min_new_tokens,
            temperature=0.0 if self.temperature < SAMPLING_EPS else self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=parse_logit_bias(self.logit_bias, vocab_size, f"{where}logit_bias"),
            stop=as_list(self.stop),
            stop_token_ids=list(self.stop_token_ids or []),
            stop_regex=_regexes(self.stop_regex, f"{where}stop_regex"),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            no_stop_trim=self.no_stop_trim,
            sampling_seed=self.sampling_seed,
            regex=self.regex,
            json_schema=self.json_schema,
        )


def _regexes(value: str | list[str] | None, field: str) -> list[str]:
    patterns = as_list(value)
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidRequestError(
                field, f"{pattern!r} is not a valid regular expression: {exc}"
            ) from None
    return patterns


def parse_logit_bias(bias: dict[str, float] | None, vocab_size: int, field: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequestError(field, f"key {key!r} is not a token id") from None
        if not 0 <= token < vocab_size:
            raise InvalidRequestError(field, f"token id {token} is outside the vocabulary [0, {vocab_size})")
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise InvalidRequestError(
                f"{field}.{key}", f"is {value:g}; a bias lies in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
            )
        out[token] = float(value)
    return out


@dataclass(kw_only=True, slots=True)
class NativeItem:
    """One generation of a (possibly batched, possibly n > 1) `/generate` request."""

    text: str | None
    input_ids: list[int] | None
    sampling: SamplingParamsBody
    rid: str | None
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    field: str
    """Request field holding this item's prompt (for error messages)."""
    sample: int = 0
    """Which of the n samples of its prompt; with `sampling_seed`, sample i uses seed + i."""


class GenerateRequest(UnicodeBody):
    """SGLang `POST /generate`: single or batch input, `n` samples each, optional streaming."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParamsBody | list[SamplingParamsBody] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False

    @field_validator("input_ids")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if value is not None and len(value) == 0:
            raise ValueError("is empty; send at least one token")
        return value

    @property
    def is_batch(self) -> bool:
        """True when the answer is a list (several prompts, or n > 1)."""
        if isinstance(self.text, list) or (self.input_ids and isinstance(self.input_ids[0], list)):
            return True
        return self._n() > 1

    def _n(self) -> int:
        params = self.sampling_params
        if isinstance(params, list):
            counts = {p.n for p in params}
            if len(counts) > 1:
                raise InvalidRequestError("sampling_params.n", "must be the same for every prompt of a batch")
            return counts.pop() if counts else 1
        return params.n if params is not None else 1

    def items(self) -> list[NativeItem]:
        """One item per generation: prompts in order, repeated n times (SGLang's order)."""
        extra = self.model_extra or {}
        check_not_supported(extra, NOT_SUPPORTED_TOP_LEVEL)
        warn_unknown(extra, NOT_SUPPORTED_TOP_LEVEL | IGNORED_TOP_LEVEL, "/generate")
        prompts = self._prompts()
        size, n = len(prompts), self._n()
        sampling = _per_prompt(self.sampling_params, size, "sampling_params", SamplingParamsBody())
        want = _per_prompt(self.return_logprob, size, "return_logprob", False)
        starts = _per_prompt(self.logprob_start_len, size, "logprob_start_len", -1)
        tops = _per_prompt(self.top_logprobs_num, size, "top_logprobs_num", 0)
        rids = self._rids(size, n)
        items = []
        for sample in range(n):
            for i, (field, text, ids) in enumerate(prompts):
                items.append(
                    NativeItem(
                        text=text,
                        input_ids=ids,
                        sampling=sampling[i],
                        rid=rids[sample * size + i] if rids else None,
                        return_logprob=bool(want[i]),
                        logprob_start_len=int(starts[i]),
                        top_logprobs_num=int(tops[i]),
                        field=field,
                        sample=sample,
                    )
                )
        return items

    def _prompts(self) -> list[tuple[str, str | None, list[int] | None]]:
        if self.text is not None and self.input_ids is not None:
            raise InvalidRequestError("input_ids", "send either text or input_ids, not both")
        if self.input_ids is not None:
            if isinstance(self.input_ids[0], list):
                return [(f"input_ids[{i}]", None, list(ids)) for i, ids in enumerate(self.input_ids)]  # type: ignore[arg-type]
            return [("input_ids", None, list(self.input_ids))]  # type: ignore[arg-type]
        if isinstance(self.text, list):
            if not self.text:
                raise InvalidRequestError("text", "is an empty batch; send at least one prompt")
            return [(f"text[{i}]", t, None) for i, t in enumerate(self.text)]
        if self.text:
            return [("text", self.text, None)]
        raise InvalidRequestError("input_ids", "text or input_ids is required and must not be empty")

    def _rids(self, size: int, n: int) -> list[str] | None:
        if self.rid is None:
            return None
        total = size * n
        if isinstance(self.rid, str):
            return [self.rid] if total == 1 else [f"{self.rid}_{i}" for i in range(total)]
        if len(self.rid) != size:
            raise InvalidRequestError(
                "rid", f"has {len(self.rid)} ids for {size} prompts; send one per prompt"
            )
        return list(self.rid) if n == 1 else [f"{rid}_{s}" for s in range(n) for rid in self.rid]


def _per_prompt(value: Any, size: int, field: str, default: Any) -> list[Any]:
    if value is None:
        return [default] * size
    if not isinstance(value, list):
        return [value] * size
    if len(value) != size:
        raise InvalidRequestError(field, f"has {len(value)} entries for {size} prompts; send one per prompt")
    return list(value)


class UpdateWeightsRequest(_Body):
    """SGLang `POST /update_weights_from_disk`."""

    model_config = ConfigDict(extra="ignore")

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


class AbortRequest(_Body):
    """SGLang `POST /abort_request`."""

    model_config = ConfigDict(extra="ignore")

    rid: str = ""
    abort_all: bool = False
    finished_reason: dict[str, Any] | None = None
    abort_message: str | None = None
