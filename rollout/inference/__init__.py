"""Inference serving: the built-in SGLang-compatible server, its batching engine, the client.

from rollout.inference import InferenceClient, InferenceServer, SamplingParams
"""

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
