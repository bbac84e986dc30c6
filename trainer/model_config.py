"""Where a role's weights come from: a plain dataclass, so reading a trainer config needs no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stacx.trainer.errors import ConfigError

__all__ = ["ModelConfig"]


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Where a role's weights come from."""

    path: str | None = None
    """Local Hugging Face model directory (config.json + safetensors); never downloaded."""
    tiny: dict[str, Any] | None = None
    """Qwen2Config overrides for a randomly initialised tiny model (tests, examples); for a slot
    with a `flow` head, FlowConfig fields of the 2-D flow model (trainer/flow.py)."""
    seed: int = 0
    """Initialisation seed for `tiny` models: the same seed gives the same weights."""
    dtype: str = "float32"
    """Parameter dtype when loading (`float32`, `bfloat16`)."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to transformers (`sdpa`, `eager`, `flash_attention_2`)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further keyword arguments for `from_pretrained`."""

    def __post_init__(self) -> None:
        if (self.path is None) == (self.tiny is None):
            raise ConfigError("model: set exactly one of `path` (a local HF directory) or `tiny` "
                              "(a dict of Qwen2Config overrides, {} for the default tiny model)")
