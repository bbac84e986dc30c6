"""TrainingBatch (packed numpy arrays) -> validated, padded tensors aligned to targets.

Shape legend: B sequences, L padded sequence length, T = L - 1 target positions.
Position t of a `[B, T]` tensor describes token t + 1 (the token predicted from position t).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from schemas.records import TrainingBatch
from trainer.errors import BatchValidationError

__all__ = ["TensorBatch", "to_tensor_batch", "validate_batch"]


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
    advantages: torch.Tensor | None = None
    """[B] float32 precomputed advantages, when the batch carries them."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """Derived or synced tensors (e.g. `ref_logprobs` [B, T], `values` [B, T])."""

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
            advantages=None if self.advantages is None else self.advantages[index],
            extras={k: v[index] for k, v in self.extras.items()},
        )

    def with_extras(self, **tensors: torch.Tensor) -> TensorBatch:
        return replace(self, extras={**self.extras, **tensors})

    def to(self, device: torch.device) -> TensorBatch:
        return replace(
            self,
            input_ids=self.input_ids.to(device), attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device), old_logprobs=self.old_logprobs.to(device),
            rewards=self.rewards.to(device), group_index=self.group_index.to(device),
            lengths=self.lengths.to(device),
            advantages=None if self.advantages is None else self.advantages.to(device),
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
    if batch.advantages is not None and len(batch.advantages) != n:
        raise _fail(batch, f"len(advantages)={len(batch.advantages)} but there are {n} sequences")
    size = len(batch.token_ids)
    for name in ("loss_mask", "logprobs"):
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
    if not np.isfinite(batch.rewards).all() or not np.isfinite(batch.logprobs).all():
        raise _fail(batch, "rewards or logprobs contain NaN/inf")


def to_tensor_batch(batch: TrainingBatch) -> TensorBatch:
    """Validate and unpack into right-padded [B, L] / target-aligned [B, T] tensors."""
    validate_batch(batch)
    n, max_len = batch.num_sequences, int(np.max(batch.lengths))
    ids = np.zeros((n, max_len), dtype=np.int64)
    attn = np.zeros((n, max_len), dtype=np.int64)
    mask = np.zeros((n, max_len), dtype=np.float32)
    logp = np.zeros((n, max_len), dtype=np.float32)
    for i, (off, length) in enumerate(zip(batch.offsets, batch.lengths, strict=True)):
        sl = slice(int(off), int(off) + int(length))
        ids[i, :length] = batch.token_ids[sl]
        attn[i, :length] = 1
        mask[i, :length] = batch.loss_mask[sl]
        logp[i, :length] = batch.logprobs[sl]
    dense = {g: i for i, g in enumerate(dict.fromkeys(batch.group_ids))}
    return TensorBatch(
        batch_id=batch.batch_id,
        input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(attn),
        loss_mask=torch.from_numpy(mask[:, 1:].copy()),
        old_logprobs=torch.from_numpy(logp[:, 1:].copy()),
        rewards=torch.tensor(np.asarray(batch.rewards, dtype=np.float32)),
        group_index=torch.tensor([dense[g] for g in batch.group_ids], dtype=torch.int64),
        lengths=torch.tensor(np.asarray(batch.lengths, dtype=np.int64)),
        advantages=None if batch.advantages is None
        else torch.tensor(np.asarray(batch.advantages, dtype=np.float32)),
    )
