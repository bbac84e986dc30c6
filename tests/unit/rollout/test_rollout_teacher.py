"""Teacher in the loop: the beta mixture, teacher labels and logprobs on the student's own states,
and the DAgger rows the trainer consumes."""

from __future__ import annotations

import numpy as np
import pytest

from stacx.rollout.errors import ConfigError
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import FakeEnvironments, FakeTokenizer, ScriptedInference, StaticVersion
from stacx.rollout.protocols import TaskGroup
from stacx.rollout.resources import LocalPool, ResourcePool, Resources
from stacx.rollout.teacher import BetaSchedule, TeacherInTheLoop, dagger_rows
from stacx.schemas.records import TaskSample

BUDGET = Resources(sandboxes=4, cpu=4, memory_mb=4096, generations=2)
STUDENT = ["<tool_call>print(6*8)</tool_call>", "<answer>48</answer>"]
TEACHER = ["<tool_call>print(6*7)</tool_call>", "<answer>42</answer>"]


def _policy(texts: list[str]):  # type: ignore[no-untyped-def]
    """Call the tool; right after a tool response, answer."""
    return lambda context, call: texts[1] if context.rstrip().endswith("</tool_response>") \
        else texts[0]


class FixedScorer:
    def __init__(self) -> None:
        self.calls: list[tuple[list[int], int]] = []

    async def score(self, input_ids: list[int], start: int) -> list[float]:
        self.calls.append((list(input_ids), start))
        return [-0.5 - 0.01 * k for k in range(len(input_ids) - start)]


async def _episode(config: TeacherInTheLoop.Config, *, version: int = 0,
                   scorer: FixedScorer | None = None):  # type: ignore[no-untyped-def]
    tok = FakeTokenizer()
    student, teacher = ScriptedInference(tok, _policy(STUDENT)), ScriptedInference(tok, _policy(TEACHER))
    mixed = TeacherInTheLoop(config, student=student, teacher=teacher, scorer=scorer,
                             versions=StaticVersion(version))
    evaluator = Evaluator(Evaluator.Config(), name="math", tokenizer=tok, inference=mixed,
                          environments=FakeEnvironments(), global_pool=ResourcePool(BUDGET))
    task = TaskSample(task_id="t1", task_type="math", prompt="What is 6*7?", data='{"answer": 42}')
    group = TaskGroup(group_id="g1", task=task, num_samples=1)
    async with LocalPool.drawn(evaluator.global_pool, evaluator.demand.local_pool, name="ep") as lp:
        traj = await evaluator.run(group, 0, lp, policy_version=version)
    return traj, tok, student, teacher, mixed


def test_beta_schedules() -> None:
    assert [BetaSchedule(kind="exponential", beta0=1.0, decay=0.5)(i) for i in range(3)] == [1.0, 0.5, 0.25]
    linear = BetaSchedule(kind="linear", beta0=0.8, final=0.2, horizon=3)
    assert [round(linear(i), 6) for i in (0, 3, 9)] == [0.8, 0.2, 0.2]
    assert BetaSchedule(kind="constant", beta0=0.3)(7) == 0.3
    with pytest.raises(ConfigError, match="beta0"):
        BetaSchedule(beta0=1.5)
    with pytest.raises(ConfigError, match="mode"):
        TeacherInTheLoop.Config(mode="bc")  # type: ignore[arg-type]


async def test_student_acts_and_the_teacher_labels_its_states() -> None:
    traj, tok, student, teacher, mixed = await _episode(
        TeacherInTheLoop.Config(beta=BetaSchedule(kind="constant", beta0=0.0)))
    assistant = [t for t in traj.turns if t.role == "assistant"]
    assert [tok.decode(t.token_ids).removesuffix("<|im_end|>") for t in assistant] == STUDENT[:1] + \
        ["<answer>48</answer>"]
    assert [t.actor for t in assistant] == ["student", "student"]
    # the teacher saw exactly the student's states and its greedy labels rode on the turns
    assert [c[0] for c in teacher.calls] == [c[0] for c in student.calls]
    assert all(c[1].temperature == 0.0 for c in teacher.calls)
    labels = [tok.decode(t.teacher_token_ids).removesuffix("<|im_end|>") for t in assistant]
    assert labels == ["<tool_call>print(6*7)</tool_call>", "<answer>42</answer>"]
    assert traj.reward == 0.0  # the student's own answer (48) was executed and scored
    assert mixed.num_student_actions == 2 and mixed.num_teacher_actions == 0


async def test_beta_one_lets_the_teacher_act() -> None:
    traj, tok, student, _, mixed = await _episode(TeacherInTheLoop.Config())  # beta0 = 1 at v0
    assert student.calls == [] and mixed.num_teacher_actions == 2
    assert traj.reward == 1.0
    assert all(t.actor == "teacher" for t in traj.turns if t.role == "assistant")


async def test_beta_decays_with_the_student_version() -> None:
    config = TeacherInTheLoop.Config(beta=BetaSchedule(kind="exponential", beta0=1.0, decay=0.5))
    acted = {"teacher": 0, "student": 0}
    for seed in range(40):
        config.seed = seed
        *_, mixed = await _episode(config, version=2)  # beta = 0.25
        acted["teacher"] += mixed.num_teacher_actions
        acted["student"] += mixed.num_student_actions
    share = acted["teacher"] / (acted["teacher"] + acted["student"])
    assert 0.1 < share < 0.4, acted


async def test_opd_mode_scores_the_students_tokens() -> None:
    scorer = FixedScorer()
    traj, _, student, teacher, _ = await _episode(TeacherInTheLoop.Config(mode="opd"), scorer=scorer)
    assert teacher.calls == []
    first = next(t for t in traj.turns if t.role == "assistant")
    state = student.calls[0][0]
    assert scorer.calls[0] == (state + list(first.token_ids), len(state))
    np.testing.assert_allclose(first.teacher_logprobs,
                               [-0.5 - 0.01 * k for k in range(len(first.token_ids))], rtol=1e-6)
    with pytest.raises(ConfigError, match="scorer"):
        TeacherInTheLoop(TeacherInTheLoop.Config(mode="opd"), student=student, teacher=teacher)


async def test_dagger_rows_put_teacher_labels_on_student_states() -> None:
    traj, tok, student, _, _ = await _episode(
        TeacherInTheLoop.Config(beta=BetaSchedule(kind="constant", beta0=0.0)))
    rows = dagger_rows(traj)
    assert len(rows) == 2
    for row, (state, _), label in zip(rows, student.calls, ["print(6*7)", "<answer>42</answer>"],
                                      strict=True):
        ids, mask = list(row.token_ids), list(row.loss_mask)
        assert ids[:row.prompt_length] == state  # the student's own state, exactly
        assert mask == [0] * len(state) + [1] * (len(ids) - len(state))
        assert label in tok.decode(ids[len(state):])
        assert row.reward == traj.reward and row.metadata["actor"] == "student"
        assert not np.any(row.logprobs)
    assert len({r.trajectory_id for r in rows}) == 2 and len({r.group_id for r in rows}) == 2
    assert dagger_rows(traj)[0].trajectory_id == rows[0].trajectory_id  # deterministic ids


async def test_opd_teacher_logprobs_reach_the_trainer_aligned_to_the_students_tokens() -> None:
    """Evaluator (opd mode) -> Trajectory.teacher_logprobs -> pack_batch -> TensorBatch: the
    served teacher's logprob sits on exactly the student's generated targets."""
    from stacx.consumers.assembly.packing import PackedGroup, pack_batch
    from stacx.schemas.codec import decode, encode
    from stacx.trainer.batch import to_tensor_batch

    traj, *_ = await _episode(TeacherInTheLoop.Config(mode="opd"), scorer=FixedScorer())
    assert len(traj.teacher_logprobs) == len(traj.token_ids)
    traj = decode(encode(traj))  # through the wire format
    batch = decode(encode(pack_batch([PackedGroup(group_id="g1", trajectories=[traj])],
                                     model_name="tiny")))
    tensors = to_tensor_batch(batch)
    served = tensors.extras["served_teacher_logprobs"][0]  # [T]
    mask = tensors.loss_mask[0]
    expected = np.zeros(len(traj.token_ids) - 1, dtype=np.float32)
    for turn_start, turn in _turn_spans(traj):
        if turn.role == "assistant":
            for k in range(len(turn.token_ids)):
                expected[turn_start + k - 1] = -0.5 - 0.01 * k
    np.testing.assert_allclose(served.numpy(), expected, rtol=1e-6)
    assert bool((served[mask == 0] == 0).all()) and bool((served[mask > 0] < 0).all())


def _turn_spans(traj):  # type: ignore[no-untyped-def]
    start = 0
    for turn in traj.turns:
        yield start, turn
        start += len(turn.token_ids)


async def test_label_only_episodes_carry_no_token_teacher_logprobs() -> None:
    traj, *_ = await _episode(TeacherInTheLoop.Config(beta=BetaSchedule(kind="constant", beta0=0.0)))
    assert len(traj.teacher_logprobs) == 0


async def test_aggrevate_rolls_in_with_the_student_then_the_teacher_finishes() -> None:
    from stacx.rollout.teacher import aggrevate_rows

    traj, tok, student, teacher, _ = await _episode(
        TeacherInTheLoop.Config(mode="aggrevate", switch_turns=1))  # t* = 0
    assistant = [t for t in traj.turns if t.role == "assistant"]
    assert [t.actor for t in assistant] == ["candidate", "teacher"]
    assert len(student.calls) == 1 and len(teacher.calls) == 1
    assert traj.reward == 1.0  # the teacher's answer after the student's (wrong) tool call
    (row,) = aggrevate_rows(traj)
    assert list(row.token_ids) == list(traj.turns[0].token_ids) + list(assistant[0].token_ids)
    assert list(row.loss_mask) == [0] * len(traj.turns[0].token_ids) + [1] * len(
        assistant[0].token_ids)
    assert "print(6*8)" in tok.decode(row.token_ids[row.prompt_length:])
    assert row.reward == 1.0 and row.group_id == traj.group_id
    assert row.sample_index == traj.sample_index


async def test_aggrevate_without_a_switch_scores_the_last_student_action() -> None:
    from stacx.rollout.teacher import _SwitchEpisode, aggrevate_rows

    tok = FakeTokenizer()
    student, teacher = ScriptedInference(tok, _policy(STUDENT)), ScriptedInference(tok, _policy(TEACHER))
    mixed = TeacherInTheLoop(TeacherInTheLoop.Config(mode="aggrevate"), student=student,
                             teacher=teacher)
    episode = _SwitchEpisode(mixed, 5)  # the episode ends before turn 5: all roll-in
    evaluator = Evaluator(Evaluator.Config(), name="math", tokenizer=tok, inference=episode,
                          environments=FakeEnvironments(), global_pool=ResourcePool(BUDGET))
    task = TaskSample(task_id="t1", task_type="math", prompt="What is 6*7?", data='{"answer": 42}')
    async with LocalPool.drawn(evaluator.global_pool, evaluator.demand.local_pool, name="ep") as lp:
        traj = await evaluator.run(TaskGroup(group_id="g1", task=task, num_samples=1), 0, lp)
    assert teacher.calls == [] and traj.reward == 0.0
    (row,) = aggrevate_rows(traj)
    assert tok.decode(row.token_ids[row.prompt_length:]).startswith("<answer>48</answer>")
    assert row.metadata["aggrevate_turn"] == "3" and row.reward == 0.0


def test_yaml_teacher_section_is_validated() -> None:
    from stacx.rollout.config import RolloutConfig
    from stacx.schemas.config import ConfigError as LoaderError
    from stacx.schemas.config import build

    config = build(RolloutConfig, {"data": {"path": "t"}, "sandbox": None, "teacher": {
        "url": "http://127.0.0.1:30001", "mode": "aggrevate", "switch_turns": 3,
        "beta": {"kind": "linear", "beta0": 0.9, "final": 0.1, "horizon": 4}}}, where="config")
    assert config.teacher is not None and config.teacher.switch_turns == 3
    assert config.teacher.beta(4) == pytest.approx(0.1)
    with pytest.raises(LoaderError, match="teacher.url"):
        build(RolloutConfig, {"data": {"path": "t"}, "teacher": {"mode": "dagger"}}, where="config")
    with pytest.raises(LoaderError, match="beta0"):
        teacher = {"url": "http://t", "beta": {"beta0": 2}}
        build(RolloutConfig, {"data": {"path": "t"}, "teacher": teacher}, where="config")


@pytest.mark.parametrize(("mode", "publisher"), [("dagger", "DAggerLabels"),
                                                 ("aggrevate", "AggreVaTeRows"),
                                                 ("opd", "MemoryPublisher")])
async def test_the_service_mixes_in_the_teacher_and_publishes_its_rows(
        mode: str, publisher: str) -> None:
    from stacx.rollout.config import RolloutConfig
    from stacx.rollout.fakes import MemoryPublisher
    from stacx.rollout.service import open_manager
    from stacx.schemas.config import build

    tok = FakeTokenizer()
    config = build(RolloutConfig, {"data": {"path": "t"}, "sandbox": None,
                           "kafka": {"publish": False, "follow_weights": False},
                           "manager": {"evaluators": {"default": {"scaffold": "single_turn"}}},
                           "teacher": {"url": "http://127.0.0.1:9", "mode": mode}}, where="config")
    task = TaskSample(task_id="t1", task_type="math", prompt="What is 6*7?", data='{"answer": 42}')
    async with open_manager(config, tasks=[task], inference=ScriptedInference(tok, _policy(STUDENT)),
                            tokenizer=tok, publisher=MemoryPublisher()) as manager:
        evaluator = next(iter(manager.evaluators.values()))
        assert isinstance(evaluator.inference, TeacherInTheLoop)
        assert evaluator.inference.config.mode == mode
        assert type(manager.publisher).__name__ == publisher
