"""`make_tiny_model`: a small random-weight Qwen2 causal LM in standard HF layout (safetensors).

Deterministic: the same seed and overrides give the same weights. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stacx.rollout.models.errors import ModelFactoryError
from stacx.rollout.models.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, make_tokenizer

__all__ = ["SPECIAL_TOKENS", "TinyModelConfig", "make_tiny_model"]


@dataclass(kw_only=True, slots=True)
class TinyModelConfig:
    """Shape and seed of a tiny Qwen2 model (the vocabulary comes from the tokenizer)."""

    hidden_size: int = 64
    """Width of the residual stream."""
    intermediate_size: int = 256
    """Width of the MLP."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 4
    """Query heads (must divide hidden_size)."""
    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention; must divide num_attention_heads)."""
    max_position_embeddings: int = 4096
    """Longest sequence the rotary embedding is configured for."""
    initializer_range: float = 0.02
    """Std of the random init; larger values give peakier output distributions."""
    tie_word_embeddings: bool = False
    """Share the input embedding with the output head (tied tiny random models tend to just
    repeat the last token; untied ones give varied, seed-dependent outputs)."""
    seed: int = 0
    """torch RNG seed for the weights."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ModelFactoryError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; pick sizes where it divides"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelFactoryError(
                f"num_attention_heads={self.num_attention_heads} is not divisible by "
                f"num_key_value_heads={self.num_key_value_heads}"
            )


def _model_config(cfg: TinyModelConfig, tokenizer: Any) -> Any:
    from transformers import Qwen2Config

    eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        initializer_range=cfg.initializer_range,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )


def _make_tokenizer_config_portable(path: Path) -> None:
    """Let transformers v4 readers (e.g. an SGLang install) load what v5 wrote.

    v5 names the class `TokenizersBackend` and keeps the template only in `chat_template.jinja`;
    v4 knows `PreTrainedTokenizerFast` and reads `chat_template` from this file.
    """
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def make_tiny_model(out_dir: str | Path, **overrides: Any) -> Path:
    """Write a tiny model and its tokenizer to `out_dir`; returns the directory.

    `overrides` are `TinyModelConfig` fields, e.g. `make_tiny_model(d, seed=1, hidden_size=128)`.
    """
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    known = {f.name for f in dataclasses.fields(TinyModelConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ModelFactoryError(f"unknown tiny-model field(s) {unknown}; known: {sorted(known)}")
    cfg = TinyModelConfig(**overrides)
    tokenizer = make_tokenizer()
    config = _model_config(cfg, tokenizer)
    torch.manual_seed(cfg.seed)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=False
    )
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        _make_tokenizer_config_portable(out / "tokenizer_config.json")
    except OSError as exc:
        raise ModelFactoryError(f"cannot write the tiny model to {out}: {exc}") from exc
    return out
