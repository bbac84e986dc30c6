"""The router's policy (prefix affinity, load balance, failover) and its HTTP front on fake servers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from stacx.rollout.inference import ServerUnavailableError
from stacx.rollout.inference.router import PrefixRouter, RouterConfig
from stacx.rollout.inference.router_app import build_router_app, prefix_ids

A, B = "http://a:1", "http://b:2"


def _router(**kw: Any) -> PrefixRouter:
    return PrefixRouter(RouterConfig(upstreams=[A, B], block_tokens=4, **kw))


def _prompt(task: int, n: int = 32) -> list[int]:
    return [1000 * task + i for i in range(n)]


def test_all_samples_of_a_group_go_to_one_server_and_groups_spread() -> None:
    router = _router()
    chosen: dict[int, set[str]] = {}
    for task in range(4):
        for _ in range(4):  # a group of 4 samples, sent together (none finishes in between)
            url = router.choose(_prompt(task), now=float(task))
            router.started(url)
            chosen.setdefault(task, set()).add(url)
    assert all(len(urls) == 1 for urls in chosen.values())
    assert {next(iter(u)) for u in chosen.values()} == {A, B}


def test_a_later_turn_follows_its_own_longer_prefix() -> None:
    router = _router(balance_abs_threshold=8)
    first = router.choose(_prompt(1), now=0.0)
    router.started(first)
    router.started(first)  # the other server is now the less busy one
    turn2 = _prompt(1) + [7, 7, 7, 7, 8, 8, 8, 8]
    assert router.choose(turn2, now=1.0) == first


def test_a_prefix_below_the_threshold_goes_by_load() -> None:
    router = _router(cache_threshold=0.9, balance_abs_threshold=8)
    shared = _prompt(0, 16)
    first = router.choose(shared + _prompt(1, 16), now=0.0)
    router.started(first)
    # only the shared half matches (0.5 < 0.9): the less busy server gets it
    assert router.choose(shared + _prompt(2, 16), now=1.0) != first


def test_load_wins_over_a_shared_template_but_not_over_a_whole_prompt() -> None:
    router = _router(balance_abs_threshold=2, balance_rel_threshold=1.5)
    template = _prompt(0, 24)
    first = router.choose(template + _prompt(1, 8), now=0.0)
    for _ in range(3):
        router.started(first)
    assert router.choose(template + _prompt(2, 8), now=1.0) != first  # a new group: by load
    assert router.choose(template + _prompt(1, 8), now=2.0) == first  # its group: where it is


def test_a_down_server_gets_nothing_and_forgets_its_prefixes() -> None:
    router = _router()
    first = router.choose(_prompt(1), now=0.0)
    assert router.tree_blocks(first) == 8
    router.mark_down(first)
    assert router.tree_blocks(first) == 0
    other = router.choose(_prompt(1), now=1.0)
    assert other != first
    router.mark_up(first)
    router.started(other)
    assert router.choose(_prompt(1), now=2.0) == other  # the prefix now lives on the other one
    router.mark_down(A)
    router.mark_down(B)
    with pytest.raises(ServerUnavailableError, match="no inference server is up"):
        router.choose(_prompt(1), now=3.0)


def test_the_tree_stays_within_its_bound() -> None:
    router = PrefixRouter(RouterConfig(upstreams=[A, B], block_tokens=4, max_tree_blocks=20))
    for task in range(30):
        router.choose(_prompt(task, 8), now=float(task))
    assert router.tree_blocks(A) + router.tree_blocks(B) <= 20
    assert router.choose(_prompt(29, 8), now=99.0) in (A, B)


def test_bad_router_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="cache_threshold"):
        RouterConfig(cache_threshold=2.0)
    with pytest.raises(ValueError, match="twice"):
        RouterConfig(upstreams=[A, A])


def test_prefix_ids_reads_ids_text_and_messages() -> None:
    assert prefix_ids("/generate", {"input_ids": [[5, 6], [7]]}) == [5, 6]
    assert prefix_ids("/generate", {"text": "ab"}) == [97, 98]
    assert prefix_ids("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert prefix_ids("/generate", {}) is None


class FakeServers:
    """Two SGLang-like servers; `dead` ones refuse connections, `versions` are theirs."""

    def __init__(self) -> None:
        self.dead: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.versions = {A: "3", B: "2"}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if base in self.dead:
            raise httpx.ConnectError("connection refused", request=request)
        self.calls.append((base, request.url.path))
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json={"model_path": "/m", "weight_version": self.versions[base]})
        if request.url.path == "/update_weights_from_disk":
            body = json.loads(request.content)
            self.versions[base] = body["weight_version"]
            return httpx.Response(200, json={"success": True, "message": "ok", "num_paused_requests": 0})
        return httpx.Response(200, json={"text": "x", "output_ids": [1], "server": base,
                                         "meta_info": {"weight_version": self.versions[base]}})


def _client(fake: FakeServers) -> TestClient:
    config = RouterConfig(upstreams=[A, B], block_tokens=4, probe_interval_s=3600)
    return TestClient(build_router_app(config, transport=httpx.MockTransport(fake)))


def test_http_routes_a_group_to_one_server_and_fails_over_when_it_dies() -> None:
    fake = FakeServers()
    with _client(fake) as client:
        body = {"input_ids": _prompt(1), "sampling_params": {"max_new_tokens": 1}}
        first = client.post("/generate", json=body).json()["server"]
        assert client.post("/generate", json=body).json()["server"] == first
        fake.dead.add(first)
        answer = client.post("/generate", json=body)
        assert answer.status_code == 200 and answer.json()["server"] != first
        workers = client.get("/workers").json()
        assert workers["failovers"] == 1
        assert [s["up"] for s in workers["servers"] if s["url"] == first] == [False]
        fake.dead.add(answer.json()["server"])
        assert client.post("/generate", json=body).status_code == 503
        assert client.get("/health").status_code == 503


def test_http_model_info_reports_the_lowest_version_and_updates_reach_every_server() -> None:
    fake = FakeServers()
    with _client(fake) as client:
        info = client.get("/get_model_info").json()
        assert info["weight_version"] == "2" and info["servers"] == {A: "3", B: "2"}
        answer = client.post("/update_weights_from_disk", json={"model_path": "/w/v4", "weight_version": "4"})
        assert answer.status_code == 200 and answer.json()["success"] is True
        assert fake.versions == {A: "4", B: "4"}
        assert client.get("/get_model_info").json()["weight_version"] == "4"
