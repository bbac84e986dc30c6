"""Token bookkeeping with the real (locally built) HF tokenizer of stacx.rollout.models."""

from __future__ import annotations

import pytest

from stacx.rollout.tokens import ChatFormat, HFTokenizer, TokenBuffer


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    from stacx.rollout.models import make_tokenizer

    return HFTokenizer(make_tokenizer())


def test_eos_ids_include_the_end_of_turn_token(tokenizer: HFTokenizer) -> None:
    im_end = tokenizer.inner.convert_tokens_to_ids("<|im_end|>")
    assert im_end in tokenizer.eos_token_ids


def test_prompt_ids_render_the_chat_template(tokenizer: HFTokenizer) -> None:
    chat = ChatFormat(tokenizer)
    ids = chat.prompt_ids([{"role": "user", "content": "What is 2+2?"}])
    assert tokenizer.decode(ids) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_observation_message_closes_the_turn_unless_eos_was_generated(tokenizer: HFTokenizer) -> None:
    chat = ChatFormat(tokenizer)
    after_stop = tokenizer.decode(chat.message_ids("user", "exit code 0", after_eos=False))
    after_eos = tokenizer.decode(chat.message_ids("user", "exit code 0", after_eos=True))
    assert after_stop == "<|im_end|>\n<|im_start|>user\nexit code 0<|im_end|>\n<|im_start|>assistant\n"
    assert after_eos == after_stop[len("<|im_end|>") :]


def test_tool_role_uses_the_templates_tool_response_framing(tokenizer: HFTokenizer) -> None:
    text = tokenizer.decode(ChatFormat(tokenizer).message_ids("tool", "4", after_eos=True))
    assert (
        text == "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_buffer_masks_only_generated_tokens() -> None:
    buffer = TokenBuffer()
    buffer.add_context([1, 2])
    buffer.add_generated([3, 4], [-0.5, -0.25])
    buffer.add_context([5])
    ids, mask, lps = buffer.arrays()
    assert ids.tolist() == [1, 2, 3, 4, 5] and mask.tolist() == [0, 0, 1, 1, 0]
    assert lps.tolist() == [0.0, 0.0, -0.5, -0.25, 0.0]
    with pytest.raises(ValueError, match="logprobs"):
        buffer.add_generated([6], [])
