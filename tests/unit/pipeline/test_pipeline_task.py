"""The quickstart task plugin: problems, reward, demonstrations aligned with the ReTool scaffold."""

from __future__ import annotations

import random

import pytest
from quickstart_plugin import SOURCE, arithmetic

task = arithmetic()


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
    from stacx.rollout.protocols import Action, ExecResult
    from stacx.rollout.scaffolds import ToolCallingScaffold

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


def test_the_task_source_plugin_resolves_by_dotted_path_and_rewards_its_answers() -> None:
    import json

    from stacx.rollout.data import build_task_set, task_from_dict
    from stacx.rollout.rewards import get_reward

    source = build_task_set(SOURCE, {"num_train": 3, "num_heldout": 2})
    heldout = {row["prompt"] for row in source.heldout_tasks()}
    train = source.train_tasks()
    assert len(train) == 3 and not heldout & {row["prompt"] for row in train}
    sample = task_from_dict(train[0], where="test")
    assert sample.task_type == "arithmetic_tool" and sample.task_id == "train-00000"
    data = json.loads(sample.data)
    score = get_reward("quickstart.arithmetic:score")
    assert score(str(data["answer"]), data) == {"reward": 1.0, "answered": 1.0}
    assert score("12", data)["reward"] == 0.0 and score(None, data)["answered"] == 0.0
    for _ in range(200):  # demonstrations never show a held-out problem
        prompt, segments = source.demonstration(random.Random(_), skill=True)
        assert prompt not in heldout and segments[-1].startswith("<answer>")
