"""`WeightSubscriber` with a fake event source and a scripted SGLang-like server."""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from stacx.consumers.weights import WeightSubscriber
from stacx.schemas.records import WeightVersion


@dataclass
class _Event:
    value: Any


class FakeSource:
    """Hands out scripted events; reports lag 0 once they are all consumed."""

    def __init__(self, records: list[Any]) -> None:
        self.pending = deque(_Event(r) for r in records)
        self.closed = False
        self.commits: list[Any] = []

    def poll(self, timeout: float = 1.0) -> _Event | None:
        return self.pending.popleft() if self.pending else None

    def total_lag(self, timeout: float = 10.0) -> int:
        return len(self.pending)

    def assignment(self) -> list[tuple[str, int]]:
        return [("stacx.weights", 0)]

    def commit(self, events: Any = None) -> None:
        self.commits.append(events)

    def close(self) -> None:
        self.closed = True


class FakeServer:
    """SGLang's two endpoints; refuses paths containing 'broken'; 503 for the first `busy` calls."""

    def __init__(self, busy: int = 0) -> None:
        self.version = "default"
        self.loaded: list[str] = []
        self.busy = busy

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.busy:
            self.busy -= 1
            return httpx.Response(503, json={"error": {"message": "busy"}})
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json={"weight_version": self.version})
        body = json.loads(request.content)
        if "broken" in body["model_path"]:
            return httpx.Response(400, json={"success": False, "message": "no safetensors"})
        self.loaded.append(body["model_path"])
        self.version = body["weight_version"]
        return httpx.Response(200, json={"success": True, "message": "ok"})


def _version(v: int, model: str = "policy", path: str | None = None) -> WeightVersion:
    return WeightVersion(model_name=model, version=v, path=path or f"/ckpt/{model}/{v}")


def _subscriber(records: list[Any], server: FakeServer) -> WeightSubscriber:
    config = WeightSubscriber.Config(
        model_name="policy", server_url="http://server", backoff_s=0.001, catch_up_timeout_s=5
    )
    return WeightSubscriber(config, source=FakeSource(records), transport=httpx.MockTransport(server))


def test_catch_up_applies_only_the_latest_of_its_model() -> None:
    server = FakeServer()
    history = [_version(1), _version(3), _version(2), _version(9, model="critic")]
    with _subscriber(history, server) as subscriber:
        applied = subscriber.catch_up()
    assert applied is not None and applied.version == 3
    assert server.loaded == ["/ckpt/policy/3"] and server.version == "3"


def test_follow_ignores_older_and_other_models_and_applies_newer() -> None:
    server = FakeServer()
    subscriber = _subscriber([_version(2)], server)
    subscriber.catch_up()
    assert not subscriber.handle(_version(1))
    assert not subscriber.handle(_version(2))
    assert not subscriber.handle(_version(5, model="reference"))
    assert subscriber.handle(_version(4))
    assert server.loaded == ["/ckpt/policy/2", "/ckpt/policy/4"]
    assert subscriber.num_ignored == 3


def test_refused_version_is_skipped_and_later_ones_still_apply() -> None:
    server = FakeServer(busy=2)  # the first calls meet a server that is still starting
    records = [_version(1), _version(2, path="/ckpt/broken"), _version(3)]
    subscriber = _subscriber(records[:1], server)
    stop = threading.Event()
    source = subscriber._source
    assert isinstance(source, FakeSource)
    original_poll = source.poll

    def poll_then_feed(timeout: float = 1.0) -> _Event | None:
        event = original_poll(timeout)
        if event is None and subscriber.applied is not None:
            if records[1:]:
                source.pending.append(_Event(records.pop(1)))
            else:
                stop.set()
        return event

    source.poll = poll_then_feed  # type: ignore[method-assign]
    subscriber.run(stop, poll_timeout_s=0.01)
    assert server.loaded == ["/ckpt/policy/1", "/ckpt/policy/3"]
    assert subscriber.applied is not None and subscriber.applied.version == 3


def test_already_serving_the_latest_means_no_reload() -> None:
    server = FakeServer()
    server.version = "7"
    with _subscriber([_version(7)], server) as subscriber:
        subscriber.catch_up()
    assert server.loaded == [] and subscriber.applied is not None


def _hashed(v: int, content: str) -> WeightVersion:
    return WeightVersion(model_name="policy", version=v, path=f"/ckpt/{content}/{v}",
                         content_hash=f"sha256:{content}")


def test_a_version_with_another_content_hash_is_refused_loudly(caplog: Any) -> None:
    """Break 1: a trainer restarted from scratch re-announced v1..v7 with other weights; the
    servers silently kept the abandoned v7. Now the conflict is refused with an error line."""
    import pytest

    from stacx.consumers.weights import WeightConflictError

    server = FakeServer()
    subscriber = _subscriber([_hashed(1, "a"), _hashed(2, "a"), _hashed(1, "b")], server)
    with caplog.at_level("ERROR"):
        applied = subscriber.catch_up()
    assert applied is not None and applied.content_hash == "sha256:a" and applied.version == 2
    assert subscriber.num_conflicts == 1 and "refusing policy v1" in caplog.text
    assert subscriber.handle(_hashed(2, "a")) is False  # the same contents again: ignored quietly
    with pytest.raises(WeightConflictError, match="v2 was announced before"):
        subscriber.handle(_hashed(2, "b"))
    assert subscriber.handle(_hashed(3, "b"))
    assert server.loaded == ["/ckpt/a/2", "/ckpt/b/3"] and subscriber.num_conflicts == 2


def test_a_consumer_that_lost_its_partitions_is_replaced_and_catches_up() -> None:
    """After a broker restart the server's subscriber lost its group session for good and the
    server stayed on an old version; now it reconnects and catches up."""
    server = FakeServer()
    config = WeightSubscriber.Config(model_name="policy", server_url="http://server",
                                     backoff_s=0.001, catch_up_timeout_s=5, rejoin_after_s=0)

    class Orphaned(FakeSource):
        def assignment(self) -> list[tuple[str, int]]:
            return []

    stop = threading.Event()
    fresh = FakeSource([_version(3)])

    class Subscriber(WeightSubscriber):
        def _default_source(self) -> Any:
            if not hasattr(self, "_source"):
                return Orphaned([_version(1)])
            stop.set()
            return fresh

    subscriber = Subscriber(config, transport=httpx.MockTransport(server))
    subscriber.run(stop, poll_timeout_s=0.01)
    assert server.loaded == ["/ckpt/policy/1", "/ckpt/policy/3"] and subscriber._source is fresh


def test_catch_up_commits_what_it_read_and_the_group_is_named_after_the_server() -> None:
    from stacx.consumers.weights import subscriber_group

    subscriber = _subscriber([_version(1), _version(2)], FakeServer())
    subscriber.catch_up()
    source = subscriber._source
    assert isinstance(source, FakeSource) and source.commits == [None]  # everything read
    group = subscriber_group("policy", "http://127.0.0.1:30000")
    assert group.startswith("stacx-weights-policy-") and group.endswith("-30000")


def test_servers_on_the_same_port_of_hosts_with_one_host_name_get_a_group_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Network namespaces (and cloned containers) report one host name for every host: servers on
    the same port must still not share a group, or one of them stops seeing versions."""
    import socket

    from stacx.consumers.weights import subscriber_group

    monkeypatch.setattr(socket, "gethostname", lambda: "same")
    topic = "stacx.weights.run-1"
    groups = {subscriber_group("policy", f"http://10.231.0.{i}:30010", topic) for i in (5, 6)}
    assert groups == {f"stacx-weights-run-1-policy-10.231.0.{i}-30010" for i in (5, 6)}
    for local in ("127.0.0.1", "localhost", "0.0.0.0", "[::1]"):  # names no machine: the host name
        group = subscriber_group("policy", f"http://{local}:30010", topic)
        assert group == "stacx-weights-run-1-policy-same-30010", local


def test_the_update_request_has_sglangs_fields_and_the_version_as_a_string() -> None:
    bodies: list[dict[str, Any]] = []
    server = FakeServer()

    def recording(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/update_weights_from_disk":
            bodies.append(json.loads(request.content))
        return server(request)

    config = WeightSubscriber.Config(model_name="policy", server_url="http://server", backoff_s=0.001)
    subscriber = WeightSubscriber(config, source=FakeSource([]), transport=httpx.MockTransport(recording))
    subscriber.apply(_version(4))
    # SGLang's UpdateWeightFromDiskReqInput: model_path, weight_version (a string), abort_all_requests
    assert bodies == [{"model_path": "/ckpt/policy/4", "weight_version": "4", "abort_all_requests": False}]
    assert subscriber.server_version() == "4"
