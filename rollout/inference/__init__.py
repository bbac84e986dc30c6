"""Inference serving: the built-in SGLang-compatible server, its batching engine, the client.

from rollout.inference import InferenceClient, InferenceServer, SamplingParams

Names are imported on first use: a client, a router or an error type does not pull in the
engine's torch (a process that only talks to a server stays a few tens of MiB).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.lazy import lazy_attributes

if TYPE_CHECKING:
    from rollout.inference.client import GenerateResult, InferenceClient, ModelInfo
    from rollout.inference.engine import BatchingEngine, GenerationOutput
    from rollout.inference.errors import (
        EngineStoppedError,
        InferenceError,
        InvalidRequestError,
        OverloadedError,
        ServerError,
        ServerUnavailableError,
        WeightLoadError,
    )
    from rollout.inference.fake import ScriptedBackend
    from rollout.inference.protocols import GenerationBackend
    from rollout.inference.sampling import SamplingParams
    from rollout.inference.server import InferenceServer, load_model

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
    "BatchingEngine": "rollout.inference.engine",
    "EngineStoppedError": "rollout.inference.errors",
    "GenerateResult": "rollout.inference.client",
    "GenerationBackend": "rollout.inference.protocols",
    "GenerationOutput": "rollout.inference.engine",
    "InferenceClient": "rollout.inference.client",
    "InferenceError": "rollout.inference.errors",
    "InferenceServer": "rollout.inference.server",
    "InvalidRequestError": "rollout.inference.errors",
    "ModelInfo": "rollout.inference.client",
    "OverloadedError": "rollout.inference.errors",
    "SamplingParams": "rollout.inference.sampling",
    "ScriptedBackend": "rollout.inference.fake",
    "ServerError": "rollout.inference.errors",
    "ServerUnavailableError": "rollout.inference.errors",
    "WeightLoadError": "rollout.inference.errors",
    "load_model": "rollout.inference.server",
}


__getattr__ = lazy_attributes(__name__, _HOMES)
