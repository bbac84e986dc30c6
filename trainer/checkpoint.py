"""Resumable checkpoints with torch.distributed.checkpoint.

Layout: `<dir>/step_<N>/` holds the DCP shards of every trainable model and optimizer, one
`rank_<r>.pt` per rank (RNG states, LR schedulers) and `trainer_state.json` (step, policy version,
consumer positions, trained batch ids). A checkpoint is written to `step_<N>.tmp` and renamed;
`<dir>/latest` names the newest complete one. `<dir>/published` holds the last version whose
announcement completed (written after it, atomically), so a resumed trainer does not announce
that version a second time.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from stacx.trainer.backends.base import Backend
from stacx.trainer.config import CheckpointConfig
from stacx.trainer.errors import CheckpointError
from stacx.trainer.workers import ModelWorker

__all__ = ["CheckpointManager"]


def _rng_state(use_cuda: bool) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if use_cuda:
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
    """Saves and restores models, optimizers, schedulers, RNG and trainer state on all ranks."""

    def __init__(self, config: CheckpointConfig, backend: Backend) -> None:
        if config.dir is None:
            raise CheckpointError("checkpoint.dir is not set")
        if config.every_steps < 1:
            raise CheckpointError(f"checkpoint.every_steps={config.every_steps}: must be >= 1")
        self.config = config
        self.root = Path(config.dir)
        self.backend = backend

    def _local(self, workers: list[ModelWorker]) -> list[ModelWorker]:
        return [w for w in workers if w.trainable and w.module is not None]

    def _dcp_state(self, workers: list[ModelWorker]) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for w in self._local(workers):
            assert w.module is not None
            model_sd, optim_sd = get_state_dict(w.module, w.optimizer)
            state[f"model.{w.slot.name}"] = model_sd
            state[f"optim.{w.slot.name}"] = optim_sd
        return state

    def latest(self) -> Path | None:
        marker = self.root / "latest"
        if not marker.is_file():
            return None
        path = self.root / marker.read_text().strip()
        return path if path.is_dir() else None

    def save(self, step: int, workers: list[ModelWorker], trainer_state: dict[str, Any]) -> Path:
        """Write checkpoint `step` atomically (collective); returns its directory."""
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f"step_{step:08d}.tmp"
        if self.backend.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.backend.barrier()
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.save(self._dcp_state(workers), checkpoint_id=str(tmp))
            extras = {"rng": _rng_state(self.backend.use_cuda),
                      "schedulers": {w.slot.name: w.scheduler.state_dict()
                                     for w in self._local(workers)}}
            torch.save(extras, tmp / f"rank_{self.backend.rank}.pt")
        except Exception as exc:
            raise CheckpointError(f"writing checkpoint {tmp} failed: {exc}") from exc
        self.backend.barrier()
        if self.backend.rank == 0:
            (tmp / "trainer_state.json").write_text(json.dumps(trainer_state))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            marker_tmp = self.root / "latest.tmp"
            marker_tmp.write_text(final.name)
            os.replace(marker_tmp, self.root / "latest")
            self._prune()
        self.backend.barrier()
        return final

    def mark_published(self, version: int) -> None:
        """Record (rank 0) that `version` was announced."""
        if self.backend.rank != 0:
            return
        tmp = self.root / "published.tmp"
        tmp.write_text(str(version))
        os.replace(tmp, self.root / "published")

    def published(self) -> int:
        """The last version recorded by `mark_published` (0: none)."""
        try:
            return int((self.root / "published").read_text().strip())
        except (OSError, ValueError):
            return 0

    def _prune(self) -> None:
        done = sorted(p for p in self.root.glob("step_*") if p.is_dir() and p.suffix != ".tmp")
        for old in done[:-self.config.keep_last] if self.config.keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)

    def load(self, workers: list[ModelWorker], path: Path | None = None) -> dict[str, Any] | None:
        """Restore the latest (or given) checkpoint; returns its trainer state, None if none."""
        path = path or self.latest()
        if path is None:
            return None
        state = self._dcp_state(workers)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(state, checkpoint_id=str(path))
            extras = torch.load(path / f"rank_{self.backend.rank}.pt", weights_only=False)
        except Exception as exc:
            raise CheckpointError(f"reading checkpoint {path} failed: {exc}; delete it or set "
                                  "checkpoint.resume: false") from exc
        for w in self._local(workers):
            assert w.module is not None
            set_state_dict(w.module, w.optimizer, model_state_dict=state[f"model.{w.slot.name}"],
                           optim_state_dict=state[f"optim.{w.slot.name}"])
            w.scheduler.load_state_dict(extras["schedulers"][w.slot.name])
        _set_rng_state(extras["rng"])
        trainer_state: dict[str, Any] = json.loads((path / "trainer_state.json").read_text())
        return trainer_state
