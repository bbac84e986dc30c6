"""Acceptance of issue 56: under a 2 GB memory limit (a memory cgroup of their own), the inference
server, the agent proxy and the sandbox gateway, each started by its `stacx` command, survive a
300 MB body (declared and chunked), NaN and Infinity in every numeric field, 1,000 half-open
connections and a 64 KB header, answering each with a clean 4xx, while 16 concurrent good requests
return identical results. The proxy then records the next calls and feedbacks to Kafka, and the
refused NaN feedback is on the DLQ."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from memory_cgroup import MemoryCgroup
from ports import free_port

from stacx.consumers import EventConsumer
from stacx.rollout.inference.api import SamplingParamsBody
from stacx.rollout.inference.openai_api import CompletionRequest
from stacx.rollout.proxy.app import FeedbackRequest
from stacx.sandbox.models import ExecRequest, SessionSpec

STACX = str(Path(sys.executable).with_name("stacx"))
MEMORY_LIMIT = 2 << 30
HUGE_BODY = 300 << 20
HALF_OPEN = 1000
GOOD_CONCURRENT = 16
READ_TIMEOUT_S = 5.0
"""The services' `limits.read_timeout_s` here (30 s by default), so half-open ones end soon."""


@dataclass(kw_only=True)
class Running:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    cgroup: MemoryCgroup
    good_path: str
    good_body: dict[str, Any]
    answer: Callable[[Any], Any]
    numeric: list[tuple[str, Callable[[float], dict[str, Any]]]]
    """(path, body with the given number in one numeric field) for every numeric field."""


@contextmanager
def _service(name: str, argv: list[str], health: str, port: int, log: Path) -> Iterator[tuple[str, Any, Any]]:
    cgroup = MemoryCgroup(MEMORY_LIMIT)
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=cgroup.enter)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, f"{name} exited {process.returncode}: {log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{url}{health}", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{name} did not answer {health}: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield url, process, cgroup
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        cgroup.remove()


def _numbers(model: Any) -> list[str]:
    """The numeric fields of a request model (its JSON schema: integer or number, maybe optional)."""
    found = []
    for name, prop in model.model_json_schema()["properties"].items():
        kinds = {prop.get("type")} | {branch.get("type") for branch in prop.get("anyOf", [])}
        if kinds & {"integer", "number"}:
            found.append(name)
    return found


def _post_raw(url: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    """POST `body` as JSON text, NaN and Infinity spelled as Python's json writes them."""
    headers = {"content-type": "application/json", **kw.pop("headers", {})}
    return httpx.post(url, content=json.dumps(body), headers=headers, timeout=120, **kw)


def _good(service: Running) -> Any:
    response = httpx.post(f"{service.url}{service.good_path}", json=service.good_body, timeout=300)
    assert response.status_code in (200, 201), f"{service.name}: {response.status_code} {response.text[:300]}"
    return service.answer(response.json())


def _huge_body(service: Running, *, declared: bool) -> None:
    def chunks() -> Iterator[bytes]:
        piece = b"7" * (1 << 20)
        for _ in range(HUGE_BODY >> 20):
            yield piece

    headers = {"content-type": "application/json"}
    if declared:
        headers["content-length"] = str(HUGE_BODY)
    try:
        response = httpx.post(
            f"{service.url}{service.good_path}", content=chunks(), headers=headers, timeout=300
        )
    except httpx.WriteError:  # the server answered and closed before taking everything: also fine
        return
    assert response.status_code == 413, f"{service.name}: {response.status_code} {response.text[:300]}"


def _long_header(service: Running) -> None:
    response = httpx.post(
        f"{service.url}{service.good_path}",
        json=service.good_body,
        headers={"x-stacx-session": "s" * (64 << 10)},
        timeout=120,
    )
    assert response.status_code == 431, f"{service.name}: {response.status_code} {response.text[:300]}"


def _non_finite_numbers(service: Running) -> int:
    refused = 0
    for path, body_with in service.numeric:
        for number in (math.nan, math.inf, -math.inf):
            response = _post_raw(f"{service.url}{path}", body_with(number))
            assert 400 <= response.status_code < 500, (
                f"{service.name} {path}: {response.status_code} {response.text}"
            )
            assert response.json(), "a JSON error body"
            refused += 1
    return refused


def _open_half(service: Running) -> list[socket.socket]:
    host, port = service.url.removeprefix("http://").split(":")
    sockets = []
    for _ in range(HALF_OPEN):
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(f"POST {service.good_path} HTTP/1.1\r\nHost: {host}\r\nContent-Le".encode())
        sockets.append(sock)
    return sockets


def _answers_of(sockets: list[socket.socket]) -> list[bytes]:
    answers = []
    for sock in sockets:
        try:
            answers.append(sock.recv(64))
        except OSError as exc:
            answers.append(repr(exc).encode())
        finally:
            sock.close()
    return answers


def _assault(service: Running) -> dict[str, Any]:
    """Every hostile input while 16 good requests run at once; the figures of the run."""
    baseline = _good(service)
    half_open = _open_half(service)
    with ThreadPoolExecutor(GOOD_CONCURRENT + 4) as pool:
        goods = [pool.submit(_good, service) for _ in range(GOOD_CONCURRENT)]
        attacks = [
            pool.submit(_huge_body, service, declared=True),
            pool.submit(_huge_body, service, declared=False),
            pool.submit(_long_header, service),
            pool.submit(_non_finite_numbers, service),
        ]
        results = [g.result(timeout=600) for g in goods]
        for attack in attacks:
            attack.result(timeout=600)
    assert results == [baseline] * GOOD_CONCURRENT, f"{service.name}: answers differ: {results}"
    time.sleep(READ_TIMEOUT_S + 2)
    answers = _answers_of(half_open)
    timed_out = sum(a.startswith(b"HTTP/1.1 408") for a in answers)
    assert timed_out == HALF_OPEN, (
        f"{service.name}: {HALF_OPEN - timed_out} half-open not answered 408: {answers[:3]}"
    )
    assert _good(service) == baseline
    assert service.process.poll() is None, f"{service.name} died"
    assert service.cgroup.oom_kills() == 0, f"{service.name}: the OOM killer ran in its cgroup"
    figures = {
        "service": service.name,
        "peak_mb": service.cgroup.peak_bytes() >> 20,
        "half_open_408": timed_out,
    }
    print(json.dumps(figures))
    return figures


def _write(path: Path, tree: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(tree))
    return path


@contextmanager
def _server(model_dir: Path, tmp_path: Path) -> Iterator[Running]:
    port = free_port()
    server = {
        "model_path": str(model_dir),
        "port": port,
        "torch_threads": 1,
        "limits": {"read_timeout_s": READ_TIMEOUT_S},
    }
    config = _write(tmp_path / "serve.yaml", {"inference": {"server": server}})
    argv = [STACX, "serve", "--config", str(config)]
    with _service("server", argv, "/health", port, tmp_path / "server.log") as (url, process, cgroup):
        numeric = [
            ("/generate", lambda x, f=f: {"input_ids": [1, 2, 3], "sampling_params": {f: x}})
            for f in _numbers(SamplingParamsBody)
        ] + [
            ("/generate", lambda x: {"input_ids": [1, x]}),
            ("/generate", lambda x: {"text": "a", "logprob_start_len": x}),
        ]
        yield Running(
            name="server",
            url=url,
            process=process,
            cgroup=cgroup,
            good_path="/generate",
            good_body={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
            answer=lambda body: body["output_ids"],
            numeric=numeric,
        )


def test_the_inference_server_survives_hostile_inputs_under_2gb(tiny_model_dir: Path, tmp_path: Path) -> None:
    with _server(tiny_model_dir, tmp_path) as server:
        _assault(server)


def test_the_agent_proxy_survives_hostile_inputs_under_2gb_and_keeps_recording(
    tiny_model_dir: Path, tmp_path: Path, kafka_bootstrap: str, fresh_topic: Callable[..., str]
) -> None:
    logs, feedback, dlq = fresh_topic("agent-logs"), fresh_topic("feedback"), fresh_topic("dlq")
    with _server(tiny_model_dir, tmp_path) as server:
        port = free_port()
        proxy = {
            "port": port,
            "bootstrap_servers": kafka_bootstrap,
            "proxy": {
                "upstreams": [server.url],
                "agent_logs_topic": logs,
                "feedback_topic": feedback,
                "recorder": {"dlq_topic": dlq},
                "limits": {"read_timeout_s": READ_TIMEOUT_S},
            },
        }
        config = _write(tmp_path / "proxy.yaml", {"proxy": proxy})
        argv = [STACX, "proxy", "--config", str(config)]
        with _service("proxy", argv, "/health", port, tmp_path / "proxy.log") as (url, process, cgroup):
            numeric = (
                [
                    (
                        "/v1/completions",
                        lambda x, f=f: {"model": "m", "prompt": [1, 2], "max_tokens": 2, f: x},
                    )
                    for f in _numbers(CompletionRequest)
                ]
                + [
                    ("/v1/feedback", lambda x, f=f: {"session_id": "s", "reward": 1.0, f: x})
                    for f in _numbers(FeedbackRequest)
                ]
                + [("/v1/feedback", lambda x: {"session_id": "s", "reward": 1.0, "components": {"c": x}})]
            )
            running = Running(
                name="proxy",
                url=url,
                process=process,
                cgroup=cgroup,
                good_path="/v1/completions",
                good_body={"model": "m", "prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0},
                answer=lambda body: body["choices"][0]["text"],
                numeric=numeric,
            )
            _assault(running)
            _poison_then_good_feedback(running, kafka_bootstrap, logs, feedback, dlq)


def _poison_then_good_feedback(proxy: Running, bootstrap: str, logs: str, feedback: str, dlq: str) -> None:
    poison = f"poison-{uuid.uuid4().hex[:6]}"
    bad = _post_raw(f"{proxy.url}/v1/feedback", {"session_id": poison, "reward": math.nan})
    assert bad.status_code == 400 and "reward" in bad.json()["error"]["message"], bad.text
    for i in range(2):
        ok = httpx.post(
            f"{proxy.url}/v1/feedback", json={"session_id": f"good{i}", "reward": 1.0}, timeout=30
        )
        assert ok.status_code == 202 and ok.json() == {"accepted": True}
    _good(proxy)
    rewards = _read(bootstrap, feedback, 2)
    assert {"good0", "good1"} <= {r.session_id for r in rewards}
    assert _read(bootstrap, logs, 1), "no call reached the agent-logs topic"
    letters = _read(bootstrap, dlq, 1)
    assert any(d.key == poison.encode() and "reward" in d.reason for d in letters), letters
    health = httpx.get(f"{proxy.url}/health", timeout=30).json()
    assert health["status"] == "ok", health


def _read(bootstrap: str, topic: str, count: int, timeout_s: float = 120) -> list[Any]:
    consumer = EventConsumer(
        EventConsumer.Config(
            bootstrap_servers=bootstrap, topics=[topic], group_id=f"read-{uuid.uuid4().hex[:8]}"
        )
    )
    events: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(events) < count and time.monotonic() < deadline:
            events += [event.value for event in consumer.consume(100, 1.0)]
    finally:
        consumer.close()
    return events


def test_the_sandbox_gateway_survives_hostile_inputs_under_2gb(tmp_path: Path) -> None:
    port = free_port()
    owner = f"stacx-test-{uuid.uuid4().hex[:8]}"
    gateway = {
        "port": port,
        "backend": "docker",
        "auth": False,
        "read_timeout_s": READ_TIMEOUT_S,
        "sessions": {"owner": owner},
    }
    config = _write(tmp_path / "gateway.yaml", {"gateway": gateway})
    argv = [STACX, "gateway", "--config", str(config)]
    with _service("gateway", argv, "/healthz", port, tmp_path / "gateway.log") as (url, process, cgroup):
        created = httpx.post(f"{url}/v1/sessions", json={"image": "stacx/sandbox:bookworm"}, timeout=300)
        assert created.status_code == 201, created.text
        session = created.json()["id"]
        exec_path = f"/v1/sessions/{session}/exec"
        numeric = [(exec_path, lambda x, f=f: {"command": "true", f: x}) for f in _numbers(ExecRequest)] + [
            ("/v1/sessions", lambda x, f=f: {"image": "stacx/sandbox:bookworm", f: x})
            for f in _numbers(SessionSpec)
        ]
        running = Running(
            name="gateway",
            url=url,
            process=process,
            cgroup=cgroup,
            good_path=exec_path,
            good_body={"command": "echo hi; expr 6 \\* 7", "timeout_s": 60},
            answer=lambda body: (body["exit_code"], body["stdout"]),
            numeric=numeric,
        )
        try:
            _assault(running)
        finally:
            httpx.delete(f"{url}/v1/sessions/{session}", timeout=120)


def test_stacx_proxy_names_a_missing_topic_in_one_line_instead_of_starting(kafka_bootstrap: str) -> None:
    missing = f"test.no-such-topic.{uuid.uuid4().hex[:8]}"
    argv = [
        STACX,
        "proxy",
        "--upstream",
        "http://127.0.0.1:9",
        "--feedback-topic",
        missing,
        "--bootstrap-servers",
        kafka_bootstrap,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and missing in lines[0], done.stderr
