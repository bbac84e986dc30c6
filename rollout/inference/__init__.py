"""Inference serving: the built-in SGLang-compatible server, its batching engine, the client.

from stacx.rollout.inference import InferenceClient, InferenceServer, SamplingParams

Names are imported on first use: a client, a router or an error type does not pull in the
engine's torch (a process that only talks to a server stays a few tens of MiB).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stacx.schemas.lazy import lazy_attributes

if TYPE_CHECKING:
    from stacx.rollout.inference.client import GenerateResult, InferenceClient, ModelInfo
    from stacx.rollout.inference.engine import BatchingEngine, GenerationOutput
    from stacx.rollout.inference.errors import (
        EngineStoppedError,
        InferenceError,
        InvalidRequestError,
        OverloadedError,
        ServerError,
        ServerUnavailableError,
        WeightLoadError,
    )
    from stacx.rollout.inference.fake import ScriptedBackend
    from stacx.rollout.inference.protocols import GenerationBackend
    from stacx.rollout.inference.sampling import SamplingParams
    from stacx.rollout.inference.server import InferenceServer, load_model

__all__ = [
    "BatchingEngine",
    "EngineStoppedError",
    "GenerateResult",
    "GenerationBackend",
    "GenerationOutput",
    "InferenceClient",
    "InferenceError",
    "InferenceServer",
    "InvalidRequestError",
    "ModelInfo",
    "OverloadedError",
    "SamplingParams",
    "ScriptedBackend",
    "ServerError",
    "ServerUnavailableError",
    "WeightLoadError",
    "load_model",
]

_HOMES = {
    "BatchingEngine": "stacx.rollout.inference.engine",
    "EngineStoppedError": "stacx.rollout.inference.errors",
    "GenerateResult": "stacx.rollout.inference.client",
    "GenerationBackend": "stacx.rollout.inference.protocols",
    "GenerationOutput": "stacx.rollout.inference.engine",
    "InferenceClient": "stacx.rollout.inference.client",
    "InferenceError": "stacx.rollout.inference.errors",
    "InferenceServer": "stacx.rollout.inference.server",
    "InvalidRequestError": "stacx.rollout.inference.errors",
    "ModelInfo": "stacx.rollout.inference.client",
    "OverloadedError": "stacx.rollout.inference.errors",
    "SamplingParams": "stacx.rollout.inference.sampling",
    "ScriptedBackend": "stacx.rollout.inference.fake",
    "ServerError": "stacx.rollout.inference.errors",
    "ServerUnavailableError": "stacx.rollout.inference.errors",
    "WeightLoadError": "stacx.rollout.inference.errors",
    "load_model": "stacx.rollout.inference.server",
}


__getattr__ = lazy_attributes(__name__, _HOMES)
