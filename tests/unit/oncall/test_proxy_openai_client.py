"""The agent proxy driven by the official `openai` client, in front of the real built-in server:
answers equal the server's own (streamed or not), the recorded token ids line up from call to
call, and logprob bytes are the tokens' own. Events go to an in-memory publisher (the Kafka path
is tested in tests/integration/oncall)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from inference_fixtures import CALC_CALL, CALC_TOOLS, serve_tiny, tool_markers

from stacx.producers import InMemoryPublisher
from stacx.rollout.inference import InferenceServer
from stacx.rollout.proxy import AgentProxy, ProxyServer
from stacx.schemas import topics
from stacx.schemas.records import AgentInteraction

HALF_CHARACTER = 0xC3
"""Byte token 195: the first half of 'é', text U+FFFD on its own."""


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    with serve_tiny(tiny_model_dir, served_model_name="tiny", context_length=4096) as srv:
        yield srv


class _Proxy:
    """One proxy service per module; each test talks to it as a session of its own."""

    def __init__(self, server: InferenceServer, **config: Any) -> None:
        self.publisher = InMemoryPublisher()
        self.service = ProxyServer(
            ProxyServer.Config(proxy=AgentProxy.Config(upstreams=[server.base_url], **config), port=0),
            publisher=self.publisher,
        )
        self.base_url = self.service.start()
        self.client: openai.OpenAI = openai.OpenAI(base_url=self.base_url, api_key="unused")

    def new_session(self) -> _Proxy:
        """A client on a fresh session; what is recorded and counted from now on is the test's."""
        self.session = f"sess-{uuid.uuid4().hex[:8]}"
        self.client = openai.OpenAI(
            base_url=f"{self.base_url}/s/{self.session}/v1", api_key="unused", max_retries=0
        )
        self.invalid_before = self.metrics()["requests_invalid_total"]
        return self

    def metrics(self) -> dict[str, float]:
        return self.service.recorder.metrics.snapshot()

    def num_invalid(self) -> float:
        return self.metrics()["requests_invalid_total"] - self.invalid_before

    def logged(self) -> list[AgentInteraction]:
        assert self.service.recorder.flush(30)
        records = self.publisher.records(topics.AGENT_LOGS)
        return [r for r in records if isinstance(r, AgentInteraction) and r.session_id == self.session]

    def close(self) -> None:
        self.client.close()
        self.service.stop()


@pytest.fixture(scope="module")
def proxy_service(server: InferenceServer) -> Iterator[_Proxy]:
    p = _Proxy(server)
    yield p
    p.close()


@pytest.fixture(scope="module")
def continuing_service(server: InferenceServer) -> Iterator[_Proxy]:
    p = _Proxy(server, exact_continuation=True)
    yield p
    p.close()


@pytest.fixture
def proxy(proxy_service: _Proxy) -> Iterator[_Proxy]:
    yield proxy_service.new_session()
    proxy_service.client.close()


@pytest.fixture
def continuing_proxy(continuing_service: _Proxy) -> Iterator[_Proxy]:
    yield continuing_service.new_session()
    continuing_service.client.close()


def _ids(interaction: AgentInteraction) -> list[int]:
    return [int(t) for t in interaction.token_ids]


def _content(answer: Any, stream: bool) -> tuple[str, list[Any]]:
    """(content, tool calls) of a plain answer or of a stream's chunks."""
    if not stream:
        message = answer.choices[0].message
        return message.content or "", list(message.tool_calls or [])
    chunks = [c for c in answer if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    return text, [t for c in chunks for t in c.choices[0].delta.tool_calls or []]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_arguments_come_back_as_sampled_and_the_next_call_extends_the_tokens(
    server: InferenceServer, proxy: _Proxy, stream: bool
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "1+1?"}]
    answer = proxy.client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        tools=CALC_TOOLS,  # type: ignore[arg-type]
        max_tokens=64,
        temperature=0,
        logit_bias=tool_markers(server),
        stream=stream,  # type: ignore[call-overload]
        extra_body={"regex": re.escape(CALC_CALL)},
    )
    _, calls = _content(answer, stream)
    (call,) = calls
    assert call.function.arguments == '{"expr":"1+1"}'
    back = {"id": call.id, "type": "function", "function": call.function.model_dump()}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [back]},
        {"role": "tool", "tool_call_id": call.id, "content": "2"},
    ]
    proxy.client.chat.completions.create(
        model="tiny", messages=messages, tools=CALC_TOOLS, max_tokens=1  # type: ignore[arg-type]
    )
    first, second = proxy.logged()
    assert _ids(second)[: len(_ids(first))] == _ids(first)


@pytest.mark.parametrize(
    "output", ["  ab<tool", "ab \n" + CALC_CALL + "  cd ", " x <tool_call>bad</tool_call>"]
)
def test_streamed_content_equals_the_plain_answer_with_tools(
    server: InferenceServer, proxy: _Proxy, output: str
) -> None:
    options: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello"}],
        "tools": CALC_TOOLS,
        "max_tokens": 64,
        "temperature": 0,
        "logit_bias": tool_markers(server),
        "extra_body": {"regex": re.escape(output)},
    }
    plain, plain_calls = _content(proxy.client.chat.completions.create(**options), False)
    streamed, streamed_calls = _content(proxy.client.chat.completions.create(stream=True, **options), True)
    assert streamed == plain
    assert [c.function.arguments for c in streamed_calls] == [c.function.arguments for c in plain_calls]


@pytest.mark.parametrize("stream", [False, True])
def test_exact_continuation_holds_for_plain_and_streamed_chat(continuing_proxy: _Proxy, stream: bool) -> None:
    """Two half characters decode to two U+FFFD, which re-encode to other bytes: only the
    continuation keeps the second prompt on the sampled ids."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    answer = continuing_proxy.client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=2,
        temperature=0,
        logit_bias={str(HALF_CHARACTER): 100},
        stream=stream,  # type: ignore[call-overload]
    )
    content, _ = _content(answer, stream)
    assert content == "\ufffd\ufffd"
    messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "and?"}]
    again = continuing_proxy.client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=1, stream=stream  # type: ignore[call-overload]
    )
    _content(again, stream)  # a stream is recorded once it has been read to its end
    first, second = continuing_proxy.logged()
    assert _ids(first)[-2:] == [HALF_CHARACTER, HALF_CHARACTER]
    assert _ids(second)[: len(_ids(first))] == _ids(first)


@pytest.mark.parametrize("stream", [False, True])
def test_logprob_bytes_are_the_raw_token_bytes(proxy: _Proxy, stream: bool) -> None:
    answer = proxy.client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=2,
        logprobs=True,
        logit_bias={str(HALF_CHARACTER): 100},
        temperature=0,
        stream=stream,  # type: ignore[call-overload]
    )
    if stream:
        chunks = [c.choices[0].logprobs for c in answer if c.choices and c.choices[0].logprobs]
        tokens = [t for logprobs in chunks for t in logprobs.content or []]
    else:
        tokens = answer.choices[0].logprobs.content
    assert [t.bytes for t in tokens] == [[HALF_CHARACTER], [HALF_CHARACTER]]


@pytest.mark.parametrize(
    "options", [{"logit_bias": {"65": 1e308}}, {"logit_bias": {"65": -1e308}}, {"seed": 2**70}]
)
def test_values_no_model_can_take_are_400_and_counted(proxy: _Proxy, options: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        proxy.client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, **options
        )
    assert caught.value.param in ("logit_bias.65", "seed")
    assert proxy.num_invalid() == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
        (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "body"),
        (b'{"messages": [{"role": "user",, }]}', "body"),
    ],
)
def test_raw_bodies_get_openai_error_bodies(proxy: _Proxy, body: bytes, param: str) -> None:
    """Bodies the `openai` client cannot send: lone surrogates (it encodes UTF-8), bad bytes, bad JSON."""
    answer = httpx.post(f"{proxy.base_url}/v1/chat/completions", content=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert proxy.num_invalid() == 1
