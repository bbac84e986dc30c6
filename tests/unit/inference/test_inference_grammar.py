"""Constrained decoding (rollout/inference/grammar.py): SGLang's `regex` / `json_schema` and
OpenAI's `response_format`, checked on the output text with Python's own `re` and `json`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from inference_fixtures import serve_tiny

from stacx.rollout.inference import InferenceServer
from stacx.rollout.inference.grammar import token_bytes

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "done": {"type": "boolean"}},
    "required": ["answer", "done"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    with serve_tiny(tiny_model_dir, weight_version="0", context_length=256) as srv:
        yield srv


def _generate(server: InferenceServer, sampling: dict, text: str = "Answer: ") -> httpx.Response:
    body = {"text": text, "sampling_params": sampling}
    return httpx.post(f"{server.base_url}/generate", json=body, timeout=120)


def test_token_bytes_are_what_each_token_decodes_to(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    table = token_bytes(tokenizer)
    special = set(tokenizer.all_special_ids)
    ids = {i for ids in table.values() for i in ids}
    assert ids == set(tokenizer.get_vocab().values()) - special
    for raw, token_ids in table.items():
        for token_id in token_ids:
            text = tokenizer.decode([token_id])
            if "\ufffd" not in text:  # a token that is part of a UTF-8 character decodes to U+FFFD
                assert text.encode("utf-8") == raw


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sampled_output_matches_the_regex(server: InferenceServer, seed: int) -> None:
    pattern = r"[0-9]{2,3}-(red|green|blue)"
    sampling = {"regex": pattern, "temperature": 1.0, "max_new_tokens": 32, "sampling_seed": seed}
    response = _generate(server, sampling)
    assert response.status_code == 200, response.text
    body = response.json()
    assert re.fullmatch(pattern, body["text"]), body["text"]
    assert body["meta_info"]["finish_reason"]["type"] == "stop"  # the complete pattern allows only EOS


def test_sampled_output_is_json_valid_under_the_schema(server: InferenceServer) -> None:
    response = _generate(
        server, {"json_schema": json.dumps(SCHEMA), "temperature": 0.7, "max_new_tokens": 96, "n": 3}
    )
    assert response.status_code == 200, response.text
    for choice in response.json():
        value = json.loads(choice["text"])
        assert set(value) == {"answer", "done"}
        assert type(value["answer"]) is int and type(value["done"]) is bool


def test_unconstrained_rows_in_the_same_batch_are_untouched(server: InferenceServer) -> None:
    free = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    alone = _generate(server, free).json()["text"]
    batch = httpx.post(
        f"{server.base_url}/generate",
        json={"text": ["Answer: ", "Answer: "], "sampling_params": [free, {**free, "regex": "(yes|no)"}]},
        timeout=120,
    )
    assert batch.status_code == 200, batch.text
    texts = [choice["text"] for choice in batch.json()]
    assert texts[0] == alone
    assert texts[1] in ("yes", "no")


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"regex": "[unclosed"}, "sampling_params.regex"),
        ({"json_schema": "{not json"}, "sampling_params.json_schema"),
        ({"regex": "a", "json_schema": "{}"}, "sampling_params.regex"),
    ],
)
def test_a_bad_pattern_is_400_naming_its_field(server: InferenceServer, sampling: dict, field: str) -> None:
    response = _generate(server, sampling)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(f"{field}: ")


def test_openai_response_format_json_schema(server: InferenceServer) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "Reply in JSON."}],
        max_tokens=96,
        temperature=0.5,
        seed=7,
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}},
    )
    value = json.loads(answer.choices[0].message.content or "")
    assert set(value) == {"answer", "done"} and type(value["done"]) is bool


def test_openai_response_format_json_object(server: InferenceServer) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "Reply in JSON."}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
