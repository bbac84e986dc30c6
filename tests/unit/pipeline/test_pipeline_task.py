"""The quickstart task plugin: problems, reward, demonstrations aligned with the ReTool scaffold."""

from __future__ import annotations

import random

import pytest

from infra.pipeline.tasks import load_task_module, task_rows

task = load_task_module()


def test_problems_are_reproducible_distinct_and_respect_exclusions() -> None:
    a = task.make_problems(50, seed=3)
    assert a == task.make_problems(50, seed=3)
    assert len({p.expression for p in a}) == 50
    b = task.make_problems(50, seed=3, exclude=frozenset(p.expression for p in a[:10]))
    assert not {p.expression for p in a[:10]} & {p.expression for p in b}
    for p in a:
        assert eval(p.expression) == p.answer  # noqa: S307 - our own generated expressions


@pytest.mark.parametrize(("completion", "expected"), [
    ("<answer>1795</answer>", 1.0),
    ("<tool_call>print(1)</tool_call>\n<tool_response>\n1\n\n</tool_response>\n"
     "<answer> 1795 </answer>", 1.0),
    ("<answer>1794</answer>", 0.0),
    ("<answer>17", 0.0),
    ("", 0.0),
    ("<answer>x</answer><answer>1795</answer>", 1.0),
])
def test_reward_scores_the_last_answer_and_never_raises(completion: str, expected: float) -> None:
    assert task.reward(completion, 1795) == expected


def test_reward_of_a_malformed_expected_answer_is_zero() -> None:
    assert task.reward("<answer>1</answer>", "not a number") == 0.0


def test_tool_demonstrations_match_the_retool_scaffold_observation() -> None:
    from rollout.protocols import Action, ExecResult
    from rollout.scaffolds import ToolCallingScaffold

    problem = task.Problem(expression="37*48+19", answer=1795)
    rng = random.Random(0)
    config = task.DemonstrationConfig(tool_fraction=1.0)
    call, observation, answer = task.demonstration(problem, rng, config, end="<|im_end|>")
    scaffold = ToolCallingScaffold(system_prompt="")
    action = scaffold.parse(call, finish_reason="stop")
    assert action.kind == "exec" and action.stdin == "print(37*48+19)\n"
    result = ExecResult(exit_code=0, stdout="1795\n", stderr="", duration_ms=1)
    assert scaffold.observe(action, result).text == observation
    assert answer == "<answer>1795</answer><|im_end|>"
    final = scaffold.parse(call + observation + answer, finish_reason="stop")
    assert final == Action(kind="answer", answer="1795")


def test_mental_demonstrations_are_right_at_the_configured_rate() -> None:
    problem = task.Problem(expression="37*48+19", answer=1795)
    rng = random.Random(1)
    config = task.DemonstrationConfig(tool_fraction=0.0, mental_accuracy=0.5)
    rewards = [task.reward(task.demonstration(problem, rng, config)[0], 1795)
               for _ in range(2000)]
    assert 0.45 < sum(rewards) / len(rewards) < 0.55


def test_demonstration_config_is_validated() -> None:
    with pytest.raises(ValueError, match="tool_fraction"):
        task.DemonstrationConfig(tool_fraction=1.5)


def test_task_rows_carry_the_answer_for_the_exact_answer_reward() -> None:
    from rollout.data import task_from_dict
    from rollout.rewards import exact_answer

    rows = task_rows(task.make_problems(2, seed=0), prefix="t", task_type=task.TASK_TYPE)
    sample = task_from_dict(rows[0], where="test")
    import json

    data = json.loads(sample.data)
    assert exact_answer(str(data["answer"]), data)["reward"] == 1.0
    assert sample.task_type == "arithmetic_tool" and sample.task_id == "t-00000"
