"""The prefix rule of both joins (black-box captured calls, logged on-call calls): a call extends
the sequence only when its prompt repeats every token of it; one changed token anywhere breaks."""

from __future__ import annotations

import pytest
from oncall_fixtures import call

from stacx.consumers.oncall.trajectories import TrajectoryBuilder
from stacx.rollout.blackbox.join import join_calls
from stacx.schemas.records import AgentInteraction

FIRST_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
FIRST_COMPLETION = [9, 10]
CONTEXT = FIRST_PROMPT + FIRST_COMPLETION


def _changed_at(position: int) -> list[int]:
    prompt = [*CONTEXT, 20, 21]
    prompt[position] = 99
    return prompt


def _calls(second_prompt: list[int]) -> list[AgentInteraction]:
    return [
        call("s", "c1", FIRST_PROMPT, FIRST_COMPLETION, at_ms=1),
        call("s", "c2", second_prompt, [30], at_ms=2),
    ]


@pytest.mark.parametrize("position", [0, 4, len(CONTEXT) - 3, len(CONTEXT) - 1])
def test_blackbox_join_restarts_when_any_token_of_the_prefix_differs(position: int) -> None:
    joined = join_calls(_calls(_changed_at(position)))
    ids, mask, _ = joined.buffer.arrays()
    assert ids.tolist() == [*_changed_at(position), 30]
    assert joined.num_calls == 1 and joined.num_dropped_calls == 1
    assert joined.prompt_length == len(CONTEXT) + 2


def test_blackbox_join_extends_when_the_whole_prefix_matches() -> None:
    joined = join_calls(_calls([*CONTEXT, 20, 21]))
    ids, mask, _ = joined.buffer.arrays()
    assert ids.tolist() == [*CONTEXT, 20, 21, 30]
    assert mask.tolist() == [0] * 8 + [1, 1, 0, 0, 1]
    assert joined.num_calls == 2 and joined.num_dropped_calls == 0 and joined.prompt_length == 8


@pytest.mark.parametrize("position", [0, 4, len(CONTEXT) - 3, len(CONTEXT) - 1])
def test_oncall_merge_breaks_when_any_token_of_the_prefix_differs(position: int) -> None:
    builder = TrajectoryBuilder()
    first, second = _calls(_changed_at(position))
    current, _ = builder.add(None, first)
    assert builder.break_reason(current, second, _changed_at(position), [30]) is not None
    fresh, closed = builder.add(current, second)
    assert closed is current and fresh is not current
    assert fresh.token_ids == [*_changed_at(position), 30]


def test_oncall_merge_names_why_a_call_breaks() -> None:
    builder = TrajectoryBuilder(max_tokens=14)
    first, _ = _calls(CONTEXT)
    current, _ = builder.add(None, first)
    assert builder.break_reason(current, first, [*CONTEXT, 20], [30]) is None
    assert builder.break_reason(current, first, [*CONTEXT, 20, 21, 22], [30]) is None  # 14 tokens
    assert builder.break_reason(current, first, [*CONTEXT, 20, 21, 22], [30, 31]) == "max_length"
    # the prompt of the first call intact, its completion re-rendered: the response changed
    assert builder.break_reason(current, first, [*FIRST_PROMPT, 9, 11], [30]) == "response_rerendered"
    assert builder.break_reason(current, first, [1, 2, 3, 99, 5, 6, 7, 8, 9, 10], [30]) == "history_changed"
    other = call("s", "c3", [*CONTEXT, 20], [30], model="other")
    assert builder.break_reason(current, other, [*CONTEXT, 20], [30]) == "model_changed"
    assert builder.break_reason(None, first, CONTEXT, [30]) == "session_start"
