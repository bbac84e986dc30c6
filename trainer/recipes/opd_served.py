"""On-policy distillation from a served teacher: its logprobs arrive with the events."""

from __future__ import annotations

from dataclasses import dataclass

from stacx.trainer.batch import TensorBatch
from stacx.trainer.errors import RecipeError
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.opd import OnPolicyDistill


@dataclass(kw_only=True, slots=True)
class ServedTeacherDistill(OnPolicyDistill):
    """OPD's loss, agg(sg(pi - pi_teacher) * pi), with pi_teacher the logprobs the teacher's
    inference server gave for the student's tokens during the rollout (`TrainingBatch.
    teacher_logprobs`, rollout/teacher.py `mode: opd`): no teacher model in the trainer."""

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        served = batch.extras.get("served_teacher_logprobs")
        if served is None:
            raise RecipeError(f"opd_served: batch {batch.batch_id!r} has no teacher_logprobs; roll "
                              "out with a teacher in the loop in `opd` mode, or use recipe `opd` "
                              "(teacher model in the trainer)")
        return batch.with_extras(teacher_logprobs=served)  # [B, T]


@recipe("opd_served")
def opd_served() -> TrainingConfig:
    """On-policy distillation on teacher logprobs computed by the teacher's server (events)."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=ServedTeacherDistill())],
    )
