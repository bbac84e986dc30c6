"""The seams of the inference package: what rollout code needs from a policy server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from stacx.rollout.inference.client import GenerateResult, ModelInfo
    from stacx.rollout.inference.sampling import SamplingParams

__all__ = ["GenerationBackend"]


@runtime_checkable
class GenerationBackend(Protocol):
    """Token-in, token-out generation with logprobs and weight versions.

    `InferenceClient` implements it over HTTP (built-in server or SGLang);
    `stacx.rollout.inference.fake.ScriptedBackend` implements it in memory for tests.
    """

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams | None = None, return_logprob: bool = True
    ) -> GenerateResult: ...

    async def get_model_info(self) -> ModelInfo: ...

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | int | None = None, abort_all_requests: bool = False
    ) -> dict[str, Any]: ...
