"""Constrained decoding (SGLang's `regex` and `json_schema` sampling params) with outlines-core.

A request's pattern is compiled once into an `outlines_core.Index` over the tokenizer's vocabulary
(cached by pattern); each request walks its own `Guide`. Every step the engine masks the logits
of tokens the guide does not allow (`allowed_mask`), then advances the guide with the sampled
token. When the pattern is complete the guide allows only EOS, which ends the request (as in
SGLang). JSON schemas become regular expressions with outlines-core's own translation.

Tokens are given to outlines-core as the bytes they decode to: byte-level BPE tokens (GPT-2 /
Qwen style, `Ġ` for a space) map through the byte-to-unicode table, other tokens through the
tokenizer's `convert_tokens_to_string`.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from stacx.rollout.inference.errors import InvalidRequestError

if TYPE_CHECKING:
    import torch

__all__ = ["GrammarCompiler", "TokenGuide", "allowed_mask"]

MAX_CACHED_PATTERNS = 64


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable stand-in character -> byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def token_bytes(tokenizer: Any) -> dict[bytes, list[int]]:
    """Bytes of every non-special token (what outlines-core's `Vocabulary` takes)."""
    decoder = _byte_decoder()
    special = set(tokenizer.all_special_ids)
    out: dict[bytes, list[int]] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id in special:
            continue
        if token and all(c in decoder for c in token):
            raw = bytes(decoder[c] for c in token)
        else:
            raw = tokenizer.convert_tokens_to_string([token]).encode("utf-8")
        if raw:
            out.setdefault(raw, []).append(token_id)
    return out


class TokenGuide:
    """One request's walk through a compiled pattern."""

    def __init__(self, index: Any, eos_id: int, stop_ids: frozenset[int]) -> None:
        from outlines_core import Guide

        self._guide = Guide(index)
        self._eos_id = eos_id
        self._stop_ids = sorted(stop_ids)

    def allowed(self) -> list[int]:
        """Token ids allowed next (every stop id wherever the pattern may end)."""
        tokens = list(self._guide.get_tokens())
        if self._eos_id in tokens:
            tokens.extend(self._stop_ids)
        return tokens

    def advance(self, token: int) -> None:
        if token == self._eos_id or token in self._stop_ids or self._guide.is_finished():
            return
        self._guide.advance(token)

    @property
    def finished(self) -> bool:
        return bool(self._guide.is_finished())


class GrammarCompiler:
    """Compiles `regex` / `json_schema` patterns against one tokenizer (thread-safe, cached)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._vocabulary: Any = None
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def guide(self, *, regex: str | None, json_schema: str | None, stop_ids: frozenset[int]) -> TokenGuide:
        """A fresh guide for one request; a bad pattern is an `InvalidRequestError` naming its field."""
        if regex is not None and json_schema is not None:
            raise InvalidRequestError("sampling_params.regex", "give regex or json_schema, not both")
        if json_schema is not None:
            field, pattern = "sampling_params.json_schema", _schema_regex(json_schema)
        else:
            assert regex is not None
            field, pattern = "sampling_params.regex", regex
        return TokenGuide(self._index(field, pattern), self._eos_id(), stop_ids)

    def _eos_id(self) -> int:
        eos = self._tokenizer.eos_token_id
        if eos is None:
            raise InvalidRequestError(
                "sampling_params", "constrained decoding needs a tokenizer with an EOS token"
            )
        return int(eos)

    def _index(self, field: str, pattern: str) -> Any:
        from outlines_core import Index, Vocabulary

        with self._lock:
            if pattern in self._cache:
                self._cache.move_to_end(pattern)
                return self._cache[pattern]
            if self._vocabulary is None:
                self._vocabulary = Vocabulary(self._eos_id(), token_bytes(self._tokenizer))
            try:
                index = Index(pattern, self._vocabulary)
            except (ValueError, RuntimeError) as exc:
                raise InvalidRequestError(field, f"cannot be compiled: {str(exc).splitlines()[0]}") from None
            self._cache[pattern] = index
            if len(self._cache) > MAX_CACHED_PATTERNS:
                self._cache.popitem(last=False)
            return index


def _schema_regex(schema: str) -> str:
    from outlines_core.json_schema import build_regex_from_schema

    field = "sampling_params.json_schema"
    try:
        json.loads(schema)
    except ValueError as exc:
        raise InvalidRequestError(field, f"is not valid JSON: {exc}") from None
    try:
        return str(build_regex_from_schema(schema))
    except (ValueError, RuntimeError, TypeError) as exc:
        reason = str(exc).splitlines()[0]
        raise InvalidRequestError(field, f"is not a supported JSON schema: {reason}") from None


def allowed_mask(guides: list[TokenGuide | None], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[B, V] bool, True where a guided row must not sample the token (unguided rows: all False)."""
    import torch

    banned = torch.zeros(len(guides), vocab_size, dtype=torch.bool, device=device)
    for row, guide in enumerate(guides):
        if guide is None:
            continue
        allowed = [t for t in guide.allowed() if t < vocab_size]
        banned[row] = True
        banned[row, torch.tensor(allowed, dtype=torch.long, device=device)] = False
    return banned
