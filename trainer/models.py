"""Building role models: a Hugging Face causal LM (from a local path or a tiny config) with an
optional scalar head (critic values, reward scores).

Shape legend: B sequences, L padded length, V vocabulary, H hidden size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from stacx.trainer.errors import ConfigError
from stacx.trainer.model_config import ModelConfig
from stacx.trainer.protocols import ModelOutput

__all__ = ["Head", "ModelConfig", "StacxModel", "build_model", "tiny_qwen2_config"]

Head = Literal["lm", "value", "lm+value", "flow"]

TINY_QWEN2: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def tiny_qwen2_config(**overrides: Any) -> Any:
    """A transformers Qwen2Config of a tiny model (vocab 64, hidden 32, 2 layers by default)."""
    from transformers import Qwen2Config

    return Qwen2Config(**{**TINY_QWEN2, **overrides})


def _untyped(module: nn.Module) -> Any:
    """`module` typed loosely: transformers' helpers are not visible to the type checker."""
    return module


class StacxModel(nn.Module):
    """A transformer trunk with an LM head, a scalar value head, or both (shared trunk)."""

    def __init__(self, backbone: nn.Module, head: Head, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head: Head = head
        self.value_head = nn.Linear(hidden_size, 1) if head != "lm" else None
        if self.value_head is not None:
            nn.init.normal_(self.value_head.weight, std=0.02)
            nn.init.zeros_(self.value_head.bias)

    @property
    def config(self) -> Any:
        return self.backbone.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ModelOutput:
        if self.head == "lm":
            backbone: Any = self.backbone
            logits = backbone(input_ids=input_ids, attention_mask=attention_mask).logits
            return ModelOutput(logits=logits)  # [B, L, V]
        trunk: Any = self.backbone.base_model if self.head == "lm+value" else self.backbone
        hidden = trunk(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        assert self.value_head is not None
        values = self.value_head(hidden).squeeze(-1).float()  # [B, L]
        if self.head == "value":
            return ModelOutput(values=values)
        lm_head = _untyped(self.backbone).get_output_embeddings()
        return ModelOutput(logits=lm_head(hidden), values=values)

    def hf_module(self) -> nn.Module:
        """The Hugging Face module whose weights are exported (`save_pretrained` layout)."""
        return self.backbone


def _load_backbone(cfg: ModelConfig, head: Head) -> nn.Module:
    from transformers import AutoModel, AutoModelForCausalLM

    if cfg.path is not None and not (Path(cfg.path) / "config.json").is_file():
        raise ConfigError(f"model.path={cfg.path!r} has no config.json; point it at a local "
                          "Hugging Face model directory")
    auto = AutoModel if head == "value" else AutoModelForCausalLM
    if cfg.tiny is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            hf_config = tiny_qwen2_config(**cfg.tiny)
            return auto.from_config(hf_config, attn_implementation=cfg.attn_implementation)
    return auto.from_pretrained(str(cfg.path), dtype=getattr(torch, cfg.dtype),
                                attn_implementation=cfg.attn_implementation, **cfg.extra)


def build_model(cfg: ModelConfig, head: Head = "lm") -> nn.Module:
    """Build (on CPU) the model of one model slot: a StacxModel, or a FlowModel for `flow`."""
    if head == "flow":
        from stacx.trainer.flow import build_flow_model

        if cfg.tiny is None:
            raise ConfigError("a `flow` slot needs `tiny` (FlowConfig fields, {} for defaults); "
                              "flow models are not loaded from a path")
        return build_flow_model(cfg.tiny, cfg.seed).to(getattr(torch, cfg.dtype))
    backbone: Any = _load_backbone(cfg, head)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 1)
        model = StacxModel(backbone, head, int(backbone.config.hidden_size))
    return model.to(getattr(torch, cfg.dtype))
