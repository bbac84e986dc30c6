"""Tokenize a prompt without letting its size decide the cost: a text far past the context length
is refused after tokenizing at most a few chunks of it, never the whole (a 10 MB prompt once cost
12 s and 1.9 GB before its 400)."""

from __future__ import annotations

from typing import Any

from stacx.rollout.inference.errors import InvalidRequestError

__all__ = ["CHUNK_CHARS", "encode_within"]

CHUNK_CHARS = 1 << 16
"""Characters tokenized at a time while counting a long prompt."""
_BOUNDARY_SLACK = 4
"""Tokens one chunk boundary may add (a word split in two), taken off each chunk's count so the
count never overstates: only a prompt surely too long is refused here."""


def encode_within(tokenizer: Any, text: str, max_tokens: int, field: str) -> list[int]:
    """`text`'s token ids, or `InvalidRequestError` naming `field` once it surely has more than
    `max_tokens` tokens. A text of at most `max_tokens` characters is tokenized at once (no
    character makes more than a few tokens); a longer one is counted chunk by chunk first."""
    if len(text) > max_tokens:
        counted = 0
        for start in range(0, len(text), CHUNK_CHARS):
            piece = text[start : start + CHUNK_CHARS]
            counted += len(tokenizer.encode(piece, add_special_tokens=False)) - _BOUNDARY_SLACK
            if counted > max_tokens:
                raise InvalidRequestError(
                    field,
                    f"has more than {max_tokens} tokens (the context length) within its first "
                    f"{start + len(piece)} characters; shorten it",
                )
    return list(tokenizer.encode(text, add_special_tokens=False))
