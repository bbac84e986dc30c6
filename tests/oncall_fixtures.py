"""Builders of logged calls and feedback for the on-call tests, and a consumer group's progress."""

from __future__ import annotations

import time
from typing import Any

from schemas.records import AgentInteraction, Feedback, logprobs, loss_mask, token_ids


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
