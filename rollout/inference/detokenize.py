"""Incremental detokenization, stop-string matching and token bytes.

`IncrementalDetokenizer` decodes only a short window of recent tokens per step (the tokens since
the last complete character, plus the ones before them for context), so streaming and stop
strings cost O(new text) per step instead of re-decoding the whole output. `StopMatcher` scans
only the new text plus the last `len(longest stop) - 1` characters before it.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

__all__ = ["IncrementalDetokenizer", "StopMatcher", "token_bytes"]

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Appends tokens one at a time; `text` is the decoded output so far (complete characters)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one token; returns the text it completed (may be empty mid-character)."""
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith(_REPLACEMENT):
            return ""  # an incomplete UTF-8 sequence: wait for the next token
        new = full[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self.text += new
        return new

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return str(self._tokenizer.decode(ids, skip_special_tokens=self._skip))


class StopMatcher:
    """Finds the first stop string or stop regex in text that grows at the end."""

    def __init__(self, stops: list[str], regexes: list[str] | None = None) -> None:
        self._stops = [s for s in stops if s]
        self._regexes = [re.compile(r) for r in regexes or []]
        self._overlap = max((len(s) for s in self._stops), default=1) - 1
        self._scanned = 0

    def __bool__(self) -> bool:
        return bool(self._stops or self._regexes)

    def find(self, text: str) -> tuple[str, int] | None:
        """(matched stop, index where it starts in `text`) for the earliest new match, else None."""
        start = max(self._scanned - self._overlap, 0)
        self._scanned = len(text)
        best: tuple[str, int] | None = None
        for stop in self._stops:
            index = text.find(stop, start)
            if index >= 0 and (best is None or index < best[1]):
                best = (stop, index)
        for regex in self._regexes:  # regexes may span any length: search the whole text
            match = regex.search(text)
            if match and (best is None or match.start() < best[1]):
                best = (match.group(0), match.start())
        return best


@lru_cache(maxsize=8)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable stand-in character -> byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars: dict[str, int] = {}
    extra = 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


_SENTENCEPIECE_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The exact bytes of one token (byte-level BPE, SentencePiece byte fallback, else its text).

    A token that is part of a multi-byte character decodes to U+FFFD on its own; its bytes are
    still the raw ones, as OpenAI's `logprobs[].bytes` reports them.
    """
    added = getattr(tokenizer, "added_tokens_decoder", {})
    piece = None if int(token_id) in added else tokenizer.convert_ids_to_tokens(int(token_id))
    if isinstance(piece, str):
        match = _SENTENCEPIECE_BYTE.match(piece)
        if match:
            return bytes([int(match.group(1), 16)])
        decoder = _byte_decoder()
        if _is_byte_level(tokenizer) and piece and all(char in decoder for char in piece):
            return bytes(decoder[char] for char in piece)
        if piece.startswith("▁") or "▁" in piece:
            return piece.replace("▁", " ").encode()
    return str(tokenizer.decode([int(token_id)], skip_special_tokens=False)).encode()


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return decoder is not None and "ByteLevel" in repr(decoder)
