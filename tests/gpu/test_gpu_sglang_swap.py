"""SGLang on a locally made small model: generate, swap weights through the subscriber, verify.

Needs a CUDA GPU and the sglang package; fails (does not skip) with the reason when either is
missing, because it only runs when asked for (STACX_GPU_TESTS=1). Kafka is not needed: the
subscriber reads an in-memory event source (its Kafka side is covered by
tests/integration/inference). Takes about 1-3 minutes, mostly SGLang start-up.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stacx.consumers.weights import WeightSubscriber
from stacx.rollout.inference import InferenceClient, SamplingParams
from stacx.rollout.inference.sglang import SGLangServer, unavailable_reason
from stacx.rollout.models import make_tiny_model
from stacx.schemas.records import WeightVersion

pytestmark = pytest.mark.gpu

# head_dim 64 and bf16: shapes and dtypes every SGLang attention backend supports.
SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}
PORT = int(os.environ.get("STACX_GPU_TEST_PORT", "30555"))


@dataclass
class _Event:
    value: Any


class ListSource:
    """In-memory stand-in for the `stacx.weights` consumer."""

    def __init__(self, records: list[WeightVersion]) -> None:
        self.pending = deque(_Event(r) for r in records)

    def poll(self, timeout: float = 1.0) -> _Event | None:
        return self.pending.popleft() if self.pending else None

    def total_lag(self, timeout: float = 10.0) -> int:
        return len(self.pending)

    def assignment(self) -> list[tuple[str, int]]:
        return [("stacx.weights", 0)]

    def close(self) -> None:
        pass


def test_sglang_generates_and_swaps_weights_via_subscriber(tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.fail(f"SGLang cannot run on this machine: {reason}", pytrace=False)
    first = make_tiny_model(tmp_path / "v0", seed=0, **SHAPE)
    second = make_tiny_model(tmp_path / "v1", seed=1, **SHAPE)
    server = SGLangServer(SGLangServer.Config(
        model_path=str(first), port=PORT, dtype="bfloat16", weight_version="0",
        mem_fraction_static=0.2, extra_args=["--disable-cuda-graph", "--log-level", "warning"]))
    server.start()
    try:
        server.wait_ready(timeout_s=480)
        before = asyncio.run(_generate(server.base_url))
        assert before.weight_version == "0"
        assert len(before.output_ids) == 16 and before.logprobs is not None
        assert all(lp <= 0.0 for lp in before.logprobs)

        records = [WeightVersion(model_name="policy", version=1, path=str(second))]
        subscriber = WeightSubscriber(
            WeightSubscriber.Config(model_name="policy", server_url=server.base_url),
            source=ListSource(records))
        with subscriber:
            applied = subscriber.catch_up()
        assert applied is not None and applied.version == 1

        after = asyncio.run(_generate(server.base_url))
        assert after.weight_version == "1"
        assert after.output_ids != before.output_ids
    finally:
        server.stop()


async def _generate(base_url: str) -> Any:
    params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
    async with InferenceClient(InferenceClient.Config(base_url=base_url)) as client:
        return await client.generate([60, 61, 62, 63], params)
