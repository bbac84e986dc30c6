"""Builders of logged calls and feedback for the on-call tests, and a consumer group's progress."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from stacx.schemas.records import AgentInteraction, Feedback, logprobs, loss_mask, token_ids


def call(
    session: str,
    iid: str,
    prompt: list[int],
    completion: list[int],
    *,
    at_ms: int = 1_000,
    version: int = 1,
    model: str = "policy",
) -> AgentInteraction:
    """One logged call: prompt + completion ids, logprob -0.5 per completion token."""
    return AgentInteraction(
        session_id=session,
        interaction_id=iid,
        agent_name="agent",
        model_name=model,
        policy_version=version,
        messages="[]",
        response="",
        token_ids=token_ids([*prompt, *completion]),
        loss_mask=loss_mask([0] * len(prompt) + [1] * len(completion)),
        logprobs=logprobs([0.0] * len(prompt) + [-0.5] * len(completion)),
        metadata={"prompt_length": str(len(prompt)), "temperature": "1"},
        created_at_ms=at_ms,
    )


def rating(
    session: str, reward: float, *, at_ms: int, interaction: str | None = None, source: str = "user"
) -> Feedback:
    return Feedback(
        session_id=session, reward=reward, interaction_id=interaction, source=source, created_at_ms=at_ms
    )


def wait_committed(bootstrap: str, group: str, topic: str, count: int, timeout_s: float = 120) -> None:
    """Until `group` has committed at least `count` offsets on `topic` (summed over partitions)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while _committed(admin, group, topic) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{group} read fewer than {count} events of {topic} in {timeout_s:.0f} s")
        time.sleep(0.2)


def committed(bootstrap: str, group: str, topic: str) -> int:
    """Offsets `group` has committed on `topic`, summed over its partitions (0 before any)."""
    from confluent_kafka.admin import AdminClient

    return _committed(AdminClient({"bootstrap.servers": bootstrap}), group, topic)


def _committed(admin: Any, group: str, topic: str) -> int:
    from confluent_kafka import ConsumerGroupTopicPartitions

    try:
        (future,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
        partitions = future.result(timeout=10).topic_partitions
    except Exception:  # the group does not exist yet
        return 0
    return sum(max(tp.offset, 0) for tp in partitions if tp.topic == topic)


def join_config(
    bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, app_ids: list[str], *, window_s: float
) -> tuple[Path, dict[str, str]]:
    """A join worker's config file on fresh topics (agent logs and feedback with 2 partitions, a
    DLQ, an output the worker creates); returns it with the app id and topic names. The app's
    topics and the output are deleted after the test (`app_ids`)."""
    names = {
        "app_id": f"test-join-{uuid.uuid4().hex[:8]}",
        "agent_logs_topic": fresh_topic("agent-logs", partitions=2),
        "feedback_topic": fresh_topic("feedback", partitions=2),
        "trajectories_topic": f"test.oncall-trajectories.{uuid.uuid4().hex[:10]}",
        "dlq_topic": fresh_topic("dlq", partitions=1),
    }
    app_ids.extend([names["app_id"], names["trajectories_topic"]])
    join = {**names, "partitions": 2, "datadir": str(tmp_path / "join"), "join": {"window_s": window_s}}
    config = tmp_path / "oncall.yaml"
    config.write_text(yaml.safe_dump({"bootstrap_servers": bootstrap, "join": join}))
    return config, names


def join_worker(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """`stacx oncall-join` on `config`, its output appended to `log`."""
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("stacx")), "oncall-join", str(config), "--loglevel", "warning"],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
