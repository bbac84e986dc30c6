"""Adapters to the real clients: inference (mock HTTP transport) and gateway (fake backend)."""

from __future__ import annotations

import json

import httpx
import pytest

from stacx.rollout.adapters import GatewayEnvironments, InferenceAdapter
from stacx.rollout.errors import InferenceCallError, RewardError
from stacx.rollout.protocols import SamplingParams
from stacx.schemas.records import TaskSample


def _server(captured: list[dict], *, version: str = "7", status: int = 200):
    def handle(request: httpx.Request) -> httpx.Response:
        captured.append(json.loads(request.content))
        body = {
            "text": "hi",
            "output_ids": [5, 6, 7],
            "meta_info": {
                "weight_version": version,
                "finish_reason": {"type": "stop", "matched": "</tool_call>"},
                "output_token_logprobs": [[-0.5, 5, None], [-0.25, 6, None], [-0.125, 7, None]],
                "prompt_tokens": 3,
                "completion_tokens": 3,
            },
        }
        return httpx.Response(status, json=body if status == 200 else {"error": {"message": "bad"}})

    return httpx.MockTransport(handle)


async def test_inference_adapter_sends_sglang_request_and_reads_ids_logprobs_version() -> None:
    from stacx.rollout.inference.client import InferenceClient

    captured: list[dict] = []
    client = InferenceClient(InferenceClient.Config(base_url="http://inference"), transport=_server(captured))
    params = SamplingParams(max_new_tokens=9, temperature=0.5, stop=["</tool_call>"])
    generation = await InferenceAdapter(client).generate([1, 2, 3], params)
    assert captured[0]["input_ids"] == [1, 2, 3] and captured[0]["return_logprob"] is True
    assert captured[0]["sampling_params"]["stop"] == ["</tool_call>"]
    assert captured[0]["sampling_params"]["max_new_tokens"] == 9
    assert generation.output_ids == [5, 6, 7] and generation.logprobs == [-0.5, -0.25, -0.125]
    assert generation.weight_version == 7 and generation.finish_reason == "stop"
    await client.close()


async def test_non_numeric_weight_version_is_unknown_not_an_error() -> None:
    from stacx.rollout.inference.client import InferenceClient

    client = InferenceClient(
        InferenceClient.Config(base_url="http://x"), transport=_server([], version="default")
    )
    generation = await InferenceAdapter(client).generate([1], SamplingParams())
    assert generation.weight_version is None
    await client.close()


async def test_inference_errors_become_inference_call_errors() -> None:
    from stacx.rollout.inference.client import InferenceClient

    client = InferenceClient(InferenceClient.Config(base_url="http://x"), transport=_server([], status=400))
    with pytest.raises(InferenceCallError, match="bad"):
        await InferenceAdapter(client).generate([1], SamplingParams())
    await client.close()


async def test_gateway_environments_run_exec_and_close_sessions() -> None:
    from stacx.sandbox.client import SandboxClient
    from stacx.sandbox.models import ExecResult
    from stacx.sandbox.testing import FakeBackend, serve_gateway

    specs = []

    def handler(sandbox, request):  # type: ignore[no-untyped-def]
        specs.append(sandbox.spec)
        return ExecResult(
            exit_code=0, stdout=f"ran {request.command} <{request.stdin}>", stderr="", duration_s=0.01
        )

    backend = FakeBackend(handler)
    with serve_gateway(backend, token="t") as url:
        async with SandboxClient(SandboxClient.Config(base_url=url, token="t")) as client:
            envs = GatewayEnvironments(
                client, GatewayEnvironments.Config(default_image="stacx/sandbox:bookworm")
            )
            task = TaskSample(task_id="t", task_type="m", prompt="p")
            session = await envs.open(task, cpus=0.5, memory_mb=256)
            result = await session.exec("python3 -", stdin="print(1)\n", timeout_s=5)
            assert result.exit_code == 0 and result.stdout == "ran python3 - <print(1)\n>"
            with pytest.raises(RewardError, match="no task_dir"):
                await session.verify()
            await session.close()
            assert await client.list_sessions() == []
    spec = specs[0]
    assert spec.cpus == 0.5 and spec.memory_mb == 256
