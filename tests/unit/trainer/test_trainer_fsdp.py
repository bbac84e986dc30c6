"""FSDP2 on 2 CPU processes (gloo) matches the single-process step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer import BackendConfig
from trainer.distributed import place_groups, spawn
from trainer.testing import run_jobs, run_steps, synthetic_batches, tiny_trainer_config


def test_group_placement() -> None:
    assert place_groups({"main": 0}, 2) == {"main": [0, 1]}
    assert place_groups({"actor": 0, "reference": 1}, 2) == {"actor": [0], "reference": [1]}
    assert place_groups({"actor": 0, "reference": 1}, 3) == {"actor": [0, 1], "reference": [2]}
    assert place_groups({"actor": 0, "reference": 1}, 1) == {"actor": [0], "reference": [0]}


def test_fsdp2_step_equals_single_process_step(tmp_path: Path) -> None:
    """grpo (reference colocated, FSDP over both ranks) and dpo_distributed (policy on rank 0,
    reference on rank 1, logprobs broadcast): both equal one single-process step."""
    # equal-length sequences and whole groups per rank: the sharded mean equals the full mean
    batches = synthetic_batches(1, num_groups=2, group_size=2, ragged=False)
    recipes = ["grpo", "dpo_distributed"]
    for recipe in recipes:
        run_steps(tiny_trainer_config(recipe, tmp_path / f"single-{recipe}"), batches, 1,
                  str(tmp_path / f"single-{recipe}.json"))
    backend = BackendConfig(kind="fsdp2", world_size=2, device="cpu")
    jobs = [(tiny_trainer_config(recipe, tmp_path / f"fsdp-{recipe}", backend=backend), batches,
             1, str(tmp_path / f"fsdp-{recipe}.json")) for recipe in recipes]
    spawn(run_jobs, 2, jobs)
    for recipe in recipes:
        loss_single = json.loads((tmp_path / f"single-{recipe}.json").read_text())
        loss_fsdp = json.loads((tmp_path / f"fsdp-{recipe}.json").read_text())
        assert loss_fsdp == pytest.approx(loss_single, rel=1e-5, abs=1e-6), recipe
        exported = "export/policy/v00000001/model.safetensors"
        a = load_file(str(tmp_path / f"single-{recipe}" / exported))
        b = load_file(str(tmp_path / f"fsdp-{recipe}" / exported))
        assert a.keys() == b.keys()
        for key in a:
            assert torch.allclose(a[key], b[key], atol=2e-6), f"{recipe}: {key}"
