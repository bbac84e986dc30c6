"""The OpenAI routes driven by the official `openai` client, answers validated with its own models."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from inference_fixtures import CALC_CALL, CALC_TOOLS, serve_tiny, tool_markers
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from stacx.rollout.inference import InferenceServer

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    with serve_tiny(tiny_model_dir, served_model_name="tiny", context_length=4096) as srv:
        yield srv


@pytest.fixture
def client(server: InferenceServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def _valid(model: type, response: object) -> None:
    """Strict validation with the client's own pydantic model (the client itself is lenient)."""
    model.model_validate(response.model_dump(exclude_unset=True))  # type: ignore[attr-defined]


def test_models_list_and_unknown_model_404(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    _valid(Model, models.data[0])
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-nope")
    with pytest.raises(openai.NotFoundError, match="gpt-nope"):
        client.chat.completions.create(model="gpt-nope", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]


def test_chat_n_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="tiny",
        messages=HELLO,
        max_tokens=6,
        n=3,
        temperature=0.9,
        seed=5,
        logprobs=True,
        top_logprobs=2,  # type: ignore[arg-type]
    )
    _valid(ChatCompletion, answer)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    for choice in answer.choices:
        assert choice.finish_reason in ("stop", "length")
        content = choice.logprobs.content  # type: ignore[union-attr]
        assert content and all(len(t.top_logprobs) == 2 for t in content)
        assert all(t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content)
    assert answer.usage is not None
    assert answer.usage.completion_tokens == sum(len(c.logprobs.content) for c in answer.choices)  # type: ignore[union-attr]


def test_seed_is_honoured(client: openai.OpenAI) -> None:
    def sample(seed: int) -> list[str | None]:
        answer = client.chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=12, n=2, temperature=1.0, seed=seed
        )  # type: ignore[arg-type]
        return [c.message.content for c in answer.choices]

    first = sample(123)
    assert sample(123) == first
    assert sample(124) != first
    assert first[0] != first[1]  # choice i samples with seed + i


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=10, temperature=0)  # type: ignore[arg-type]
    stream = client.chat.completions.create(
        model="tiny",
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
    )
    chunks = list(stream)
    for chunk in chunks:
        _valid(ChatCompletionChunk, chunk)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == (plain.choices[0].message.content or "")
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]
    streamed_logprobs = [
        t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content or []
    ]
    assert len(streamed_logprobs) == plain.usage.completion_tokens  # type: ignore[union-attr]


def test_completions_n_logprobs_echo_and_stream(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model="tiny", prompt="12+30=", max_tokens=5, temperature=0, logprobs=3, n=2
    )
    _valid(Completion, answer)
    first = answer.choices[0]
    assert first.text == answer.choices[1].text  # greedy
    assert len(first.logprobs.tokens) == 5 and all(len(t) <= 3 for t in first.logprobs.top_logprobs)  # type: ignore[union-attr, arg-type]
    echoed = client.completions.create(
        model="tiny", prompt="12+30=", max_tokens=5, temperature=0, logprobs=0, echo=True
    )
    assert echoed.choices[0].text == "12+30=" + first.text
    assert echoed.choices[0].logprobs.token_logprobs[0] is None  # type: ignore[union-attr, index]
    assert len(echoed.choices[0].logprobs.tokens) == 6 + 5  # type: ignore[union-attr, arg-type]
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt="12+30=",
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    for chunk in chunks:  # OpenAI itself streams finish_reason null, which its Completion model rejects
        if not chunk.choices or chunk.choices[0].finish_reason is not None:
            _valid(Completion, chunk)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == first.text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    batch = client.completions.create(model="tiny", prompt=[[49, 50], [51, 52]], max_tokens=3, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]


def test_tool_choice_modes(server: InferenceServer, client: openai.OpenAI) -> None:
    def prompt_ids(**options: object) -> list[int]:
        raw = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=HELLO,  # type: ignore[arg-type]
            tools=CALC_TOOLS,  # type: ignore[arg-type]
            max_tokens=3,
            temperature=0,
            extra_body={"return_token_ids": True},
            **options,  # type: ignore[arg-type]
        )
        _valid(ChatCompletion, raw.parse())
        return json.loads(raw.text)["prompt_token_ids"]  # type: ignore[no-any-return]

    decode = server.state.tokenizer.decode
    assert "# Tools" in decode(prompt_ids(tool_choice="auto"))
    assert "# Tools" not in decode(prompt_ids(tool_choice="none"))
    assert decode(prompt_ids(tool_choice="required")).endswith("assistant\n<tool_call>\n")
    named = decode(prompt_ids(tool_choice={"type": "function", "function": {"name": "calc"}}))
    assert named.endswith('<tool_call>\n{"name": "calc", "arguments": ')
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        prompt_ids(tool_choice={"type": "function", "function": {"name": "missing"}})


def test_logprob_bytes_are_the_raw_token_bytes(server: InferenceServer, client: openai.OpenAI) -> None:
    """Byte 0xC3 alone is half of 'é': its text is U+FFFD but its bytes are [0xC3]."""
    answer = client.chat.completions.create(
        model="tiny",
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=2,
        logprobs=True,
        logit_bias={"195": 100},  # force byte 0xC3
        temperature=0,
    )
    tokens = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert tokens[0].bytes == [0xC3]  # type: ignore[index]


def test_bad_values_are_400_with_the_field(server: InferenceServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny", messages=HELLO, temperature=5)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model="tiny", messages=HELLO, response_format={"type": "xml"})  # type: ignore[arg-type]
    raw = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        content='{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
        timeout=30,
    )
    assert raw.status_code == 400 and "temperature" in raw.json()["error"]["message"]


def _literal(text: str) -> str:
    """A regex (SGLang's `regex` extension) matching exactly `text`."""
    return re.escape(text)


def test_tool_call_arguments_are_the_models_own_text(server: InferenceServer, client: openai.OpenAI) -> None:
    """An agent sends the call back; the next prompt extends the sampled tokens exactly."""
    messages: list[dict[str, object]] = [{"role": "user", "content": "1+1?"}]
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        tools=CALC_TOOLS,  # type: ignore[arg-type]
        max_tokens=64,
        temperature=0,
        logit_bias=tool_markers(server),
        extra_body={"regex": _literal(CALC_CALL), "return_token_ids": True},
    )
    first = json.loads(raw.text)
    call = raw.parse().choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.arguments == '{"expr":"1+1"}'
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "2"},
    ]
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        tools=CALC_TOOLS,  # type: ignore[arg-type]
        max_tokens=1,
        extra_body={"return_token_ids": True},
    )
    sampled = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert json.loads(raw.text)["prompt_token_ids"][: len(sampled)] == sampled


@pytest.mark.parametrize(
    "output",
    [
        "  ab<tool",
        "ab \n" + CALC_CALL + "  cd ",
        " x <tool_call>not json</tool_call> y",
        "<tool_c",
    ],
)
def test_streamed_content_equals_the_plain_answer_with_tools(
    server: InferenceServer, client: openai.OpenAI, output: str
) -> None:
    options: dict[str, object] = {
        "model": "tiny",
        "messages": HELLO,
        "tools": CALC_TOOLS,
        "max_tokens": 64,
        "temperature": 0,
        "logit_bias": tool_markers(server),
        "extra_body": {"regex": _literal(output)},
    }
    plain = client.chat.completions.create(**options).choices[0]  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(stream=True, **options))  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == (plain.message.content or "")
    calls = [t.function for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert [(f.name, f.arguments) for f in calls] == [
        (t.function.name, t.function.arguments) for t in plain.message.tool_calls or []
    ]


def test_abort_all_ends_openai_requests_too(server: InferenceServer, client: openai.OpenAI) -> None:
    """OpenAI requests carry no client rid; `abort_all` (before a weight swap) must end them."""
    outcome: dict[str, object] = {}

    def long_chat() -> None:
        try:
            client.chat.completions.create(
                model="tiny",
                messages=HELLO,  # type: ignore[arg-type]
                max_tokens=3000,
                extra_body={"ignore_eos": True},
            )
        except openai.APIStatusError as exc:
            outcome["error"] = exc
        else:
            outcome["error"] = None

    thread = threading.Thread(target=long_chat)
    thread.start()
    deadline = time.monotonic() + 60
    while server.engine.metrics.gauges["running_requests"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    aborted = httpx.post(f"{server.base_url}/abort_request", json={"abort_all": True}, timeout=30)
    thread.join(timeout=60)
    assert aborted.json()["num_aborted"] == 1
    error = outcome["error"]
    assert isinstance(error, openai.APIStatusError) and error.status_code == 503, error
    assert "aborted" in str(error)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"logit_bias": {"65": 1e308}}, "logit_bias.65"),
        ({"logit_bias": {"65": -1e308}}, "logit_bias.65"),
        ({"seed": 2**70}, "seed"),
    ],
)
def test_values_no_model_can_take_are_400_naming_the_field_and_counted(
    server: InferenceServer, client: openai.OpenAI, options: dict[str, object], param: str
) -> None:
    before = server.engine.metrics.counters["requests_invalid_total"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2, **options)  # type: ignore[call-overload]
    assert caught.value.param == param and caught.value.type is not None
    assert server.engine.metrics.counters["requests_invalid_total"] == before + 1
    metrics = text_string_to_metric_families(httpx.get(f"{server.base_url}/metrics", timeout=30).text)
    samples = {sample.name: sample.value for family in metrics for sample in family.samples}
    assert samples["stacx_inference_requests_invalid_total"] == before + 1


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/generate", b'{"text": "a\\ud800", "sampling_params": {"max_new_tokens": 2}}', "text"),
        ("/generate", b'{"text": "a", "sampling_params": {"sampling_seed": 1180591620717411303424}}',
         "sampling_params.sampling_seed"),
        ("/v1/completions", b'{"prompt": "a\\udfff", "max_tokens": 2}', "prompt"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
         "messages[0].content"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "body"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user",, }]}', "body"),
    ],
)
def test_raw_bodies_get_openai_error_bodies(
    server: InferenceServer, path: str, body: bytes, param: str
) -> None:
    """Bodies the `openai` client cannot send: lone surrogates (it encodes UTF-8), bad bytes, bad JSON."""
    before = server.engine.metrics.counters["requests_invalid_total"]
    answer = httpx.post(f"{server.base_url}{path}", content=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert server.engine.metrics.counters["requests_invalid_total"] == before + 1
    error = answer.json()["error"]
    assert error["param"] == param and error["code"] == 400
    assert error["message"].startswith(f"{param}: ")
