"""Incremental detokenization and stop matching agree with full decoding; token bytes are raw."""

from __future__ import annotations

from stacx.rollout.inference.detokenize import IncrementalDetokenizer, StopMatcher, token_bytes
from stacx.rollout.models.tokenizer import make_tokenizer

TEXT = "héllo ✓ wörld <tool_call>{}</tool_call> done"


def test_incremental_text_equals_full_decode_at_character_boundaries() -> None:
    tokenizer = make_tokenizer()
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) == detok.text == tokenizer.decode(ids)
    assert "" in pieces  # the middle bytes of multi-byte characters yield nothing yet


def test_stop_matcher_scans_only_new_text_but_finds_stops_across_steps() -> None:
    matcher = StopMatcher(["wör", "✓"])
    text = ""
    found = None
    for char in "héllo ✓ wörld":
        text += char
        found = found or matcher.find(text)
    assert found == ("✓", 6)
    late = StopMatcher(["ld"])
    assert late.find("wor") is None and late.find("world") == ("ld", 3)
    regex = StopMatcher([], [r"\d{2}"])
    assert regex.find("a1") is None and regex.find("a12") == ("12", 1)


def test_token_bytes_of_byte_level_and_special_tokens() -> None:
    tokenizer = make_tokenizer()
    assert token_bytes(tokenizer, 0xC3) == b"\xc3"  # half of a UTF-8 character
    assert token_bytes(tokenizer, ord("A")) == b"A"
    assert token_bytes(tokenizer, tokenizer.convert_tokens_to_ids("<tool_call>")) == b"<tool_call>"
    assert token_bytes(tokenizer, tokenizer.eos_token_id) == b"<|im_end|>"
