"""Builders of logged calls and feedback for the on-call unit tests."""

from __future__ import annotations

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
