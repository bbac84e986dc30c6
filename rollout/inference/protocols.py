"""The seams of the inference package: what rollout code needs from a policy server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from stacx.rollout.inference.client import GenerateResult, ModelInfo
    from stacx.rollout.inference.sampling import SamplingParams

__all__ = ["EngineContract", "GenerationBackend"]


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


@runtime_checkable
class EngineContract(GenerationBackend, Protocol):
    """What every inference engine serves (builtin, vLLM, SGLang), on SGLang's HTTP API.

    Token ids in and out; the logprob of each sampled token (log_softmax of the unprocessed
    logits); the weight version each answer was sampled under, one per answer; reload from a
    directory of safetensors with a new version (in-flight requests finish on the old weights, or
    are aborted with `abort_all_requests`); abort; health. `InferenceClient` speaks it to any of
    them; tests/integration/inference/test_engine_contract.py checks each engine against it.
    """

    async def abort_all(self) -> None: ...

    async def health(self) -> bool: ...
