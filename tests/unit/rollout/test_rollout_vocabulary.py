"""The rollout never publishes an episode as trainable when its token ids fall outside the
trained model's vocabulary: it is published FAILED with the ids named, and counted; the
vocabulary size comes from the tokenizer directory's model config when the config leaves it unset."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.rollout.config import DataConfig, InferenceConfig, RolloutConfig
from stacx.rollout.data import ListTaskSource
from stacx.rollout.errors import ConfigError
from stacx.rollout.fakes import FakeEnvironments, FakeTokenizer, MemoryPublisher, ScriptedInference
from stacx.rollout.manager import RolloutManager
from stacx.rollout.models.tiny import make_tiny_model
from stacx.rollout.service import manager_config
from stacx.schemas.records import TaskSample, TrajectoryStatus

SPECIAL_IDS_FROM = 1_000_000
"""FakeTokenizer's special tokens (the end of turn every episode holds) start here."""


def _manager(vocab_size: int | None, num_tasks: int = 2) -> RolloutManager:
    tok = FakeTokenizer()
    tasks = [
        TaskSample(task_id=f"math-{i}", task_type="math", prompt=f"q{i}", data='{"answer": 42}')
        for i in range(num_tasks)
    ]
    return RolloutManager(
        RolloutManager.Config(vocab_size=vocab_size),
        source=ListTaskSource(tasks, ListTaskSource.Config(samples_per_task=2)),
        tokenizer=tok,
        inference=ScriptedInference(tok, lambda context, call: "<answer>42</answer>"),
        publisher=MemoryPublisher(),
        sandbox=FakeEnvironments(),
    )


async def test_token_ids_past_the_vocabulary_are_published_failed_with_the_ids_and_counted() -> None:
    manager = _manager(vocab_size=SPECIAL_IDS_FROM)
    summary = await manager.run()
    published = manager.publisher.published
    assert len(published) == 4 and summary.num_out_of_vocabulary == 4
    assert {t.status for t in published} == {TrajectoryStatus.FAILED}
    assert summary.by_status == {"FAILED": 4}
    for trajectory in published:
        assert trajectory.error is not None
        assert f"outside the vocabulary [0, {SPECIAL_IDS_FROM})" in trajectory.error
        named = trajectory.error.split("token ids ", 1)[1].split("]", 1)[0] + "]"
        assert all(int(i) >= SPECIAL_IDS_FROM for i in named.strip("[]").split(", "))


async def test_token_ids_inside_the_vocabulary_stay_trainable() -> None:
    manager = _manager(vocab_size=2 * SPECIAL_IDS_FROM)
    summary = await manager.run()
    assert summary.by_status == {"COMPLETED": 4} and summary.num_out_of_vocabulary == 0


def test_a_vocab_size_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="vocab_size = 0"):
        RolloutManager.Config(vocab_size=0)


def test_the_vocabulary_size_is_read_from_the_tokenizer_directorys_model(tmp_path: Path) -> None:
    from transformers import AutoConfig

    model_dir = make_tiny_model(tmp_path / "model")
    config = RolloutConfig(
        data=DataConfig(path="t.jsonl"), inference=InferenceConfig(tokenizer=str(model_dir))
    )
    assert manager_config(config).vocab_size == AutoConfig.from_pretrained(str(model_dir)).vocab_size
    mine = RolloutConfig(
        data=DataConfig(path="t.jsonl"),
        inference=InferenceConfig(tokenizer=str(model_dir)),
        manager=RolloutManager.Config(vocab_size=9),
    )
    assert manager_config(mine).vocab_size == 9
    (tmp_path / "tokenizer-only").mkdir()
    alone = RolloutConfig(
        data=DataConfig(path="t.jsonl"), inference=InferenceConfig(tokenizer=str(tmp_path / "tokenizer-only"))
    )
    assert manager_config(alone).vocab_size is None
