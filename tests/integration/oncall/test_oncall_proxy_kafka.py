"""Real Kafka and the real inference server: the `openai` client through the agent proxy.

Every answer must equal the server's own answer to the same OpenAI call, and every call must
appear on the agent-logs topic with the exact prompt ids the model saw and the completion ids
and logprobs the server generated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from stacx.consumers import EventConsumer
from stacx.rollout.inference import InferenceServer
from stacx.rollout.proxy import AgentProxy, EventRecorder, ProxyServer
from stacx.schemas.records import AgentInteraction, Feedback

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]


@pytest.fixture
def server(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    srv = InferenceServer(
        InferenceServer.Config(model_path=str(tiny_model_dir), port=0, served_model_name="tiny")
    )
    srv.start()
    yield srv
    srv.stop()


def _read(bootstrap: str, topics: list[str], group: str, count: int, timeout_s: float = 60) -> list[Any]:
    consumer = EventConsumer(EventConsumer.Config(bootstrap_servers=bootstrap, group_id=group, topics=topics))
    events: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(events) < count and time.monotonic() < deadline:
            events += consumer.consume(100, 1.0)
    finally:
        consumer.close()
    return events


def _server_chat(server: InferenceServer, **body: Any) -> dict[str, Any]:
    answer = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": "tiny", "return_token_ids": True, **body},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_openai_client_through_the_proxy_and_every_call_logged_token_exact(
    kafka_bootstrap: str,
    fresh_topic: Callable[..., str],
    fresh_group: str,
    server: InferenceServer,
    other_model_dir: Path,
) -> None:
    logs, feedback = fresh_topic("agent-logs", partitions=4), fresh_topic("feedback", partitions=4)
    config = ProxyServer.Config(
        proxy=AgentProxy.Config(upstreams=[server.base_url], agent_logs_topic=logs, feedback_topic=feedback),
        port=0,
        bootstrap_servers=kafka_bootstrap,
    )
    with ProxyServer(config) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.base_url}/s/sess-1/v1", api_key="unused")
        messages = [{"role": "user", "content": "What is 2+3?"}]
        chat = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, temperature=0, logprobs=True
        )
        direct = _server_chat(server, messages=messages, max_tokens=12, temperature=0, logprobs=True)
        assert chat.choices[0].message.content == direct["choices"][0]["message"]["content"]
        assert [c.logprob for c in chat.choices[0].logprobs.content] == pytest.approx(
            [c["logprob"] for c in direct["choices"][0]["logprobs"]["content"]], abs=1e-5
        )

        streamed = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, temperature=0, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == chat.choices[0].message.content

        tool_messages = [{"role": "user", "content": "add 2 and 3"}]
        tool_call = client.chat.completions.create(
            model="tiny",
            messages=tool_messages,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=24,
            temperature=0,
        )
        direct_tool = _server_chat(
            server, messages=tool_messages, tools=TOOLS, tool_choice="required", max_tokens=24, temperature=0
        )
        ours, theirs = tool_call.choices[0].message, direct_tool["choices"][0]["message"]
        assert ours.content == theirs["content"]
        assert [c.function.name for c in ours.tool_calls or []] == [
            c["function"]["name"] for c in theirs.get("tool_calls") or []
        ]

        completion = client.completions.create(
            model="tiny", prompt="12+30=", max_tokens=6, temperature=0, logprobs=0
        )
        stream_completion = client.completions.create(
            model="tiny", prompt="12+30=", max_tokens=6, temperature=0, stream=True
        )
        assert "".join(c.choices[0].text for c in stream_completion) == completion.choices[0].text

        swapped = httpx.post(
            f"{server.base_url}/update_weights_from_disk",
            json={"model_path": str(other_model_dir), "weight_version": "7"},
            timeout=60,
        )
        assert swapped.json()["success"]
        after_swap = client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=4,
            temperature=0,
            extra_headers={"X-Stacx-Session": "sess-2"},
        )
        rated = httpx.post(
            f"{proxy.base_url}/v1/feedback",
            json={"session_id": "sess-1", "reward": 1.0, "interaction_id": chat.id},
            timeout=10,
        )
        assert rated.status_code == 202 and rated.json() == {"accepted": True}
        assert proxy.recorder.flush(30)
        metrics = httpx.get(f"{proxy.base_url}/metrics").text
        assert "stacx_proxy_events_published_total 7" in metrics

    events = _read(kafka_bootstrap, [logs, feedback], fresh_group, 7)
    by_id = {e.value.interaction_id: e for e in events if isinstance(e.value, AgentInteraction)}
    assert len(by_id) == 6
    assert all(e.key == e.value.session_id for e in by_id.values())  # keyed by session
    (rating,) = [e.value for e in events if isinstance(e.value, Feedback)]
    assert rating.interaction_id == chat.id

    logged = by_id[chat.id].value
    assert logged.session_id == "sess-1" and logged.policy_version == 0
    prompt_len = int(logged.metadata["prompt_length"])
    ids = [int(t) for t in logged.token_ids]
    assert ids[:prompt_len] == direct["prompt_token_ids"]  # what the model saw
    assert ids[prompt_len:] == direct["choices"][0]["token_ids"]  # what it generated
    assert list(logged.loss_mask) == [0] * prompt_len + [1] * (len(ids) - prompt_len)
    assert np.allclose(
        logged.logprobs[prompt_len:],
        [c["logprob"] for c in direct["choices"][0]["logprobs"]["content"]],
        atol=1e-5,
    )

    tool_logged = by_id[tool_call.id].value
    tl = int(tool_logged.metadata["prompt_length"])
    assert [int(t) for t in tool_logged.token_ids[:tl]] == direct_tool["prompt_token_ids"]
    assert [int(t) for t in tool_logged.token_ids[tl:]] == direct_tool["choices"][0]["token_ids"]
    assert "add" in tool_logged.metadata["tools"]

    stream_logged = by_id[streamed_id(by_id, chat.id)].value
    assert [int(t) for t in stream_logged.token_ids] == ids and stream_logged.metadata["stream"] == "true"

    swap_logged = by_id[after_swap.id].value
    assert swap_logged.policy_version == 7 and swap_logged.session_id == "sess-2"
    assert by_id[completion.id].value.metadata["endpoint"] == "completions"


def streamed_id(by_id: dict[str, Any], exclude: str) -> str:
    (sid,) = [
        i
        for i, e in by_id.items()
        if e.value.metadata.get("stream") == "true" and e.value.metadata["endpoint"] == "chat"
    ]
    return sid


def test_kafka_down_never_blocks_calls_and_reports_degraded(server: InferenceServer) -> None:
    config = ProxyServer.Config(
        proxy=AgentProxy.Config(
            upstreams=[server.base_url], recorder=EventRecorder.Config(max_buffered=3, retry_backoff_s=0.5)
        ),
        port=0,
        bootstrap_servers="127.0.0.1:1",  # nothing listens there
        producer={"delivery_timeout_ms": 2000},
    )
    with ProxyServer(config) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key="unused", max_retries=0)
        started = time.monotonic()
        for _ in range(6):
            answer = client.completions.create(model="tiny", prompt="1+1=", max_tokens=4, temperature=0)
            assert answer.choices[0].finish_reason in ("length", "stop")
        assert time.monotonic() - started < 30  # answered, never waiting on Kafka
        metrics = httpx.get(f"{proxy.base_url}/metrics").text
        assert "stacx_proxy_degraded 1" in metrics
        assert "stacx_proxy_events_dropped_total 3" in metrics
        assert httpx.get(f"{proxy.base_url}/health").json()["status"] == "degraded"
        proxy.recorder.close(0.5)
