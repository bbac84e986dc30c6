"""Token-exact continuation of a session's chat: the model sees its own sampled tokens again.

A chat client sends back the assistant's answer as text; rendering it again through the chat
template and tokenizer may give other ids than the ones sampled (a different split of the same
text, a missing end-of-turn token after a length stop). For RL that breaks the trajectory: the
next call's prompt no longer extends the previous prompt + completion. With continuation on, when
a chat request repeats the session's previous messages, then the previous answer verbatim, then
new messages, its prompt is the previous prompt ids + the sampled ids + the template's tokens for
the rest (end of the assistant turn, the new messages, the generation prompt), exactly as the
built-in evaluator builds its sequences. Anything else is rendered as usual.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

__all__ = ["ChatContinuations"]

_MARK = "\u2063STACX-ANSWER\u2063"


@dataclass(frozen=True, slots=True)
class _Last:
    messages: list[str]
    """The previous request's messages, each as canonical JSON."""
    ids: list[int]
    """Its prompt ids + the sampled ids."""
    answer: str
    end_text: str
    """Text of the special token the sampled ids end with ('' if none): not repeated after them."""


class ChatContinuations:
    """Per-session memory of the last chat call (bounded, least recently used forgotten)."""

    def __init__(self, tokenizer: Any, max_sessions: int = 10_000) -> None:
        self.tokenizer = tokenizer
        self.max_sessions = max_sessions
        self._last: OrderedDict[str, _Last] = OrderedDict()
        self._lock = threading.Lock()
        self.num_continued = 0
        self._special = set(getattr(tokenizer, "all_special_ids", []) or [])

    def prompt_ids(self, session_id: str, messages: list[dict[str, Any]]) -> list[int] | None:
        """The continued prompt, or None when this request does not continue the session."""
        with self._lock:
            last = self._last.get(session_id)
        keys = [_key(m) for m in messages]
        k = len(last.messages) if last is not None else 0
        if last is None or len(keys) <= k + 1 or keys[:k] != last.messages:
            return None
        answer = messages[k]
        if (
            answer.get("role") != "assistant"
            or answer.get("content") != last.answer
            or "tool_calls" in answer
        ):
            return None
        marked = [*messages[:k], {"role": "assistant", "content": _MARK}, *messages[k + 1 :]]
        text = str(self.tokenizer.apply_chat_template(marked, add_generation_prompt=True, tokenize=False))
        rest = text[text.index(_MARK) + len(_MARK) :]
        if last.end_text and rest.startswith(last.end_text):
            rest = rest[len(last.end_text) :]
        self.num_continued += 1
        return [*last.ids, *self.tokenizer.encode(rest, add_special_tokens=False)]

    def remember(
        self,
        session_id: str,
        messages: list[dict[str, Any]],
        prompt: list[int],
        output: list[int],
        answer: str,
    ) -> None:
        end = output[-1] if output and output[-1] in self._special else None
        last = _Last(
            messages=[_key(m) for m in messages],
            ids=[*prompt, *output],
            answer=answer,
            end_text=str(self.tokenizer.decode([end])) if end is not None else "",
        )
        with self._lock:
            self._last[session_id] = last
            self._last.move_to_end(session_id)
            while len(self._last) > self.max_sessions:
                self._last.popitem(last=False)


def _key(message: dict[str, Any]) -> str:
    return json.dumps(message, sort_keys=True)
