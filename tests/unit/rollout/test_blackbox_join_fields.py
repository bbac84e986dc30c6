"""The black-box prefix join, field by field: where a call's prompt ends, what each turn holds,
the restart counts, and the trajectory metadata of an episode."""

from __future__ import annotations

from stacx.rollout.blackbox.join import external_metadata, join_calls
from stacx.schemas.records import AgentInteraction, logprobs, loss_mask, token_ids


def _call(
    prompt: list[int], completion: list[int], n: int = 0, *, mask: list[int] | None = None, **metadata: str
) -> AgentInteraction:
    return AgentInteraction(
        session_id="s",
        interaction_id=f"i{n}",
        agent_name="a",
        model_name="m",
        policy_version=3 + n,
        messages="[]",
        response=f"r{n}",
        token_ids=token_ids(prompt + completion),
        loss_mask=loss_mask(mask if mask is not None else [0] * len(prompt) + [1] * len(completion)),
        logprobs=logprobs([0.0] * len(prompt) + [-1.0 - i for i in range(len(completion))]),
        metadata=metadata,
        created_at_ms=1000 + n,
    )


def test_the_recorded_prompt_length_wins_over_the_loss_mask() -> None:
    # the server forced the first completion token (mask 0) but it is part of the completion
    call = _call([1, 2], [3, 4], mask=[0, 0, 0, 1], prompt_length="2", finish_reason="stop")
    joined = join_calls([call])
    ids, mask, lps = joined.buffer.arrays()
    assert mask.tolist() == [0, 0, 1, 1] and lps.tolist() == [0.0, 0.0, -1.0, -2.0]
    assert joined.prompt_length == 2


def test_without_a_recorded_prompt_length_the_prompt_ends_at_the_first_generated_token() -> None:
    joined = join_calls([_call([1, 2, 5], [3, 4])])
    _, mask, _ = joined.buffer.arrays()
    assert mask.tolist() == [0, 0, 0, 1, 1] and joined.prompt_length == 3
    assert joined.finish_reasons == [""]


def test_turns_hold_their_tokens_texts_versions_and_start_times() -> None:
    calls = [_call([1, 2], [3], 0, prompt_length="2", finish_reason="tool_calls"),
             _call([1, 2, 3, 7], [8, 9], 1, prompt_length="4", finish_reason="stop")]  # fmt: skip
    joined = join_calls(calls)
    assert [(t.role, t.text, t.token_ids.tolist()) for t in joined.turns] == [
        ("user", "", [1, 2]),  # no decoder: context turns have no text
        ("assistant", "r0", [3]),
        ("tool", "", [7]),
        ("assistant", "r1", [8, 9]),
    ]
    assistant = [t for t in joined.turns if t.role == "assistant"]
    assert [(t.policy_version, t.started_at_ms) for t in assistant] == [(3, 1000), (4, 1001)]
    assert joined.finish_reasons == ["tool_calls", "stop"]


def test_every_restart_adds_the_calls_it_left_out() -> None:
    calls = [_call([1], [2], 0), _call([5], [6], 1), _call([1, 3], [4], 2), _call([1, 3, 4, 9], [1], 3)]
    joined = join_calls(calls)
    assert joined.num_dropped_calls == 2 and joined.num_calls == 2
    assert joined.finish_reasons == ["", ""]


def test_episode_metadata_keeps_the_drivers_scalars_and_the_join_counts() -> None:
    joined = join_calls([_call([1], [2], 0), _call([5], [6], 1), _call([5, 6], [7], 2)])
    meta = external_metadata({"status": "x" * 300, "turns": 4, "cost": 0.5, "trace": {"a": 1}}, joined)
    assert meta == {
        "scaffold_status": "x" * 200,
        "scaffold_turns": "4",
        "scaffold_cost": "0.5",
        "num_model_calls": "3",
        "num_dropped_calls": "1",
    }
