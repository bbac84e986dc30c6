"""`ScriptedBackend`: an in-memory `GenerationBackend` for tests that need no server."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from stacx.rollout.inference.client import GenerateResult, ModelInfo
from stacx.rollout.inference.sampling import SamplingParams

__all__ = ["ScriptedBackend"]


class ScriptedBackend:
    """Answers each `generate` with `respond(input_ids) -> output ids` (default: echo last id).

    Logprobs are log(1/2) per token; `update_weights_from_disk` records the call and switches
    the reported version, as a real server does.
    """

    def __init__(
        self,
        respond: Callable[[list[int]], list[int]] | None = None,
        weight_version: str = "0",
        model_path: str = "scripted",
    ) -> None:
        self.respond = respond or (lambda ids: ids[-1:])
        self.weight_version = weight_version
        self.model_path = model_path
        self.calls: list[list[int]] = []
        """Every prompt seen, in order."""

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams | None = None, return_logprob: bool = True
    ) -> GenerateResult:
        params = sampling or SamplingParams()
        self.calls.append(list(input_ids))
        output = list(self.respond(list(input_ids)))[: params.max_new_tokens]
        finish = "length" if len(output) >= params.max_new_tokens else "stop"
        return GenerateResult(
            output_ids=output,
            logprobs=[math.log(0.5)] * len(output) if return_logprob else None,
            text="",
            weight_version=self.weight_version,
            finish_reason=finish,
            matched_stop=None,
            prompt_tokens=len(input_ids),
            completion_tokens=len(output),
        )

    async def get_model_info(self) -> ModelInfo:
        return ModelInfo(model_path=self.model_path, weight_version=self.weight_version)

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | int | None = None, abort_all_requests: bool = False
    ) -> dict[str, Any]:
        self.model_path = model_path
        if weight_version is not None:
            self.weight_version = str(weight_version)
        return {"success": True, "message": "scripted", "num_paused_requests": 0}
