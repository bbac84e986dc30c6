"""One process, one device."""

from __future__ import annotations

from stacx.trainer.backends.base import Backend

__all__ = ["SingleProcessBackend"]


class SingleProcessBackend(Backend):
    """Everything on rank 0; worker groups collapse onto it."""

    name = "single"
