"""The local model factory: deterministic weights, byte-level tokenizer, chat template."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from stacx.rollout.models import ModelFactoryError, make_tiny_model, make_tokenizer


def _digest(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()


def test_same_seed_same_weights_other_seed_other_weights(
    tmp_path: Path, tiny_model_dir: Path, other_model_dir: Path
) -> None:
    again = make_tiny_model(tmp_path / "again", seed=0)
    assert _digest(again) == _digest(tiny_model_dir)
    assert _digest(other_model_dir) != _digest(tiny_model_dir)


def test_layout_loads_with_auto_classes(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["chat_template"]


def test_digits_are_single_tokens_and_text_round_trips() -> None:
    tokenizer = make_tokenizer()
    text = '123+456=579 héllo <tool_call>{"a": 1}</tool_call>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in tokenizer.encode("123", add_special_tokens=False)] == [
        "1",
        "2",
        "3",
    ]
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids
    # tool markers survive skip_special_tokens, chat control tokens do not
    marked = tokenizer.encode("<|im_start|><tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(marked, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_chat_template_renders_tools_and_tool_results() -> None:
    tokenizer = make_tokenizer()
    messages = [
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "calc", "arguments": {"expr": "2+3"}}}],
        },
        {"role": "tool", "content": "5"},
    ]
    tools = [{"type": "function", "function": {"name": "calc"}}]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call><|im_end|>' in text
    assert "<tool_response>\n5\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_unknown_override_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelFactoryError, match="hidden_dim"):
        make_tiny_model(tmp_path, hidden_dim=8)
    with pytest.raises(ModelFactoryError, match="num_attention_heads"):
        make_tiny_model(tmp_path, hidden_size=30, num_attention_heads=4)
