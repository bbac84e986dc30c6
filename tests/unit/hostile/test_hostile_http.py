"""One request must never take a service down: each of the three HTTP services (inference server,
agent proxy, sandbox gateway) answers an oversized body, an oversized header, a stalled body, a
half-sent head and NaN/Infinity numbers with a clean 4xx, and still answers good requests alike."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from hostile_services import LIMITS, Service

from stacx.schemas import topics


def _connect(service: Service) -> socket.socket:
    url = urlsplit(service.base_url)
    return socket.create_connection((url.hostname, url.port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _good(service: Service) -> object:
    response = httpx.post(f"{service.base_url}{service.good_path}", json=service.good_body, timeout=60)
    assert response.status_code in (200, 201), response.text
    return service.answer(response.json())


def test_a_body_past_the_limit_is_413_naming_the_limit(service: Service) -> None:
    body = b"x" * (LIMITS.max_body_bytes + 1)
    response = httpx.post(f"{service.base_url}{service.good_path}", content=body, timeout=60)
    assert response.status_code == 413, response.text
    assert str(LIMITS.max_body_bytes) in response.text


def test_a_chunked_body_past_the_limit_is_413_before_it_is_all_read(service: Service) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(8):
            yield b"[" * (256 << 10)

    response = httpx.post(f"{service.base_url}{service.good_path}", content=chunks(), timeout=60)
    assert response.status_code == 413, response.text


def test_a_64k_header_is_431_naming_the_header(service: Service) -> None:
    headers = {"x-stacx-session": "s" * (64 << 10)}
    response = httpx.post(
        f"{service.base_url}{service.good_path}", json=service.good_body, headers=headers, timeout=60
    )
    assert response.status_code == 431, response.text
    assert "x-stacx-session" in response.text


def test_a_body_that_stops_arriving_is_408(service: Service) -> None:
    with _connect(service) as sock:
        host = urlsplit(service.base_url).netloc
        head = (
            f"POST {service.good_path} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
            "content-length: 100\r\n\r\n{"
        )
        sock.sendall(head.encode())
        started = time.monotonic()
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < LIMITS.read_timeout_s + 5


def test_a_half_sent_head_is_answered_408_and_closed(service: Service) -> None:
    with _connect(service) as sock:
        sock.sendall(f"POST {service.good_path} HTTP/1.1\r\nHost: x\r\n".encode())
        answer = _read_all(sock)  # returns at EOF: the server closed the connection
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_a_connection_that_sends_nothing_is_closed(service: Service) -> None:
    with _connect(service) as sock:
        assert _read_all(sock).startswith(b"HTTP/1.1 408")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_nan_and_infinity_in_numbers_are_a_4xx_naming_the_field(service: Service, number: str) -> None:
    field, body = {
        "server": ("temperature", '{"input_ids": [1], "sampling_params": {"temperature": %s}}'),
        "proxy": ("reward", '{"session_id": "s", "reward": %s}'),
        "gateway": ("timeout_s", '{"command": "true", "timeout_s": %s}'),
    }[service.name]
    path = "/v1/feedback" if service.name == "proxy" else service.good_path
    response = httpx.post(
        f"{service.base_url}{path}",
        content=body % number,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert 400 <= response.status_code < 500, response.text
    assert field in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "body",
    [b"[" * 1000 + b"]" * 1000, b'{"a": ' + b"9" * 5000 + b"}", b"\xff\xfe"],
    ids=["deep", "digits", "binary"],
)
def test_json_the_parser_refuses_is_a_400_saying_why(service: Service, body: bytes) -> None:
    response = httpx.post(
        f"{service.base_url}{service.good_path}",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert 400 <= response.status_code < 500, response.text
    if service.name != "gateway":  # the gateway answers FastAPI's own words, as JSON
        assert "JSON" in response.json()["error"]["message"]


def test_good_requests_are_answered_alike_around_hostile_ones(service: Service) -> None:
    before = _good(service)
    httpx.post(f"{service.base_url}{service.good_path}", content=b"{" * 5000, timeout=60)
    httpx.post(f"{service.base_url}{service.good_path}", content=b'{"a": ' + b"9" * 5000 + b"}", timeout=60)
    assert _good(service) == before


def test_a_nan_feedback_is_refused_kept_on_the_dlq_and_the_next_ones_flow(proxy_service: Service) -> None:
    publisher = proxy_service.publisher
    assert publisher is not None
    url = f"{proxy_service.base_url}/v1/feedback"
    bad = httpx.post(url, content=b'{"session_id": "poison", "reward": NaN}', timeout=30)
    assert bad.status_code == 400 and "reward" in bad.json()["error"]["message"], bad.text
    for i in range(2):
        assert httpx.post(url, json={"session_id": f"good{i}", "reward": 1.0}, timeout=30).status_code == 202
    call = httpx.post(
        f"{proxy_service.base_url}{proxy_service.good_path}", json=proxy_service.good_body, timeout=60
    )
    assert call.status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(publisher.records(topics.FEEDBACK)) < 2:
        time.sleep(0.05)
    sessions = [f.session_id for f in publisher.records(topics.FEEDBACK)]  # type: ignore[attr-defined]
    assert {"good0", "good1"} <= set(sessions) and "poison" not in sessions
    letters = [d for d in publisher.records(topics.DLQ) if d.key == b"poison"]  # type: ignore[attr-defined]
    assert letters and "reward" in letters[0].reason and letters[0].source_topic == topics.FEEDBACK
    health = httpx.get(f"{proxy_service.base_url}/health", timeout=30).json()
    assert health["status"] == "ok", health


def test_a_command_longer_than_linux_takes_is_413_not_exit_126(gateway_service: Service) -> None:
    """Docker answered a 10 MB command with exit 126 and its own error in stdout."""
    url = f"{gateway_service.base_url}{gateway_service.good_path}"
    response = httpx.post(url, json={"command": "echo " + "a" * (200 << 10)}, timeout=60)
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["type"] == "RequestTooLarge" and "MAX_ARG_STRLEN" in error["message"]
    assert httpx.post(url, json={"command": "echo " + "a" * (100 << 10)}, timeout=60).status_code == 200


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"[" * 1000 + b"]" * 1000, "nests deeper"),
        (b'{"input_ids": [' + b"9" * 5000 + b"]}", "4300 digits"),
        (b'{"text": "\xff"}', "not UTF-8"),
    ],
)
def test_the_server_says_why_a_body_is_not_json(server_service: Service, body: bytes, reason: str) -> None:
    response = httpx.post(f"{server_service.base_url}/generate", content=body, timeout=60)
    assert response.status_code == 400 and reason in response.json()["error"]["message"], response.text


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/generate", {"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
            "tools",
        ),
    ],
)
def test_values_sglang_refuses_are_refused_naming_the_field(
    server_service: Service, path: str, body: dict[str, object], field: str
) -> None:
    response = httpx.post(f"{server_service.base_url}{path}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert field in message and "valid list" not in message, message


def test_the_proxy_refuses_a_prompt_past_the_context_before_sending_it_upstream(
    proxy_service: Service,
) -> None:
    url = f"{proxy_service.base_url}/v1/completions"
    too_long = httpx.post(url, json={"model": "m", "prompt": [1] * 100_000, "max_tokens": 1}, timeout=60)
    assert too_long.status_code == 400 and "more than the context length" in too_long.text, too_long.text
    text = httpx.post(url, json={"model": "m", "prompt": "word " * 150_000, "max_tokens": 1}, timeout=60)
    assert text.status_code == 400 and "(the context length)" in text.text, text.text
