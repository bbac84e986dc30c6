"""A byte-level tokenizer built locally with the `tokenizers` library.

Every byte is one token (ids 0-255, in byte order), so digits and operators are single tokens and
any UTF-8 text round-trips. On top come the chat-format special tokens (ChatML, as Qwen2 uses) and
the tool-call markers. The tool markers are *not* special: they stay visible in decoded text, so an
agent can parse `<tool_call>...</tool_call>` from a completion decoded with `skip_special_tokens`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHAT_TEMPLATE", "EOS_TOKEN", "PAD_TOKEN", "SPECIAL_TOKENS", "TOOL_TOKENS", "make_tokenizer"]

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN)
"""Control tokens, dropped by `decode(..., skip_special_tokens=True)`."""
TOOL_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Tool-call markers: single tokens that stay visible in decoded text."""

CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions. Function signatures are within"
    " <tools></tools>:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each call, return a JSON object with the function name and arguments within"
    " <tool_call></tool_call> tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    "<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' %}"
    "<|im_start|>user\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}"
    "{% set fn = call.function if call.function is defined else call %}"
    '<tool_call>\n{"name": "{{ fn.name }}", "arguments": '
    "{{ fn.arguments if fn.arguments is string else fn.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML with Qwen2-style tools; `tool` messages become `<tool_response>` user turns."""


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in character for each byte 0-255, in byte order."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    extra = 0
    chars: list[str] = []
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def _build_backend() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: index for index, char in enumerate(_byte_alphabet())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return backend


def make_tokenizer() -> Any:
    """A `PreTrainedTokenizerFast`: byte-level vocabulary, ChatML chat template, tool tokens."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_build_backend(),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
