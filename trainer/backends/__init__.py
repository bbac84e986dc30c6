"""Backends: where models live and how they are sharded, checkpointed and exported."""

from stacx.trainer.backends.base import Backend
from stacx.trainer.backends.fsdp import FSDP2Backend
from stacx.trainer.backends.single import SingleProcessBackend
from stacx.trainer.config import BackendConfig

__all__ = ["Backend", "FSDP2Backend", "SingleProcessBackend", "build_backend"]


def build_backend(config: BackendConfig) -> Backend:
    """The backend named by `config.kind`."""
    if config.kind == "fsdp2":
        return FSDP2Backend(config)
    return SingleProcessBackend(config)
