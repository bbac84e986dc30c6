"""StacxTrainer: batches in, optimizer steps, checkpoints, exported weights and WeightVersions out.

Per step (every rank): rank 0 reads a batch and broadcasts it; every role's `prepare_batch` runs on
the whole batch; roles then run in recipe order, each on its worker group's shard (whole prompt
groups per rank), and data syncs hand detached outputs to later roles; the summed loss of all
trainable roles is back-propagated once and each trainable model steps its optimizer.

Exactly once: a step that is exported is first checkpointed (weights, optimizers, step, consumed
offsets and the last published version, in one atomic directory), then its offsets are committed,
then its weights are exported and announced. A crash between the checkpoint and the announcement
is repaired on resume: the restored weights are exported and announced again, with the same
content hash. A version number therefore never carries two different contents, and a batch is
never trained twice.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from opentelemetry import metrics as otel_metrics

from stacx.producers.tracing import SECONDS_BUCKETS
from stacx.schemas.records import STEP_FIGURE_PREFIX, TrainingBatch, WeightVersion, export_dir_name
from stacx.trainer.backends import Backend, build_backend
from stacx.trainer.batch import (
    TensorBatch,
    check_greedy_rows,
    check_vocabulary,
    to_tensor_batch,
    validate_batch,
)
from stacx.trainer.checkpoint import CheckpointManager
from stacx.trainer.config import TrainerConfig
from stacx.trainer.distributed import place_groups
from stacx.trainer.errors import BatchValidationError, ConfigError
from stacx.trainer.export import content_hash, export_hf, prune_exports
from stacx.trainer.losses import Normaliser
from stacx.trainer.models import ModelConfig, build_model
from stacx.trainer.protocols import BatchSource, Positions, SourcedBatch, WeightPublisher
from stacx.trainer.publish import build_publisher
from stacx.trainer.ranks import spawn_trainer, spawns_ranks
from stacx.trainer.recipe import DataSync, ModelSlot, TrainingConfig, get_recipe, role_options_problems
from stacx.trainer.sources import build_source
from stacx.trainer.workers import ModelWorker, RoleWorker, build_optimizer

__all__ = ["StacxTrainer", "StepResult", "merge_metrics", "metrics_text", "run_rank", "step_figures"]

_meter = otel_metrics.get_meter("stacx.trainer")
_STEP_SECONDS = _meter.create_histogram("stacx.trainer.step_duration", unit="s",
                                        description="one optimizer step",
                                        explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
_TRAINED_TOKENS = _meter.create_counter("stacx.trainer.tokens", unit="{token}",
                                        description="tokens trained on")

log = logging.getLogger(__name__)

MAX_REMEMBERED_BATCH_IDS = 100_000


@dataclass(kw_only=True, slots=True)
class StepResult:
    """What one optimizer step did: `loss` of the global batch (summed over trainable roles),
    `metrics` merged over ranks (`merge_metrics`)."""

    step: int
    batch_id: str
    loss: float
    num_tokens: int
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    """Wall time of the step (forward, backward, optimizer)."""


class StacxTrainer:
    """Runs a recipe over a batch source on a backend; see the module docstring."""

    def __init__(self, config: TrainerConfig, *, source: BatchSource | None = None,
                 publisher: WeightPublisher | None = None, backend: Backend | None = None,
                 recipe: TrainingConfig | None = None,
                 on_step: Callable[[StepResult], None] | None = None) -> None:
        self.config = config
        self.on_step = on_step
        """Called on every rank after each step (after its export and checkpoint)."""
        self.backend = backend or build_backend(config.backend)
        torch.manual_seed(config.seed)
        np.random.seed(config.seed)
        self.recipe = recipe or get_recipe(config.recipe)
        self.recipe.validate()
        self.placement = place_groups(self.recipe.groups, self.backend.world_size)
        self.models = {s.name: self._build_worker(s) for s in self.recipe.models}
        self.roles = self._build_roles()
        self.vocab_size = self._vocab_size()
        """Smallest vocabulary of the recipe's token models (None: none reads token ids)."""
        self.is_leader = self.backend.rank == 0
        self.source = source if source is not None or not self.is_leader else self._kafka_source()
        self.publisher = publisher
        if publisher is None and self.is_leader:
            self.publisher = build_publisher(config.export, config.trainer_id)
        self.checkpoints = (CheckpointManager(config.checkpoint, self.backend)
                            if config.checkpoint.dir else None)
        self.step_count = 0
        self.num_rejected_batches = 0
        """Batches set aside by the last check before training (see `_reject`)."""
        self.positions: Positions = {}
        self.trained_batch_ids: list[str] = []
        self._trained_set: set[str] = set()
        self._last_checkpoint_step = 0
        self.published_version = 0
        """The last version whose announcement completed (0: none)."""
        self._checkpointed_positions: Positions = {}
        self._trace_context: Any = None
        if self.checkpoints is None:
            log.warning("checkpoint.dir is not set: consumer offsets will never be committed")
        elif config.checkpoint.resume:
            self._resume()

    @classmethod
    def from_config(cls, config: TrainerConfig, **kwargs: Any) -> StacxTrainer:
        """Build a trainer (its models, source and publisher) from a TrainerConfig."""
        return cls(config, **kwargs)

    @staticmethod
    def launch(config: TrainerConfig, max_steps: int | None = None,
               rank_setup: Callable[[], object] | None = None) -> None:
        """Run to completion: in this process, or spawned on `backend.world_size` local ranks.
        `rank_setup` (picklable) runs first in each spawned rank (the service's tracing set-up)."""
        if spawns_ranks(config.backend):
            spawn_trainer(config, max_steps, rank_setup)
        else:
            run_rank(config, max_steps)

    # ----------------------------------------------------------------------------- building

    def _model_config(self, slot: ModelSlot) -> ModelConfig:
        cfg = self.config.models.get(slot.name) or self.config.models.get(slot.init)
        if cfg is None:
            raise ConfigError(f"recipe {self.config.recipe!r} needs models.{slot.init} "
                              f"(weights of its {slot.name!r} model)")
        return cfg

    def _build_worker(self, slot: ModelSlot) -> ModelWorker:
        ranks = self.placement[slot.group]
        model = build_model(self._model_config(slot), slot.head) \
            if self.backend.rank in ranks else None
        if model is not None and not slot.trainable:
            model.requires_grad_(False).eval()
        module = self.backend.prepare_model(model, ranks)
        worker = ModelWorker(slot=slot, ranks=ranks, module=module)
        if module is not None and slot.trainable:
            module.train()
            worker.optimizer, worker.scheduler = build_optimizer(module, self.config.optimizer)
        return worker

    def _build_roles(self) -> list[RoleWorker]:
        problems = role_options_problems(self.recipe, self.config.recipe, self.config.role_options)
        if problems:
            raise ConfigError(problems)
        roles = []
        for role in self.recipe.roles:
            worker = RoleWorker(role=role, workers=[self.models[m] for m in role.models])
            worker.with_options(self.config.role_options.get(role.name, {}))
            roles.append(worker)
        groups = {r.role.name: r.group for r in roles}
        for r in roles:
            r.full_batch = any(groups[s.target] != r.group and s.source == r.role.name
                               and self.placement[r.group] != self.placement[groups[s.target]]
                               for s in self.recipe.syncs)
        return roles

    def _vocab_size(self) -> int | None:
        """The smallest `vocab_size` of any model on any rank (collective over all ranks)."""
        local = [int(v) for w in self.models.values() if w.module is not None
                 if (v := getattr(w.module.config, "vocab_size", None)) is not None]
        sizes = [v for part in self.backend.all_gather_object(local) for v in part]
        return min(sizes) if sizes else None

    def _kafka_source(self) -> BatchSource:
        return build_source(self.config.source)

    # ----------------------------------------------------------------------------- resume

    def _resume(self) -> None:
        assert self.checkpoints is not None
        state = self.checkpoints.load(list(self.models.values()))
        if state is None:
            return
        self.step_count = self._last_checkpoint_step = int(state["step"])
        self.positions = dict(state["positions"])
        self._checkpointed_positions = dict(self.positions)
        self.trained_batch_ids = list(state["trained_batch_ids"])
        self._trained_set = set(self.trained_batch_ids)
        # checkpoints written before exports followed checkpoints had published their own step;
        # the `published` marker says whether this step's announcement went out after it
        recorded = int(state.get("published_version", self.step_count))
        self.published_version = max(recorded, min(self.checkpoints.published(), self.step_count))
        if self.is_leader and self.source is not None and self.positions:
            self.source.seek(self.positions)
        log.info("resumed at step %d, positions %s", self.step_count, self.positions)

    def trainer_state(self) -> dict[str, Any]:
        """What a checkpoint stores besides tensors."""
        return {"step": self.step_count, "version": self.step_count, "positions": self.positions,
                "published_version": self.published_version,
                "trained_batch_ids": self.trained_batch_ids[-MAX_REMEMBERED_BATCH_IDS:],
                "recipe": self.config.recipe}

    # ----------------------------------------------------------------------------- the loop

    def run(self, max_steps: int | None = None) -> list[StepResult]:
        """Train until `max_steps` total steps (or config.max_steps), or the source runs dry."""
        limit = max_steps if max_steps is not None else self.config.max_steps
        results: list[StepResult] = []
        self.publish_pending()
        while limit is None or self.step_count < limit:
            kind, payload = self.backend.broadcast_object(self._next(), src=0)
            if kind == "stop":
                break
            if kind == "idle":
                continue
            record, position = payload
            if kind == "skip":
                self._advance(position)
                continue
            with self._step_span(record):
                results.append(self.train_step(record, position))
        self._final_checkpoint()
        return results

    def _next(self) -> tuple[str, Any]:
        """Rank 0's decision for the next iteration: train, skip (replayed or rejected), idle,
        stop."""
        if not self.is_leader:
            return ("idle", None)
        assert self.source is not None, "rank 0 needs a batch source"
        sourced = self.source.poll(self.config.source.poll_timeout_s)
        if sourced is None:
            return ("stop", None) if self.source.exhausted else ("idle", None)
        position = (sourced.position_key, sourced.offset + 1)
        self._trace_context = sourced.trace_context
        if sourced.batch.batch_id in self._trained_set:
            log.info("batch %s at %s@%d was already trained: skipped", sourced.batch.batch_id,
                     sourced.position_key, sourced.offset)
            return ("skip", (None, position))
        try:
            validate_batch(sourced.batch)
            if self.vocab_size is not None:
                check_vocabulary(sourced.batch, self.vocab_size)
            if self.recipe.needs_greedy_row:
                check_greedy_rows(sourced.batch)
        except BatchValidationError as exc:
            self._reject(sourced, exc)
            return ("skip", (None, position))
        return ("train", (sourced.batch, position))

    def _reject(self, sourced: SourcedBatch, error: BatchValidationError) -> None:
        """A batch the trainer cannot use never stops training: the source sets it aside (a dead
        letter on Kafka), it is counted, and its offset is committed with the next checkpoint."""
        assert self.source is not None
        self.num_rejected_batches += 1
        log.error("batch at %s@%d set aside: %s", sourced.position_key, sourced.offset, error)
        self.source.reject(sourced, error)

    def _step_span(self, record: TrainingBatch) -> Any:
        """On rank 0, a `trainer.step` span continuing the batch event's trace (WeightVersion
        events published inside it carry it on)."""
        if not self.is_leader:
            return contextlib.nullcontext()
        from opentelemetry import trace

        return trace.get_tracer("stacx.trainer").start_as_current_span(
            "trainer.step", context=self._trace_context,
            attributes={"stacx.batch_id": record.batch_id, "stacx.step": self.step_count + 1,
                        "stacx.recipe": self.config.recipe})

    def _advance(self, position: tuple[str, int] | None) -> None:
        if position is not None:
            self.positions[position[0]] = position[1]

    def train_step(self, record: TrainingBatch,
                   position: tuple[str, int] | None = None) -> StepResult:
        """One optimizer step on `record` (all ranks), then export/publish and checkpoint/commit."""
        started = time.perf_counter()
        full = to_tensor_batch(record)
        loss, metrics = self._forward_backward(full)
        metrics.update(self._optimizer_step())
        self.step_count += 1
        self._advance(position)
        self.trained_batch_ids.append(record.batch_id)
        self._trained_set.add(record.batch_id)
        result = StepResult(step=self.step_count, batch_id=record.batch_id, loss=loss,
                            num_tokens=full.num_tokens, metrics=metrics,
                            seconds=time.perf_counter() - started)
        if self.is_leader:
            log.info("step %d batch %s loss %.5f tokens %d%s", result.step, record.batch_id, loss,
                     result.num_tokens, metrics_text(metrics))
            _STEP_SECONDS.record(time.perf_counter() - started, {"recipe": self.config.recipe})
            _TRAINED_TOKENS.add(result.num_tokens, {"recipe": self.config.recipe})
        exporting = self._export_due()
        if self.checkpoints is not None and (exporting or self._checkpoint_due()):
            self._checkpoint()  # covers the version about to be announced
        if exporting:
            self._export(record.batch_id, step_figures(result))
        if self.on_step is not None:
            self.on_step(result)
        return result

    # ----------------------------------------------------------------------------- one step

    def _rows(self, full: TensorBatch, group: str, whole: bool) -> torch.Tensor | None:
        """Sequence rows this rank computes for `group` (None: not a member): whole prompt groups
        per rank, or every row when the group's ranks replicate the step (`_replicated`)."""
        ranks = self.placement[group]
        if self.backend.rank not in ranks:
            return None
        if whole or self._replicated(full, group):
            return torch.arange(full.num_sequences)
        n, i = len(ranks), ranks.index(self.backend.rank)
        return torch.nonzero(full.group_index % n == i).squeeze(-1)

    def _replicated(self, full: TensorBatch, group: str) -> bool:
        """Every rank of `group` computes the whole batch: one rank, or fewer prompt groups than
        ranks. Losses built from groups (advantages of learned scores, preference pairs) need
        whole groups, and a rank cannot run a model on zero rows; each rank then computes the
        one-process loss and FSDP's gradient mean over identical gradients is that gradient."""
        num_ranks = len(self.placement[group])
        return num_ranks == 1 or int(full.group_index.max().item()) + 1 < num_ranks

    def forward_backward(self, record: TrainingBatch) -> tuple[float, dict[str, float]]:
        """Forward and backward passes of one step on `record` (all ranks), without the optimizer
        step: gradients are left on the trainable models. Returns (global loss, metrics)."""
        return self._forward_backward(to_tensor_batch(record))

    def _forward_backward(self, full: TensorBatch) -> tuple[float, dict[str, float]]:
        for rw in self.roles:
            full = rw.specialization.prepare_batch(full)
        synced: dict[str, dict[str, torch.Tensor]] = {}
        bases: dict[tuple[str, bool], TensorBatch] = {}
        losses: list[torch.Tensor] = []
        reported = 0.0
        metrics: dict[str, float] = {}
        device = self.backend.device
        for rw in self.roles:
            rows = self._rows(full, rw.group, rw.full_batch)
            outputs: dict[str, torch.Tensor] = {}
            if rows is not None:
                key = (rw.group, rw.full_batch)
                if key not in bases:
                    bases[key] = full.select(rows).to(device)
                extras = {f: t[rows.to(t.device)].to(device)
                          for f, t in synced.get(rw.role.name, {}).items()}
                whole = rw.full_batch or self._replicated(full, rw.group)
                batch = bases[key].with_extras(**extras).with_normaliser(
                    self._normaliser(rw, bases[key], whole))
                with self.backend.autocast():
                    outputs, loss, role_metrics = rw.run(batch)
                if loss is not None:
                    losses.append(loss)
                    reported += loss.item() * self._report_weight(rw, whole)
                    metrics.update({f"{rw.role.name}/{k}": v for k, v in role_metrics.items()})
            for sync in (s for s in self.recipe.syncs if s.source == rw.role.name):
                value = self._sync(rw, sync, outputs, rows, full.num_sequences)
                if value is not None:
                    synced.setdefault(sync.target, {})[sync.field] = value
        if losses:
            torch.stack(losses).sum().backward()
        for worker in self.models.values():
            worker.reset()
        total = self.backend.all_reduce_sum(torch.tensor([reported], dtype=torch.float64))
        return float(total[0]), merge_metrics(self.backend.all_gather_object(metrics))

    def _normaliser(self, rw: RoleWorker, batch: TensorBatch, whole: bool) -> Normaliser | None:
        """Global denominators of a trainable role: its ranks' token and sequence counts summed.

        A role computing the whole batch on each of its ranks (`whole`) needs no sum."""
        if not rw.trainable:
            return None
        mask = batch.loss_mask
        counts = torch.stack([mask.sum(), (mask.sum(-1) > 0).sum()]).to(torch.float64).cpu()
        dp = 1 if whole else len(rw.ranks)
        if dp == 1:
            return Normaliser(num_tokens=float(counts[0]), num_sequences=float(counts[1]))
        ranks = rw.ranks
        counts = self.backend.all_reduce_sum(counts, ranks=ranks)
        return Normaliser(num_tokens=float(counts[0]), num_sequences=float(counts[1]),
                          dp_size=dp,
                          all_reduce=lambda t: self.backend.all_reduce_sum(t, ranks=ranks))

    def _report_weight(self, rw: RoleWorker, whole: bool) -> float:
        """Share of this rank's loss in the reported global loss (the sum over ranks)."""
        if whole:
            return 1.0 if self.backend.rank == rw.ranks[0] else 0.0
        return 1.0 / len(rw.ranks)

    def _sync(self, rw: RoleWorker, sync: DataSync, outputs: dict[str, torch.Tensor],
              rows: torch.Tensor | None, num_sequences: int) -> torch.Tensor | None:
        """Full-batch-sized detached copy of a role output for the sync's target role."""
        if rw.full_batch:
            src = rw.ranks[0]
            local = outputs[sync.output].detach().cpu() if self.backend.rank == src else None
            return self.backend.broadcast_object(local, src=src)  # type: ignore[no-any-return]
        if rows is None:
            return None
        value = outputs[sync.output].detach()
        buf = torch.zeros((num_sequences, *value.shape[1:]), dtype=value.dtype, device=value.device)
        buf[rows.to(value.device)] = value
        return buf

    def _optimizer_step(self) -> dict[str, float]:
        """Steps every optimizer (clipping the global gradient norm when configured); returns
        `<model>/grad_norm`, the norm before clipping, and `<model>/lr`, the learning rate of
        this step, of each trained model."""
        max_norm = self.config.optimizer.max_grad_norm
        norms: dict[str, float] = {}
        for name, worker in self.models.items():
            if worker.optimizer is None or worker.module is None:
                continue
            grads = [p.grad for p in worker.module.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads)
            if max_norm is not None:
                torch.nn.utils.clip_grads_with_norm_(worker.module.parameters(), max_norm, norm)
            if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2: every rank takes part
                norm = norm.full_tensor()
            norms[f"{name}/grad_norm"] = float(norm)
            norms[f"{name}/lr"] = float(worker.optimizer.param_groups[0]["lr"])
            worker.optimizer.step()
            worker.scheduler.step()
            worker.optimizer.zero_grad(set_to_none=True)
        return norms

    # ----------------------------------------------------------------------------- outputs

    def _export_due(self) -> bool:
        cfg = self.config.export
        return cfg.dir is not None and self.step_count > 0 and self.step_count % cfg.every_steps == 0

    def _checkpoint_due(self) -> bool:
        return self.checkpoints is not None and \
            self.step_count % self.config.checkpoint.every_steps == 0

    def publish_pending(self) -> None:
        """After a resume: announce the checkpointed version whose announcement the crash cut off
        (its export is rewritten from the restored weights: same contents, same hash)."""
        if self._export_due() and self.published_version < self.step_count:
            log.info("announcing v%d again: the previous run stopped between its checkpoint and "
                     "its announcement", self.step_count)
            last = self.trained_batch_ids[-1] if self.trained_batch_ids else ""
            self._export(last)

    def _export(self, batch_id: str, figures: dict[str, str] | None = None) -> None:
        worker = self.models[self.recipe.publish]
        if 0 not in worker.ranks:
            raise ConfigError(f"the published slot {worker.slot.name!r} must include rank 0")
        state = self.backend.full_state_dict(worker.module) if worker.module is not None else {}
        if self.is_leader:
            self._write_and_publish(worker, state, batch_id, figures or {})
            if self.checkpoints is not None:
                self.checkpoints.mark_published(self.step_count)
        self.published_version = self.step_count
        self.backend.barrier()

    def _write_and_publish(self, worker: ModelWorker, state: dict[str, torch.Tensor],
                           batch_id: str, figures: dict[str, str]) -> None:
        cfg = self.config.export
        assert cfg.dir is not None and worker.module is not None
        root = Path(cfg.dir) / cfg.model_name
        model_cfg = self._model_config(worker.slot)
        path = export_hf(state, worker.module.config, root / export_dir_name(self.step_count),
                         tokenizer_dir=model_cfg.path)
        prune_exports(root, cfg.keep_last)
        if self.publisher is not None:
            self.publisher.publish(WeightVersion(
                model_name=cfg.model_name, version=self.step_count, path=str(path.resolve()),
                step=self.step_count, trainer_id=self.config.trainer_id,
                content_hash=content_hash(state),
                metadata={**figures, "recipe": self.config.recipe, "batch_id": batch_id}))

    def _checkpoint(self) -> None:
        assert self.checkpoints is not None
        self.checkpoints.save(self.step_count, list(self.models.values()), self.trainer_state())
        self._last_checkpoint_step = self.step_count
        self._checkpointed_positions = dict(self.positions)
        if self.is_leader and self.source is not None and self.positions:
            self.source.commit(dict(self.positions))

    def _final_checkpoint(self) -> None:
        behind = self.step_count > self._last_checkpoint_step or \
            self.positions != self._checkpointed_positions  # e.g. only replays were skipped
        if self.checkpoints is not None and behind:
            self._checkpoint()

    def close(self, *, graceful: bool = True) -> None:
        """Close the source and publisher and leave the process group. Not `graceful` (the run
        was interrupted or failed): no collective runs, since the other ranks may never meet it."""
        if self.source is not None:
            self.source.close()
        if self.publisher is not None:
            self.publisher.close()
        self.backend.close(graceful=graceful)

    def __enter__(self) -> StacxTrainer:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(graceful=exc_type is None)


def metrics_text(metrics: dict[str, float]) -> str:
    """The step's recipe metrics as ` role/name=value ...` (sorted; empty when there are none),
    so that a recipe's own metrics reach the trainer's log with every step."""
    return "".join(f" {key}={value:.6g}" for key, value in sorted(metrics.items()))


def step_figures(result: StepResult) -> dict[str, str]:
    """The step's loss, tokens, time and merged metrics as WeightVersion metadata
    (`stacx.schemas.records.STEP_FIGURE_PREFIX`)."""
    figures = {"loss": result.loss, "num_tokens": float(result.num_tokens), "seconds": result.seconds,
               **result.metrics}
    return {STEP_FIGURE_PREFIX + name: repr(float(value)) for name, value in figures.items()}


def merge_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One view of every rank's metrics: `*_max` keys take the max, `*_min` the min, others the
    mean over the ranks that report them."""
    values: dict[str, list[float]] = {}
    for metrics in per_rank:
        for key, value in metrics.items():
            values.setdefault(key, []).append(value)
    merged = {}
    for key, vs in values.items():
        merged[key] = max(vs) if key.endswith("_max") else min(vs) if key.endswith("_min") \
            else sum(vs) / len(vs)
    return merged


def run_rank(config: TrainerConfig, max_steps: int | None,
             rank_setup: Callable[[], object] | None = None) -> None:
    """One trainer run to completion (`stacx.trainer.ranks.TRAINER_RANK`: what each spawned rank runs)."""
    if rank_setup is not None:
        rank_setup()
    with StacxTrainer.from_config(config) as trainer:
        trainer.run(max_steps)
