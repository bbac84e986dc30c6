"""Terminal output made fit for error text: ANSI escape sequences (colours, cursor moves) removed."""

from __future__ import annotations

import re

__all__ = ["clean_text"]

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
"""CSI sequences (`ESC [ ... m`), OSC sequences (`ESC ] ... BEL`) and the two-byte escapes."""


def clean_text(text: str) -> str:
    """`text` without ANSI escape sequences and with carriage-return progress lines folded to
    their final state (`\\r\\n` kept as a line end)."""
    text = _ANSI.sub("", text).replace("\r\n", "\n")
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))
