"""Local model factory: tiny Hugging Face causal LMs and tokenizers built without any download."""

from stacx.rollout.models.errors import ModelFactoryError
from stacx.rollout.models.tiny import SPECIAL_TOKENS, TinyModelConfig, make_tiny_model
from stacx.rollout.models.tokenizer import CHAT_TEMPLATE, make_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "ModelFactoryError",
    "TinyModelConfig",
    "make_tiny_model",
    "make_tokenizer",
]
