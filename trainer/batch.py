"""TrainingBatch (packed numpy arrays) -> validated, padded tensors aligned to targets.

Shape legend: B sequences, L padded sequence length, T = L - 1 target positions.
Position t of a `[B, T]` tensor describes token t + 1 (the token predicted from position t).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from stacx.schemas.records import TrainingBatch
from stacx.trainer.errors import BatchValidationError
from stacx.trainer.losses import Normaliser

__all__ = ["TensorBatch", "check_greedy_rows", "check_vocabulary", "to_tensor_batch",
           "validate_batch"]


@dataclass(kw_only=True, slots=True)
class TensorBatch:
    """One step's data as tensors; specializations add derived fields to `extras`."""

    batch_id: str
    input_ids: torch.Tensor
    """[B, L] int64, right-padded with 0."""
    attention_mask: torch.Tensor
    """[B, L] int64, 1 on real tokens."""
    loss_mask: torch.Tensor
    """[B, T] float32, 1 on trained target tokens."""
    old_logprobs: torch.Tensor
    """[B, T] float32 sampling logprobs of the targets (0 where not sampled)."""
    rewards: torch.Tensor
    """[B] float32 sequence rewards."""
    group_index: torch.Tensor
    """[B] int64 dense group ids 0..G-1 (sequences of one prompt share one)."""
    lengths: torch.Tensor
    """[B] int64 true sequence lengths."""
    temperatures: torch.Tensor | None = None
    """[B] float32 sampling temperature of each row's logprobs (> 0; None: all 1)."""
    logprobs_recorded: torch.Tensor | None = None
    """[B] bool: the row's `old_logprobs` were recorded at sampling time (None: all were)."""
    advantages: torch.Tensor | None = None
    """[B] float32 precomputed advantages, when the batch carries them."""
    greedy: torch.Tensor | None = None
    """[B] bool: the row was decoded greedily (recorded temperature 0; None: no row was)."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """Derived or synced tensors (e.g. `ref_logprobs` [B, T], `values` [B, T]); from the batch
    itself, `served_teacher_logprobs` [B, T] when its events carry a served teacher's logprobs."""
    normaliser: Normaliser | None = None
    """Global loss denominators of the role being computed (set by the engine; None: this batch's)."""

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum().item())

    @property
    def targets(self) -> torch.Tensor:
        """[B, T] next tokens."""
        return self.input_ids[:, 1:]

    def select(self, index: torch.Tensor) -> TensorBatch:
        """Rows `index` of every per-sequence tensor (extras included)."""
        return replace(
            self,
            input_ids=self.input_ids[index], attention_mask=self.attention_mask[index],
            loss_mask=self.loss_mask[index], old_logprobs=self.old_logprobs[index],
            rewards=self.rewards[index], group_index=self.group_index[index],
            lengths=self.lengths[index],
            temperatures=None if self.temperatures is None else self.temperatures[index],
            logprobs_recorded=None if self.logprobs_recorded is None
            else self.logprobs_recorded[index],
            advantages=None if self.advantages is None else self.advantages[index],
            greedy=None if self.greedy is None else self.greedy[index],
            extras={k: v[index] for k, v in self.extras.items()},
        )

    def with_extras(self, **tensors: torch.Tensor) -> TensorBatch:
        return replace(self, extras={**self.extras, **tensors})

    def with_normaliser(self, normaliser: Normaliser | None) -> TensorBatch:
        return replace(self, normaliser=normaliser)

    def to(self, device: torch.device) -> TensorBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return replace(
            self,
            input_ids=self.input_ids.to(device), attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device), old_logprobs=self.old_logprobs.to(device),
            rewards=self.rewards.to(device), group_index=self.group_index.to(device),
            lengths=self.lengths.to(device), temperatures=move(self.temperatures),
            logprobs_recorded=move(self.logprobs_recorded), advantages=move(self.advantages),
            greedy=move(self.greedy),
            extras={k: v.to(device) for k, v in self.extras.items()},
        )


def _fail(batch: TrainingBatch, message: str) -> BatchValidationError:
    return BatchValidationError(f"batch {batch.batch_id!r} rejected: {message}")


def validate_batch(batch: TrainingBatch) -> None:
    """Raise BatchValidationError, naming the field, unless every array agrees with the others."""
    n = batch.num_sequences
    if n == 0:
        raise _fail(batch, "it has no sequences (trajectory_ids is empty)")
    for name in ("group_ids", "task_types", "policy_versions", "offsets", "lengths",
                 "prompt_lengths", "rewards"):
        if len(getattr(batch, name)) != n:
            raise _fail(batch, f"len({name})={len(getattr(batch, name))} but there are {n} "
                        "sequences (len(trajectory_ids)); every per-sequence field needs one entry")
    for name in ("advantages", "temperatures", "logprobs_recorded"):
        values = getattr(batch, name)
        if values is not None and len(values) != n:
            raise _fail(batch, f"len({name})={len(values)} but there are {n} sequences; "
                        "give one entry per sequence or leave it null")
    if batch.temperatures is not None and not (np.isfinite(batch.temperatures).all()
                                               and (batch.temperatures >= 0).all()):
        raise _fail(batch, f"temperatures must be finite and >= 0 (0 = greedy), "
                    f"got {np.asarray(batch.temperatures).tolist()}")
    size = len(batch.token_ids)
    for name in ("loss_mask", "logprobs") + (("teacher_logprobs",) if batch.teacher_logprobs
                                              is not None else ()):
        if len(getattr(batch, name)) != size:
            raise _fail(batch, f"len({name})={len(getattr(batch, name))} != len(token_ids)={size}; "
                        "packed arrays must have one entry per token")
    offsets = np.asarray(batch.offsets, dtype=np.int64)
    lengths = np.asarray(batch.lengths, dtype=np.int64)
    if (lengths < 2).any():
        raise _fail(batch, f"lengths must be >= 2 (a prompt token and a target), got {lengths.tolist()}")
    if (offsets < 0).any() or (offsets + lengths > size).any():
        raise _fail(batch, f"offsets+lengths run past len(token_ids)={size}: "
                    f"offsets={offsets.tolist()} lengths={lengths.tolist()}")
    if batch.teacher_logprobs is not None and not np.isfinite(batch.teacher_logprobs).all():
        raise _fail(batch, "teacher_logprobs contain NaN/inf")
    if not np.isfinite(batch.rewards).all() or not np.isfinite(batch.logprobs).all():
        raise _fail(batch, "rewards or logprobs contain NaN/inf")


def check_vocabulary(batch: TrainingBatch, vocab_size: int) -> None:
    """Raise BatchValidationError unless every token id is in [0, vocab_size): a batch from
    another tokenizer (or model) would index past the embedding."""
    ids = np.asarray(batch.token_ids)
    if ids.size == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = ids[(ids < 0) | (ids >= vocab_size)]
        raise _fail(batch, f"token ids {sorted(set(bad.tolist()))[:5]} are outside the model's "
                    f"vocabulary [0, {vocab_size}): it was tokenized for another model; check "
                    "the rollout's model and the trainer's models.* paths")


def check_greedy_rows(batch: TrainingBatch) -> None:
    """Raise BatchValidationError unless some row was decoded greedily (temperature 0)."""
    if batch.temperatures is None or not (np.asarray(batch.temperatures) == 0).any():
        raise _fail(batch, "the recipe needs one greedy sample (temperature 0) per prompt group "
                    "as its baseline and this batch has none; its producer must sample one")


def to_tensor_batch(batch: TrainingBatch) -> TensorBatch:
    """Validate and unpack into right-padded [B, L] / target-aligned [B, T] tensors."""
    validate_batch(batch)
    n, max_len = batch.num_sequences, int(np.max(batch.lengths))
    ids = np.zeros((n, max_len), dtype=np.int64)
    attn = np.zeros((n, max_len), dtype=np.int64)
    mask = np.zeros((n, max_len), dtype=np.float32)
    logp = np.zeros((n, max_len), dtype=np.float32)
    teacher = None if batch.teacher_logprobs is None else np.zeros((n, max_len), dtype=np.float32)
    for i, (off, length) in enumerate(zip(batch.offsets, batch.lengths, strict=True)):
        sl = slice(int(off), int(off) + int(length))
        ids[i, :length] = batch.token_ids[sl]
        attn[i, :length] = 1
        mask[i, :length] = batch.loss_mask[sl]
        logp[i, :length] = batch.logprobs[sl]
        if teacher is not None:
            teacher[i, :length] = batch.teacher_logprobs[sl]  # type: ignore[index]
    dense = {g: i for i, g in enumerate(dict.fromkeys(batch.group_ids))}
    mask_t = mask[:, 1:]
    return TensorBatch(
        batch_id=batch.batch_id,
        input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(attn),
        loss_mask=torch.from_numpy(mask_t.copy()),
        old_logprobs=torch.from_numpy(logp[:, 1:].copy()),
        rewards=torch.tensor(np.asarray(batch.rewards, dtype=np.float32)),
        group_index=torch.tensor([dense[g] for g in batch.group_ids], dtype=torch.int64),
        lengths=torch.tensor(np.asarray(batch.lengths, dtype=np.int64)),
        temperatures=_temperatures(batch),
        logprobs_recorded=_recorded(batch, mask_t, logp[:, 1:]),
        advantages=None if batch.advantages is None
        else torch.tensor(np.asarray(batch.advantages, dtype=np.float32)),
        greedy=None if batch.temperatures is None
        else torch.tensor(np.asarray(batch.temperatures) == 0),
        extras={} if teacher is None
        else {"served_teacher_logprobs": torch.from_numpy(teacher[:, 1:].copy())},  # [B, T]
    )


def _temperatures(batch: TrainingBatch) -> torch.Tensor:
    """[B] float32; greedy rows (T = 0) report logprobs at T = 1, as the sampler does."""
    if batch.temperatures is None:
        return torch.ones(batch.num_sequences)
    t = torch.tensor(np.asarray(batch.temperatures, dtype=np.float32))
    return torch.where(t > 0, t, torch.ones_like(t))


def _recorded(batch: TrainingBatch, mask: np.ndarray, logp: np.ndarray) -> torch.Tensor:
    """[B] bool. Batches without the flags (older producers): a row all 0 on its mask has none."""
    if batch.logprobs_recorded is not None:
        return torch.tensor(np.asarray(batch.logprobs_recorded) > 0)
    return torch.tensor(np.abs(logp * mask).sum(-1) > 0)
