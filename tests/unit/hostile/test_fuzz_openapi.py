"""The fuzz tier: bodies generated from the request schemas the three HTTP services publish
(`app.openapi()`; the proxy's OpenAI routes parse their body themselves, so their schema is the
request model's own), every field sometimes hostile (NaN, Infinity, 1e400, huge integers, lone
surrogates, NUL, 100 KB strings, deep nesting, wrong types), plus a hostile session header.
Properties: no answer is a 5xx, and a good request is answered the same before and after.
Fixed seed (`derandomize`) and a bounded example count, so it runs in `make test`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hostile_services import Service
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stacx.rollout.inference.openai_api import ChatCompletionRequest, CompletionRequest

EXAMPLES = 30
"""Generated bodies per route (each one an HTTP request to a live service)."""

SKIPPED_ROUTES = {"/update_weights_from_disk", "/abort_request"}
"""Routes whose *valid* use changes what other requests get (new weights, aborted requests)."""

HOSTILE_NUMBERS = [math.nan, math.inf, -math.inf, 10**30, 2**63, -(2**63) - 1, -1, 1e308]
HOSTILE_STRINGS = ["", "\ud800", "a\x00b", "x" * 100_000, "NaN", "9" * 5000, "../../etc/passwd"]
HOSTILE_ANY = [None, True, [], {}, "[[[[", 1e400]


def _deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        *_, kind, name = schema["$ref"].split("/")
        schema = root["$defs"][name] if kind == "$defs" else root["components"]["schemas"][name]
    return schema


def _valid(schema: dict[str, Any], root: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
    schema = _resolve(schema, root)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        return st.one_of([value(b, root, depth) for b in branches])
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(min_value=-1, max_value=8)
    if kind == "number":
        return st.floats(min_value=-2, max_value=2, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.text(max_size=12)
    if kind == "null":
        return st.none()
    if kind == "array" and depth < 3:
        return st.lists(value(schema.get("items", {}), root, depth + 1), max_size=3)
    if kind == "object" and depth < 3:
        return _object(schema, root, depth + 1)
    return st.sampled_from(HOSTILE_ANY)


def value(schema: dict[str, Any], root: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """A value for `schema`: mostly one it describes, sometimes a hostile one."""
    hostile = st.sampled_from(HOSTILE_NUMBERS + HOSTILE_STRINGS + HOSTILE_ANY) | st.just(_deep(1000))
    return st.one_of(_valid(schema, root, depth), _valid(schema, root, depth), hostile)


def _object(schema: dict[str, Any], root: dict[str, Any], depth: int) -> st.SearchStrategy[dict[str, Any]]:
    properties = schema.get("properties") or {}
    if not properties:
        return st.dictionaries(st.text(max_size=8), value({}, root, depth), max_size=3)
    required = set(schema.get("required", []))
    fields = {name: value(prop, root, depth) for name, prop in properties.items() if name in required}
    optional = {name: value(prop, root, depth) for name, prop in properties.items() if name not in required}
    return st.fixed_dictionaries(fields, optional=optional)


def _routes(service: Service) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(path, body schema, schema root) of every JSON-body route the service publishes."""
    spec = service.app.openapi()
    routes = []
    for path, methods in spec["paths"].items():
        body = methods.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json")
        if body and path not in SKIPPED_ROUTES:
            routes.append((path, body["schema"], spec))
    if service.name == "proxy":  # parsed in the handler: the published schema is the model's
        for path, model in (
            ("/v1/chat/completions", ChatCompletionRequest),
            ("/v1/completions", CompletionRequest),
        ):
            routes.append((path, model.model_json_schema(), model.model_json_schema()))
    return routes


def _concrete(service: Service, path: str) -> str:
    """The route with its path parameters filled (the gateway's one session)."""
    if "{session_id}" in path:
        return path.replace("{session_id}", service.good_path.split("/")[3])
    return path


def _dumps(body: Any) -> bytes:
    try:
        return json.dumps(body).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        return b"[" * 2000


def _fuzz(service: Service, path: str, strategy: st.SearchStrategy[Any]) -> Callable[[], None]:
    url = f"{service.base_url}{_concrete(service, path)}"
    headers_strategy = st.sampled_from(["s1", "", "x" * 300, "\u00e9t\u00e9"])

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(body=strategy, session=headers_strategy)
    def run(body: Any, session: str) -> None:
        headers = {"content-type": b"application/json"}
        if session:
            headers["x-stacx-session"] = session.encode()  # raw UTF-8 bytes, as a careless client sends
        response = httpx.post(url, content=_dumps(body), headers=headers, timeout=120)
        assert response.status_code < 500, f"{path}: {response.status_code} {response.text[:300]}"
        if service.name == "gateway" and path == "/v1/sessions" and response.status_code == 201:
            httpx.delete(f"{service.base_url}/v1/sessions/{response.json()['id']}", timeout=60)

    return run


def test_generated_hostile_bodies_get_no_5xx_and_good_requests_stay_the_same(service: Service) -> None:
    good = httpx.post(f"{service.base_url}{service.good_path}", json=service.good_body, timeout=60)
    before = service.answer(good.json())
    routes = _routes(service)
    assert routes, f"{service.name} publishes no JSON-body route"
    for path, schema, root in routes:
        _fuzz(service, path, _object(_resolve(schema, root), root, 0))()
    after = httpx.post(f"{service.base_url}{service.good_path}", json=service.good_body, timeout=60)
    assert after.status_code in (200, 201) and service.answer(after.json()) == before


@pytest.mark.parametrize("service_name", ["server", "proxy", "gateway"])
def test_every_service_publishes_its_request_schemas(
    service_name: str, request: pytest.FixtureRequest
) -> None:
    found: Service = request.getfixturevalue(f"{service_name}_service")
    assert len(_routes(found)) >= 2
