"""FSDP2 on 2 CPU processes (gloo) matches the single-process step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from stacx.schemas.records import TrainingBatch
from stacx.trainer import BackendConfig
from stacx.trainer.distributed import place_groups, spawn
from stacx.trainer.losses import AGGREGATIONS
from stacx.trainer.testing import (
    run_gradients,
    run_jobs,
    run_steps,
    synthetic_batch,
    synthetic_batches,
    tiny_trainer_config,
)


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


def test_fsdp2_on_one_rank_trains_in_the_calling_process_like_a_single_step(tmp_path: Path) -> None:
    """world_size 1 outside torchrun/spawn: a process group of this process alone (no RANK in
    the environment, nothing spawned), left again at the end; the step equals the single one."""
    assert "RANK" not in os.environ and not dist.is_initialized()
    batches = synthetic_batches(1, num_groups=2, group_size=2, ragged=False)
    run_steps(tiny_trainer_config("grpo", tmp_path / "single"), batches, 1, str(tmp_path / "single.json"))
    backend = BackendConfig(kind="fsdp2", world_size=1, device="cpu")
    run_steps(tiny_trainer_config("grpo", tmp_path / "fsdp", backend=backend), batches, 1,
              str(tmp_path / "fsdp.json"))
    assert not dist.is_initialized()
    single = json.loads((tmp_path / "single.json").read_text())
    assert json.loads((tmp_path / "fsdp.json").read_text()) == pytest.approx(single, rel=1e-5, abs=1e-6)


def _uneven_batch() -> TrainingBatch:
    """3 prompt groups of ragged samples on 2 ranks: rank 0 computes groups 0 and 2, rank 1 group
    1, so the shards differ in sequences and tokens; one row is fully masked (a failed sample)
    and the behaviour logprobs differ from the policy (ratios away from 1)."""
    batch = synthetic_batch(0, num_groups=3, group_size=2, response_length=9,
                            recorded_logprobs=True)
    start, length = int(batch.offsets[5]), int(batch.lengths[5])
    batch.loss_mask[start:start + length] = 0
    return batch


def test_fsdp2_loss_and_gradients_equal_one_process_for_every_aggregation(tmp_path: Path) -> None:
    """Global normalisation: each rank divides by the all-reduced token / sequence counts (and
    PPO / REINFORCE++ whiten with all-reduced statistics), so 2 ranks give the one-process loss
    and gradients on the same global batch, in every aggregation mode."""
    batch = _uneven_batch()
    options = [("grpo", {"aggregation": how, "max_tokens": 16, "kl_beta": 0.1})
               for how in AGGREGATIONS]
    options += [("reinforce_pp", {"aggregation": "seq-mean-token-sum"}),
                ("ppo", {"aggregation": "token-mean", "off_policy": "token-truncate"}),
                ("dpo", {})]  # 2 pairs on rank 0, 1 on rank 1
    backend = BackendConfig(kind="fsdp2", world_size=2, device="cpu")
    jobs = []
    for i, (recipe, opts) in enumerate(options):
        single = tiny_trainer_config(recipe, role_options={"policy": opts})
        run_gradients(single, batch, str(tmp_path / f"single{i}.pt"))
        sharded = tiny_trainer_config(recipe, role_options={"policy": opts}, backend=backend)
        jobs.append((sharded, [batch], 0, str(tmp_path / f"fsdp{i}.pt")))
    spawn(run_jobs, 2, jobs)
    for i, (recipe, opts) in enumerate(options):
        one, two = (torch.load(tmp_path / f"{kind}{i}.pt") for kind in ("single", "fsdp"))
        what = f"{recipe} {opts}"
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7), what
        assert one["grads"].keys() == two["grads"].keys() and one["grads"], what
        for key, grad in one["grads"].items():
            torch.testing.assert_close(two["grads"][key], grad, rtol=1e-4, atol=1e-7,
                                       msg=lambda m, k=key, w=what: f"{w} {k}: {m}")


def _compare_with_one_process(tmp_path: Path, cases: list[tuple[str, TrainingBatch]]) -> None:
    """One forward/backward of each (recipe, batch) in one process and on 2 gloo ranks: the same
    loss and the same full gradient of every trainable parameter."""
    backend = BackendConfig(kind="fsdp2", world_size=2, device="cpu")
    jobs = []
    for i, (recipe, batch) in enumerate(cases):
        run_gradients(tiny_trainer_config(recipe), batch, str(tmp_path / f"single{i}.pt"))
        jobs.append((tiny_trainer_config(recipe, backend=backend), [batch], 0,
                     str(tmp_path / f"fsdp{i}.pt")))
    spawn(run_jobs, 2, jobs)
    for i, (recipe, _) in enumerate(cases):
        one, two = (torch.load(tmp_path / f"{kind}{i}.pt") for kind in ("single", "fsdp"))
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7), recipe
        assert one["grads"].keys() == two["grads"].keys() and one["grads"], recipe
        for key, grad in one["grads"].items():
            torch.testing.assert_close(two["grads"][key], grad, rtol=1e-4, atol=1e-7,
                                       msg=lambda m, k=key, r=recipe: f"{r} {k}: {m}")


def test_online_reward_model_mse_is_the_global_mean_on_two_ranks(tmp_path: Path) -> None:
    """The reward model's regression loss divides by the sequences of the whole batch (counts
    all-reduced), not by each rank's: with 4 rows on rank 0 and 2 on rank 1, 2 ranks give the
    one-process loss and gradients of both the reward model and the policy."""
    _compare_with_one_process(tmp_path, [("online_reward", _uneven_batch())])


def test_fewer_groups_than_ranks_keep_whole_groups(tmp_path: Path) -> None:
    """One prompt group on 2 ranks: recipes that build advantages or preference pairs from
    groups see the whole group (never two half-groups), so 2 ranks equal one process."""
    from stacx.trainer.flow import point_batch

    one_group = synthetic_batch(0, num_groups=1, group_size=4, response_length=7,
                                recorded_logprobs=True)
    gen = torch.Generator().manual_seed(0)
    points = torch.randn(4, 2, generator=gen)
    flow = point_batch("one-group", points, -(points ** 2).sum(-1), group_size=4)
    recipes = ["grpo_rm", "online_reward", "dpo", "simpo", "orpo", "reward_bt"]
    _compare_with_one_process(tmp_path, [(r, one_group) for r in recipes]
                              + [("diffusion_dpo", flow)])


def test_activation_checkpointing_and_cpu_offload_leave_the_losses_unchanged(tmp_path: Path) -> None:
    """Both only trade memory for compute or transfers: 2 steps give the plain FSDP2 losses."""
    batches = synthetic_batches(2, num_groups=2, group_size=2, ragged=False)
    variants = {
        "plain": BackendConfig(kind="fsdp2", world_size=2, device="cpu"),
        "memory": BackendConfig(kind="fsdp2", world_size=2, device="cpu",
                                activation_checkpointing=True, cpu_offload=True),
    }
    jobs = [(tiny_trainer_config("grpo", tmp_path / name, backend=backend), batches, 2,
             str(tmp_path / f"{name}.json")) for name, backend in variants.items()]
    spawn(run_jobs, 2, jobs)
    plain = json.loads((tmp_path / "plain.json").read_text())
    memory = json.loads((tmp_path / "memory.json").read_text())
    assert len(plain) == 2 and memory == pytest.approx(plain, rel=1e-5, abs=1e-6)


def test_cpu_offload_needs_fsdp2() -> None:
    from stacx.trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="cpu_offload needs backend.kind: fsdp2"):
        BackendConfig(kind="single", cpu_offload=True)


def test_activation_checkpointing_turns_on_the_hf_models_gradient_checkpointing() -> None:
    from torch import nn
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from stacx.trainer.backends.base import checkpointed

    inner = Qwen2ForCausalLM(Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=32))
    wrapper = nn.ModuleDict({"model": inner})  # as the trainer's own wrapper holds it
    checkpointed(wrapper, BackendConfig(activation_checkpointing=False))
    assert not inner.is_gradient_checkpointing
    checkpointed(wrapper, BackendConfig(activation_checkpointing=True))
    assert inner.is_gradient_checkpointing
    with pytest.raises(ValueError, match="holds no Hugging Face model"):
        checkpointed(nn.Linear(2, 2), BackendConfig(activation_checkpointing=True))
