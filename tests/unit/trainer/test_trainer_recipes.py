"""Every shipped recipe trains tiny models: all trainable parameters move, losses stay finite."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from stacx.schemas.records import TrainingBatch
from stacx.trainer import (
    InMemoryBatchSource,
    RecipeError,
    StacxTrainer,
    get_recipe,
    list_recipes,
    to_tensor_batch,
)
from stacx.trainer.flow import point_batch
from stacx.trainer.losses import token_logprobs
from stacx.trainer.testing import synthetic_batches, tiny_trainer_config

SHIPPED = ["sft", "grpo", "ppo", "dpo", "reinforce_pp", "rloo", "ppo_colocated",
           "dpo_distributed", "online_reward", "opd", "gspo", "dr_grpo", "dapo", "cispo", "remax",
           "kto", "simpo", "orpo", "reward_bt", "prm", "grpo_rm", "dagger", "aggrevate",
           "diffusion_rwfm", "diffusion_dpo", "opd_served"]


def point_batches(count: int) -> list[TrainingBatch]:
    """Flow recipes train on 2-D points: pairs of scored samples."""
    gen = torch.Generator().manual_seed(0)
    return [point_batch(f"points-{i}", torch.randn(8, 2, generator=gen),
                        torch.rand(8, generator=gen), group_size=2) for i in range(count)]


BATCHES: dict[str, Callable[[int], list[TrainingBatch]]] = {
    # ReMax needs a greedy baseline row per group
    "remax": lambda n: synthetic_batches(n, greedy_first=True),
    "diffusion_rwfm": point_batches,
    "diffusion_dpo": point_batches,
    "opd_served": lambda n: synthetic_batches(n, teacher_logprobs=True),
}


def test_every_shipped_recipe_is_registered_and_valid() -> None:
    names = dict(list_recipes())
    assert set(SHIPPED) <= set(names), sorted(set(SHIPPED) - set(names))
    assert len(names) >= 22
    errors = []
    for name in names:
        try:
            config = get_recipe(name)
            assert config.description, f"{name} has no description"
        except (RecipeError, AssertionError) as exc:
            errors.append(f"{name}: {exc}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("name", [name for name, _ in list_recipes()])
def test_recipe_trains_every_parameter(name: str) -> None:
    torch.set_num_threads(1)
    batches = BATCHES.get(name, synthetic_batches)(2)
    trainer = StacxTrainer(tiny_trainer_config(name), source=InMemoryBatchSource(batches))
    trainable = {f"{w.slot.name}.{n}": p.detach().clone()
                 for w in trainer.models.values() if w.trainable and w.module is not None
                 for n, p in w.module.named_parameters()}
    frozen = {f"{w.slot.name}.{n}": p.detach().clone()
              for w in trainer.models.values() if not w.trainable and w.module is not None
              for n, p in w.module.named_parameters()}
    results = trainer.run(2)
    assert [r.step for r in results] == [1, 2]
    assert all(math.isfinite(r.loss) for r in results)
    after = {f"{w.slot.name}.{n}": p.detach()
             for w in trainer.models.values() if w.module is not None
             for n, p in w.module.named_parameters()}
    unchanged = [k for k, before in trainable.items() if torch.equal(before, after[k])]
    assert not unchanged, f"{name}: parameters did not move: {unchanged}"
    moved_frozen = [k for k, before in frozen.items() if not torch.equal(before, after[k])]
    assert not moved_frozen, f"{name}: frozen parameters moved: {moved_frozen}"


def test_role_options_override_and_unknown_roles_fail() -> None:
    config = tiny_trainer_config("grpo", role_options={"policy": {"kl_beta": 0.5}})
    trainer = StacxTrainer(config, source=InMemoryBatchSource([]))
    policy = next(r for r in trainer.roles if r.role.name == "policy")
    assert policy.specialization.kl_beta == 0.5  # type: ignore[attr-defined]
    with pytest.raises(Exception, match=r"^role_options.critic: recipe 'grpo' has no role 'critic'"):
        StacxTrainer(tiny_trainer_config("grpo", role_options={"critic": {}}),
                     source=InMemoryBatchSource([]))


def test_opd_needs_a_teacher_model() -> None:
    config = tiny_trainer_config("opd")
    del config.models["teacher"]
    with pytest.raises(Exception, match="models.teacher"):
        StacxTrainer(config, source=InMemoryBatchSource([]))


def test_several_models_fill_one_role_as_an_ensemble() -> None:
    from dataclasses import dataclass

    from stacx.trainer import ModelConfig, ModelSlot
    from stacx.trainer.recipes.opd import OnPolicyDistill

    seen: dict[str, torch.Tensor] = {}

    @dataclass(kw_only=True, slots=True)
    class Capture(OnPolicyDistill):
        def compute_loss(self, outputs, batch):  # type: ignore[no-untyped-def]
            seen["teacher_logprobs"] = batch.extras["teacher_logprobs"]
            return OnPolicyDistill.compute_loss(self, outputs, batch)

    config = get_recipe("opd")
    config.models.append(ModelSlot(name="teacher_b", trainable=False, init="teacher_b"))
    config.roles[0].models = ("teacher", "teacher_b")
    config.roles[1].specialization = Capture()
    trainer_config = tiny_trainer_config("opd")
    trainer_config.models["teacher_b"] = ModelConfig(tiny={}, seed=11)
    batch = synthetic_batches(1)
    trainer = StacxTrainer(trainer_config, source=InMemoryBatchSource(batch), recipe=config)
    teachers = [trainer.models[n].module for n in ("teacher", "teacher_b")]
    tensors = to_tensor_batch(batch[0])
    with torch.no_grad():
        each = [_target_logprobs(m, tensors) for m in teachers]
    trainer.run(1)
    assert torch.allclose(seen["teacher_logprobs"], (each[0] + each[1]) / 2, atol=1e-6)
    assert not torch.allclose(each[0], each[1])


def _target_logprobs(model, batch):  # type: ignore[no-untyped-def]
    logits = model(batch.input_ids, batch.attention_mask).logits
    return token_logprobs(logits[:, :-1], batch.targets)
