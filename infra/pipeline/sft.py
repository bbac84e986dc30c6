"""SFT warm start: a task source's demonstrations -> `TrainingBatch`es -> the trainer's `sft` recipe.

Demonstrations are tokenised exactly as the rollout engine builds episodes: the prompt through
the tokenizer's chat template (`stacx.rollout.tokens.ChatFormat`), policy segments and the tool
observation tokenised separately, observation tokens with loss mask 0. The trainer runs in this
process on the single-process backend from an in-memory batch source (no Kafka needed), and
exports an HF directory the inference server loads.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stacx.infra.pipeline.config import SFTConfig, TranscriptsConfig
from stacx.schemas.records import TrainingBatch

__all__ = ["DemonstrationEncoder", "demonstration_batches", "run_sft", "transcript_batches"]

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class DemonstrationEncoder:
    """Token ids and loss mask of one demonstration, rendered like a rollout episode."""

    tokenizer: Any
    """A `stacx.rollout.tokens.HFTokenizer`."""
    system_prompt: str = ""
    """The scaffold's system prompt (empty: none, which keeps sequences short)."""

    def encode(self, prompt: str, segments: Sequence[str]) -> tuple[list[int], list[int]]:
        from stacx.rollout.tokens import ChatFormat

        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        ids = ChatFormat(self.tokenizer).prompt_ids([*messages, {"role": "user", "content": prompt}])
        mask = [0] * len(ids)
        for index, segment in enumerate(segments):
            seg = self.tokenizer.encode(segment)
            ids += seg
            mask += [0 if index % 2 else 1] * len(seg)  # odd segments are tool observations
        return ids, mask


def _pack(rows: list[tuple[list[int], list[int]]], *, step: int, prompt_lengths: list[int]) -> TrainingBatch:
    lengths = np.array([len(ids) for ids, _ in rows], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    ids = np.concatenate([np.asarray(r[0], dtype=np.int32) for r in rows])
    mask = np.concatenate([np.asarray(r[1], dtype=np.uint8) for r in rows])
    digest = hashlib.sha256(ids.tobytes()).hexdigest()[:16]
    n = len(rows)
    return TrainingBatch(
        batch_id=f"sft-{step:05d}-{digest}",
        model_name="policy",
        trajectory_ids=[f"sft-{step}-{i}" for i in range(n)],
        group_ids=[f"sft-{step}-{i}" for i in range(n)],
        task_types=["sft"] * n,
        policy_versions=np.zeros(n, dtype=np.int32),
        offsets=offsets,
        lengths=lengths,
        prompt_lengths=np.asarray(prompt_lengths, dtype=np.int32),
        token_ids=ids,
        loss_mask=mask,
        logprobs=np.zeros(len(ids), dtype=np.float32),
        rewards=np.zeros(n, dtype=np.float32),
    )


Demonstration = Callable[..., tuple[str, Sequence[str]]]
"""`demonstration(rng, *, skill) -> (prompt, segments)` of a task source (stacx.rollout.data)."""


def demonstration_batches(
    demonstration: Demonstration,
    encoder: DemonstrationEncoder,
    sft: SFTConfig,
    *,
    end_token: str,
) -> list[TrainingBatch]:
    """`sft.steps` batches of `sft.batch_size` fresh demonstrations: the first `sft.skill_steps`
    with `skill=True`, then the final mixture; `end_token` closes the last policy segment."""
    rng = random.Random(sft.seed)
    batches = []
    for step in range(sft.steps):
        rows: list[tuple[list[int], list[int]]] = []
        prompt_lengths: list[int] = []
        while len(rows) < sft.batch_size:
            prompt, segments = demonstration(rng, skill=step < sft.skill_steps)
            segments = [*segments[:-1], f"{segments[-1]}{end_token}"]
            ids, mask = encoder.encode(prompt, segments)
            rows.append((ids, mask))
            prompt_lengths.append(mask.index(1))
        batches.append(_pack(rows, step=step, prompt_lengths=prompt_lengths))
    return batches


def transcript_batches(
    rows: Sequence[dict[str, Any]],
    encode: Callable[[str, str], tuple[list[int], list[int]]],
    sft: SFTConfig,
    transcripts: TranscriptsConfig,
) -> list[TrainingBatch]:
    """`sft.steps` batches of scaffold transcripts (`encode(instruction, answer)`): each row is an
    expert one with probability `skill_expert_fraction` in the first `sft.skill_steps` steps,
    `expert_fraction` after, drawn uniformly among the rows of its kind."""
    experts = [r for r in rows if r.get("kind") == "expert"]
    novices = [r for r in rows if r.get("kind") != "expert"]
    if not experts or not novices:
        raise ValueError(
            f"{transcripts.path}: the SFT mixture needs expert and novice rows "
            f"(found {len(experts)} expert, {len(novices)} other)"
        )
    cache: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
    rng = random.Random(sft.seed)
    batches = []
    for step in range(sft.steps):
        share = transcripts.skill_expert_fraction if step < sft.skill_steps else transcripts.expert_fraction
        chosen = [rng.choice(experts if rng.random() < share else novices) for _ in range(sft.batch_size)]
        encoded = []
        for row in chosen:
            key = (str(row["instruction"]), str(row["answer"]))
            if key not in cache:
                cache[key] = encode(*key)
            encoded.append(cache[key])
        batches.append(_pack(encoded, step=step, prompt_lengths=[mask.index(1) for _, mask in encoded]))
    return batches


def run_sft(
    base_model: Path,
    out_root: Path,
    batches: list[TrainingBatch],
    *,
    lr: float,
    warmup_steps: int = 0,
    seed: int = 0,
    export_name: str = "sft",
    on_step: Callable[[int, float], None] | None = None,
) -> Path:
    """Train the `sft` recipe on `batches` from `base_model`; returns the exported HF directory
    (`out_root/<export_name>/v<steps>`)."""
    from stacx.trainer import (
        BackendConfig,
        ExportConfig,
        InMemoryBatchSource,
        ModelConfig,
        OptimizerConfig,
        StacxTrainer,
        TrainerConfig,
    )

    config = TrainerConfig(
        recipe="sft",
        models={"policy": ModelConfig(path=str(base_model))},
        optimizer=OptimizerConfig(lr=lr, warmup_steps=warmup_steps),
        backend=BackendConfig(kind="single", device="cpu"),
        export=ExportConfig(
            dir=str(out_root), every_steps=len(batches), model_name=export_name, publish=False, keep_last=1
        ),
        max_steps=len(batches),
        seed=seed,
        trainer_id="stacx-sft",
    )

    def step_done(result: Any) -> None:
        if on_step is not None:
            on_step(result.step, result.loss)

    source = InMemoryBatchSource(batches)
    with _quiet_steps(), StacxTrainer(config, source=source, on_step=step_done) as trainer:
        trainer.run()
    exported = sorted((out_root / export_name).glob("v*"))
    if not exported:
        raise RuntimeError(f"the sft trainer exported nothing under {out_root / export_name}")
    return exported[-1]


@contextmanager
def _quiet_steps() -> Iterator[None]:
    """The trainer's line per step is left out of the warm start: its progress is the run's stage
    (`on_step`), so hundreds of SFT steps do not fill the terminal."""
    engine = logging.getLogger("stacx.trainer.engine")
    level = engine.level
    engine.setLevel(logging.WARNING)
    try:
        yield
    finally:
        engine.setLevel(level)
