"""Token bookkeeping: the exact sequence the model saw, its loss mask and logprobs.

Generated ids are appended exactly as the inference server returned them; only prompts and
observations are tokenised here, so there is no re-tokenisation drift.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from stacx.rollout.protocols import Message, Tokenizer
from stacx.schemas.records import Logprobs, LossMask, TokenIds, logprobs, loss_mask, token_ids

__all__ = [
    "ChatFormat",
    "FastTokenizer",
    "HFTokenizer",
    "TokenBuffer",
    "load_tokenizer",
    "model_vocab_size",
    "out_of_vocabulary",
]

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


_SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"
)
"""The named special tokens a chat template sees (transformers' `special_tokens_map`)."""


class FastTokenizer:
    """`Tokenizer` over a Hugging Face tokenizer directory without transformers (nor torch, which
    transformers' AutoTokenizer imports): tokenizer.json through the `tokenizers` library (the same
    Rust tokenizer `HFTokenizer` calls, so the same ids) and the chat template rendered with jinja2
    the way transformers' `apply_chat_template` renders it. `from_dir` returns None for a directory
    it cannot read exactly as transformers would (then use `HFTokenizer`)."""

    def __init__(self, backend: Any, chat_template: str, special_tokens: dict[str, str]) -> None:
        self.backend = backend
        self.special_tokens = special_tokens
        self._template = _compile_chat_template(chat_template)
        vocab = backend.get_vocab(with_added_tokens=True)
        eos = {vocab[special_tokens["eos_token"]]} if special_tokens.get("eos_token") in vocab else set()
        eos.update(vocab[name] for name in _END_OF_TURN_TOKENS if name in vocab)
        self.eos_token_ids = frozenset(eos)

    @classmethod
    def from_dir(cls, path: str | Path) -> FastTokenizer | None:
        folder = Path(path)
        files = folder / "tokenizer.json", folder / "tokenizer_config.json"
        if not all(f.is_file() for f in files) or (folder / "additional_chat_templates").exists():
            return None
        config = json.loads(files[1].read_text(encoding="utf-8"))
        split = (folder / "special_tokens_map.json").exists()
        if not isinstance(config, dict) or config.get("auto_map") or split:
            return None  # remote code, or special tokens split over two files: transformers decides
        file = folder / "chat_template.jinja"  # takes priority over the config's, as in transformers
        template = file.read_text(encoding="utf-8") if file.is_file() else config.get("chat_template")
        if not isinstance(template, str):
            return None  # no template, or several named ones
        special = {name: _token_text(config.get(name)) for name in _SPECIAL_TOKEN_NAMES}
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(files[0]))
        return cls(backend, template, {name: text for name, text in special.items() if text is not None})

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=False))

    def render_chat(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return str(
            self._template.render(
                messages=list(messages),
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        )


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or a serialised AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@lru_cache(maxsize=8)
def _compile_chat_template(template: str) -> Any:
    """jinja2 set up as transformers' `apply_chat_template` sets it up (sandboxed, trimmed blocks,
    loop controls, its `tojson`, `raise_exception` and `strftime_now`)."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_tag(), jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


def _generation_tag() -> Any:
    """`{% generation %}...{% endgeneration %}` renders its body (transformers marks assistant
    tokens with it; rendering a prompt needs only the text)."""
    import jinja2.ext
    import jinja2.nodes

    class GenerationTag(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    return GenerationTag


def load_tokenizer(path: str | Path) -> FastTokenizer | HFTokenizer:
    """The tokenizer in `path`: `FastTokenizer` when it can read the directory (no torch, no
    transformers imported), else `HFTokenizer`."""
    return FastTokenizer.from_dir(path) or HFTokenizer(str(path))


_SUB_CONFIGS = ("text_config", "llm_config", "language_config", "decoder", "generator", "thinker_config")
"""Nested model configs whose `vocab_size` transformers' `get_text_config` would pick instead."""


def model_vocab_size(model_dir: str | Path) -> int | None:
    """`vocab_size` of the Hugging Face model in `model_dir` (its text model's for a multimodal
    one), or None when the directory holds no model config (a tokenizer alone).

    A plain config.json with its `vocab_size` is read as JSON; anything else (nested configs, no
    `vocab_size`) through transformers' AutoConfig, which fills in the model type's defaults."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        tree = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # not a config transformers can read either: nothing to check against
    vocab = tree.get("vocab_size") if isinstance(tree, dict) else None
    if isinstance(vocab, int) and vocab > 0 and not any(key in tree for key in _SUB_CONFIGS):
        return vocab
    return _auto_config_vocab_size(model_dir)


def _auto_config_vocab_size(model_dir: str | Path) -> int | None:
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
