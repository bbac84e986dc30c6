"""Token bookkeeping: the exact sequence the model saw, its loss mask and logprobs.

Generated ids are appended exactly as the inference server returned them; only prompts and
observations are tokenised here, so there is no re-tokenisation drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rollout.protocols import Message, Tokenizer
from schemas.records import Logprobs, LossMask, TokenIds, logprobs, loss_mask, token_ids

__all__ = ["ChatFormat", "HFTokenizer", "TokenBuffer", "model_vocab_size", "out_of_vocabulary"]

MAX_NAMED_IDS = 5
"""How many offending token ids a vocabulary problem names."""


class TokenBuffer:
    """Flat token ids with a loss mask (1 = model-generated) and per-token sampling logprobs."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []

    def add_context(self, ids: Sequence[int]) -> None:
        """Prompt, template or observation tokens: mask 0, logprob 0."""
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def add_generated(self, ids: Sequence[int], token_logprobs: Sequence[float]) -> None:
        """Model tokens exactly as sampled: mask 1 and their sampling logprobs."""
        if len(ids) != len(token_logprobs):
            raise ValueError(f"{len(ids)} generated ids but {len(token_logprobs)} logprobs")
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in token_logprobs)

    def __len__(self) -> int:
        return len(self.ids)

    def arrays(self) -> tuple[TokenIds, LossMask, Logprobs]:
        return token_ids(self.ids), loss_mask(self.mask), logprobs(self.logprobs)


_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>")
_MARK = "\u2063STACX-ASSISTANT\u2063"


class ChatFormat:
    """Renders prompts and observation messages with the tokenizer's chat template."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        text = self.tokenizer.render_chat(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text)

    def message_ids(self, role: str, content: str, *, after_eos: bool) -> list[int]:
        """Tokens that close the assistant turn, add a `role` message and open the next turn.

        Computed as a template delta on a fixed conversation, so it works for any template.
        `after_eos`: the generated ids already end with the end-of-turn token.
        """
        base: list[Message] = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": _MARK},
        ]
        full = self.tokenizer.render_chat(
            [*base, {"role": role, "content": content}], add_generation_prompt=True
        )
        delta = full[full.index(_MARK) + len(_MARK) :]
        if after_eos:
            delta = self._strip_end_of_turn(delta)
        return self.tokenizer.encode(delta)

    def _strip_end_of_turn(self, delta: str) -> str:
        for eos in sorted(self.tokenizer.eos_token_ids):
            text = self.tokenizer.decode([eos])
            if text and delta.startswith(text):
                return delta[len(text) :]
        return delta


class HFTokenizer:
    """`Tokenizer` over a Hugging Face tokenizer directory (imports transformers lazily)."""

    def __init__(self, path_or_tokenizer: Any) -> None:
        if isinstance(path_or_tokenizer, str):
            from transformers import AutoTokenizer

            path_or_tokenizer = AutoTokenizer.from_pretrained(path_or_tokenizer)
        self.inner = path_or_tokenizer
        eos: set[int] = set()
        if isinstance(getattr(self.inner, "eos_token_id", None), int):
            eos.add(self.inner.eos_token_id)
        vocab = self.inner.get_vocab()
        eos.update(vocab[name] for name in _END_OF_TURN_TOKENS if name in vocab)
        self.eos_token_ids = frozenset(eos)
        self._fast = getattr(self.inner, "backend_tokenizer", None)

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:  # the Rust tokenizer directly: same ids, a fraction of the time
            return list(self._fast.encode(text, add_special_tokens=False).ids)
        return list(self.inner.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        if self._fast is not None:
            return str(self._fast.decode(list(ids), skip_special_tokens=False))
        return str(self.inner.decode(list(ids), skip_special_tokens=False))

    def render_chat(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return str(
            self.inner.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )


def model_vocab_size(model_dir: str | Path) -> int | None:
    """`vocab_size` of the Hugging Face model in `model_dir` (its text model's for a multimodal
    one), or None when the directory holds no model config (a tokenizer alone)."""
    if not (Path(model_dir) / "config.json").is_file():
        return None
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(model_dir)).get_text_config()
    except (OSError, ValueError):
        return None  # not a config transformers can read: nothing to check against
    vocab = getattr(config, "vocab_size", None)
    return int(vocab) if isinstance(vocab, int) and vocab > 0 else None


def out_of_vocabulary(ids: TokenIds | Sequence[int], vocab_size: int) -> list[int]:
    """The first few distinct token ids outside [0, vocab_size) (empty: all inside)."""
    array = np.asarray(ids)
    if not array.size or (array.min() >= 0 and array.max() < vocab_size):
        return []
    bad = np.unique(array[(array < 0) | (array >= vocab_size)])
    return [int(i) for i in bad[:MAX_NAMED_IDS]]
