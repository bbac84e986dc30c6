"""On-call path with OpenHands: a deployed OpenHands agent (openhands-sdk, its own venv, its own
tools on its own workspace) whose LLM is the agent proxy feeds `stacx.agent-logs` on real Kafka.

The tiny model is constrained (SGLang `regex`, LiteLLM extra body) to one terminal call that writes
a note, so the agent really acts; every call is on the topic with its session, and the second
call's prompt is the first's prompt + sampled ids + what the agent appended (exact continuation),
so the on-call join sees one unbroken sequence.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stacx.consumers import EventConsumer
from stacx.rollout.inference import InferenceServer
from stacx.rollout.proxy import AgentProxy, ProxyServer
from stacx.schemas.records import AgentInteraction

CALL = "<function=terminal>\n<parameter=command>echo on-call > note.txt</parameter>\n</function>"
AGENT = Path(__file__).resolve().parent / "agents" / "openhands_deployed.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceServer]:
    from stacx.rollout.models import make_tiny_model

    # OpenHands' text-call prompt is ~33k tokens of the tiny tokenizer.
    model = make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", max_position_embeddings=65536)
    srv = InferenceServer(
        InferenceServer.Config(model_path=str(model), port=0, served_model_name="tiny", torch_threads=1)
    )
    srv.start(timeout_s=120)
    yield srv
    srv.stop()


def _read(bootstrap: str, topic: str, group: str, count: int, timeout_s: float = 60) -> list[Any]:
    consumer = EventConsumer(
        EventConsumer.Config(bootstrap_servers=bootstrap, group_id=group, topics=[topic])
    )
    events: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(events) < count and time.monotonic() < deadline:
            events += consumer.consume(100, 1.0)
    finally:
        consumer.close()
    return events


def test_a_deployed_openhands_agent_feeds_agent_logs_token_exact(
    kafka_bootstrap: str,
    fresh_topic: Callable[..., str],
    fresh_group: str,
    server: InferenceServer,
    tmp_path: Path,
) -> None:
    from stacx.rollout.blackbox.adapter import build_external
    from stacx.rollout.blackbox.venvs import ensure_python

    python = ensure_python(build_external("openhands", {}))
    logs = fresh_topic("agent-logs", partitions=2)
    config = ProxyServer.Config(
        proxy=AgentProxy.Config(upstreams=[server.base_url], agent_logs_topic=logs, exact_continuation=True),
        port=0,
        bootstrap_servers=kafka_bootstrap,
    )
    workspace = tmp_path / "deployed"
    workspace.mkdir()
    with ProxyServer(config) as proxy:
        done = subprocess.run(
            [
                python,
                str(AGENT),
                f"{proxy.base_url}/s/oh-session-1/v1",
                "tiny",
                str(workspace),
                re.escape(CALL),
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "OPENHANDS_SUPPRESS_BANNER": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert proxy.recorder.flush(30)
    assert (workspace / "note.txt").read_text() == "on-call\n"  # the agent acted on its own workspace
    read = _read(kafka_bootstrap, logs, fresh_group, 2)
    assert all(e.key == "oh-session-1" for e in read)  # keyed by session
    events = [e.value for e in read if isinstance(e.value, AgentInteraction)]
    assert len(events) == 2 and {e.session_id for e in events} == {"oh-session-1"}
    first, second = sorted(events, key=lambda e: e.created_at_ms)
    for event in (first, second):
        num_prompt = int(event.metadata["prompt_length"])
        assert event.response == CALL
        assert list(event.loss_mask[:num_prompt]) == [0] * num_prompt and all(event.loss_mask[num_prompt:])
    extended = [int(t) for t in first.token_ids]
    assert [int(t) for t in second.token_ids[: len(extended)]] == extended  # one unbroken sequence
    assert "EXECUTION RESULT of [terminal]" in second.messages
