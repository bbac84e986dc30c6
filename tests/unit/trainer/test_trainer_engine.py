"""Engine behaviour on the single-process backend: validation, commits, resume, export."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from stacx.trainer import (
    BatchValidationError,
    CheckpointConfig,
    InMemoryBatchSource,
    InMemoryWeightPublisher,
    StacxTrainer,
)
from stacx.trainer.testing import synthetic_batch, synthetic_batches, tiny_trainer_config


def _bad_batch() -> object:
    batch = synthetic_batch(99)
    return dataclasses.replace(batch, loss_mask=batch.loss_mask[:-3])


def test_batch_with_disagreeing_lengths_is_set_aside_and_training_continues(tmp_path: Path) -> None:
    config = tiny_trainer_config("sft", tmp_path)
    config.checkpoint.every_steps = 2
    config.export.dir = None  # an export checkpoints its step first; no export here
    source = InMemoryBatchSource([synthetic_batch(0), _bad_batch(), synthetic_batch(1)])
    trainer = StacxTrainer(config, source=source)
    results = trainer.run(5)
    assert [r.batch_id for r in results] == [synthetic_batch(0).batch_id, synthetic_batch(1).batch_id]
    ((sourced, error),) = source.rejected
    assert sourced.offset == 1 and isinstance(error, BatchValidationError)
    assert re.search(r"len\(loss_mask\)=\d+ != len\(token_ids\)", str(error))
    assert trainer.num_rejected_batches == 1
    assert source.committed == {"memory/0": 3}  # past the bad batch: it is never read again


def test_non_finite_rewards_never_train_and_name_the_field() -> None:
    batch = synthetic_batch(0)
    rewards = batch.rewards.copy()
    rewards[0] = np.nan
    bad = dataclasses.replace(batch, rewards=rewards)
    source = InMemoryBatchSource([bad, synthetic_batch(1)])
    trainer = StacxTrainer(tiny_trainer_config("sft"), source=source)
    (result,) = trainer.run(3)
    assert result.batch_id == synthetic_batch(1).batch_id and np.isfinite(result.loss)
    assert "NaN" in str(source.rejected[0][1]) and trainer.num_rejected_batches == 1


def test_per_sequence_field_mismatch_names_the_field() -> None:
    batch = synthetic_batch(0)
    bad = dataclasses.replace(batch, rewards=batch.rewards[:-1])
    source = InMemoryBatchSource([bad])
    trainer = StacxTrainer(tiny_trainer_config("sft"), source=source)
    assert trainer.run(1) == []
    assert "len(rewards)" in str(source.rejected[0][1])


def test_token_ids_past_the_vocabulary_are_set_aside_and_training_continues(
        tmp_path: Path) -> None:
    """A batch tokenized for a bigger vocabulary (id 200 on a 64-token model) would index past
    the embedding: it is rejected with its reason, its offset is committed, the next batch
    trains."""
    config = tiny_trainer_config("sft", tmp_path)
    config.export.dir = None
    batch = synthetic_batch(0)
    ids = batch.token_ids.copy()
    ids[5] = 200
    foreign = dataclasses.replace(batch, token_ids=ids)
    source = InMemoryBatchSource([foreign, synthetic_batch(1)])
    trainer = StacxTrainer(config, source=source)
    assert trainer.vocab_size == 64
    (result,) = trainer.run(3)
    assert result.batch_id == synthetic_batch(1).batch_id and np.isfinite(result.loss)
    ((sourced, error),) = source.rejected
    assert sourced.offset == 0 and isinstance(error, BatchValidationError)
    assert "token ids [200] are outside the model's vocabulary [0, 64)" in str(error)
    assert trainer.num_rejected_batches == 1 and source.committed == {"memory/0": 2}


def test_remax_sets_aside_a_batch_without_a_greedy_row_and_trains_on() -> None:
    """ReMax's baseline is each group's greedy sample: a batch without one is rejected with that
    reason (never a failed step that would repeat on every restart); the next batch trains."""
    source = InMemoryBatchSource([synthetic_batch(0), synthetic_batch(1, greedy_first=True)])
    trainer = StacxTrainer(tiny_trainer_config("remax"), source=source)
    (result,) = trainer.run(3)
    assert result.batch_id == synthetic_batch(1, greedy_first=True).batch_id
    ((sourced, error),) = source.rejected
    assert sourced.offset == 0 and isinstance(error, BatchValidationError)
    assert "needs one greedy sample (temperature 0) per prompt group" in str(error)


class _CheckingSource(InMemoryBatchSource):
    """Records, at each commit, what the latest checkpoint on disk says."""

    def __init__(self, batches: list, root: Path) -> None:
        super().__init__(batches)
        self.root = root
        self.log: list[tuple[dict, dict]] = []

    def commit(self, positions: dict) -> None:
        latest = self.root / (self.root / "latest").read_text()
        state = json.loads((latest / "trainer_state.json").read_text())
        self.log.append((dict(positions), state["positions"]))
        super().commit(positions)


def test_offsets_are_committed_only_after_a_checkpoint(tmp_path: Path) -> None:
    config = tiny_trainer_config("sft", tmp_path)
    config.checkpoint.every_steps = 2
    config.export.dir = None  # an export checkpoints its step first; no export here
    source = _CheckingSource(synthetic_batches(3), tmp_path / "ckpt")
    trainer = StacxTrainer(config, source=source)
    trainer.run(3)  # checkpoint at step 2, then a final one when run() returns at step 3
    assert source.log == [({"memory/0": 2}, {"memory/0": 2}), ({"memory/0": 3}, {"memory/0": 3})]
    assert (tmp_path / "ckpt" / "latest").read_text() == "step_00000003"


def test_resume_reproduces_the_next_step_loss(tmp_path: Path) -> None:
    batches = synthetic_batches(3)
    config = tiny_trainer_config("grpo", tmp_path)
    config.optimizer.warmup_steps = 5  # the LR schedule must be restored too
    first = StacxTrainer(config, source=InMemoryBatchSource(batches))
    first.run(2)
    saved = tmp_path / "saved"
    shutil.copytree(tmp_path / "ckpt", saved)
    expected = first.run(3)[0]
    resumed_config = tiny_trainer_config("grpo", tmp_path,
                                         checkpoint=CheckpointConfig(dir=str(saved)))
    resumed_config.optimizer.warmup_steps = 5
    source = InMemoryBatchSource(batches)
    second = StacxTrainer(resumed_config, source=source)
    assert second.step_count == 2 and source.next_offset == 2
    got = second.run(3)[0]
    assert got.batch_id == expected.batch_id
    assert got.loss == pytest.approx(expected.loss, rel=1e-6, abs=1e-7)
    for w in first.models.values():
        if w.trainable:
            for (name, p), q in zip(w.module.named_parameters(),  # type: ignore[union-attr]
                                    second.models[w.slot.name].module.parameters(),  # type: ignore[union-attr]
                                    strict=True):
                assert torch.allclose(p, q, atol=1e-6), name


def test_replayed_batch_ids_are_recognised_skipped_and_committed(tmp_path: Path) -> None:
    batches = synthetic_batches(2)
    source = InMemoryBatchSource([batches[0], batches[1], batches[0]])
    trainer = StacxTrainer(tiny_trainer_config("sft", tmp_path), source=source)
    results = trainer.run(5)
    assert [r.batch_id for r in results] == [batches[0].batch_id, batches[1].batch_id]
    assert trainer.positions == {"memory/0": 3}
    assert source.committed == {"memory/0": 3}  # the skipped replay is committed too


def test_export_writes_loadable_hf_weights_and_publishes(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    config = tiny_trainer_config("grpo", tmp_path)
    publisher = InMemoryWeightPublisher()
    trainer = StacxTrainer(config, source=InMemoryBatchSource(synthetic_batches(2)),
                           publisher=publisher)
    trainer.run(2)
    assert [v.version for v in publisher.published] == [1, 2]
    path = Path(publisher.published[-1].path)
    assert path.name == "v00000002" and (path / "model.safetensors").is_file()
    assert not list(path.parent.glob(".*tmp*"))
    loaded = AutoModelForCausalLM.from_pretrained(str(path))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    ours = trainer.models["policy"].module(ids, torch.ones_like(ids)).logits  # type: ignore[misc]
    assert torch.allclose(loaded(input_ids=ids).logits, ours, atol=1e-5)


def test_precomputed_advantages_are_used() -> None:
    batch = synthetic_batch(0)
    batch = dataclasses.replace(batch, advantages=np.zeros(batch.num_sequences, np.float32))
    config = tiny_trainer_config("grpo", role_options={"policy": {"kl_beta": 0.0}})
    result = StacxTrainer(config, source=InMemoryBatchSource([batch])).run(1)[0]
    assert result.loss == 0.0


def test_metrics_of_ranks_merge_by_their_kind() -> None:
    from stacx.trainer.engine import merge_metrics

    merged = merge_metrics([{"p/ratio_max": 1.5, "p/ratio_min": 0.9, "p/clip_frac": 0.2},
                            {"p/ratio_max": 1.1, "p/ratio_min": 0.7, "p/clip_frac": 0.4},
                            {}])
    assert merged == pytest.approx({"p/ratio_max": 1.5, "p/ratio_min": 0.7, "p/clip_frac": 0.3})


def test_each_published_version_carries_the_figures_of_the_step_that_made_it(tmp_path: Path) -> None:
    from stacx.schemas.records import STEP_FIGURE_PREFIX

    publisher = InMemoryWeightPublisher()
    trainer = StacxTrainer(tiny_trainer_config("grpo", tmp_path),
                           source=InMemoryBatchSource(synthetic_batches(2)), publisher=publisher)
    results = trainer.run(2)
    for version, result in zip(publisher.published, results, strict=True):
        figures = {k.removeprefix(STEP_FIGURE_PREFIX): float(v) for k, v in version.metadata.items()
                   if k.startswith(STEP_FIGURE_PREFIX)}
        assert figures["loss"] == result.loss  # exact: the text round-trips the float
        assert figures["num_tokens"] == result.num_tokens
        assert figures["seconds"] == result.seconds > 0
        assert figures["policy/grad_norm"] == result.metrics["policy/grad_norm"] > 0
        assert figures["policy/lr"] == trainer.models["policy"].optimizer.param_groups[0]["lr"] > 0
        assert {k: figures[k] for k in result.metrics} == result.metrics
        assert version.metadata["batch_id"] == result.batch_id
