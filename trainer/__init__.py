"""STACX trainer: declarative recipes on FSDP2 or single-process backends.

Public names are imported lazily (PEP 562), so `import stacx.trainer.config` (and the rank launcher,
`stacx.trainer.ranks`) stays free of torch.

    from stacx.trainer import StacxTrainer, TrainerConfig, InMemoryBatchSource
    trainer = StacxTrainer.from_config(config, source=InMemoryBatchSource(batches))
    trainer.run(max_steps=10)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stacx.schemas.lazy import lazy_attributes

if TYPE_CHECKING:  # the real types for mypy; at run time `__getattr__` imports them on first use
    from stacx.trainer.batch import TensorBatch, to_tensor_batch, validate_batch
    from stacx.trainer.config import (
        BackendConfig,
        CheckpointConfig,
        ExportConfig,
        OptimizerConfig,
        SourceConfig,
        TrainerConfig,
        load_config,
    )
    from stacx.trainer.engine import StacxTrainer, StepResult
    from stacx.trainer.errors import (
        BatchValidationError,
        CheckpointError,
        ConfigError,
        RecipeError,
        SourceError,
        TrainerError,
    )
    from stacx.trainer.model_config import ModelConfig
    from stacx.trainer.protocols import BatchSource, ModelOutput, Specialization, WeightPublisher
    from stacx.trainer.publish import InMemoryWeightPublisher, KafkaWeightPublisher
    from stacx.trainer.recipe import (
        DataSync,
        ModelSlot,
        Role,
        TrainingConfig,
        get_recipe,
        list_recipes,
        recipe,
    )
    from stacx.trainer.sources import InMemoryBatchSource, KafkaBatchSource

__all__ = [
    "BackendConfig",
    "BatchSource",
    "BatchValidationError",
    "CheckpointConfig",
    "CheckpointError",
    "ConfigError",
    "DataSync",
    "ExportConfig",
    "InMemoryBatchSource",
    "InMemoryWeightPublisher",
    "KafkaBatchSource",
    "KafkaWeightPublisher",
    "ModelConfig",
    "ModelOutput",
    "ModelSlot",
    "OptimizerConfig",
    "RecipeError",
    "Role",
    "SourceConfig",
    "SourceError",
    "Specialization",
    "StacxTrainer",
    "StepResult",
    "TensorBatch",
    "TrainerConfig",
    "TrainerError",
    "TrainingConfig",
    "WeightPublisher",
    "get_recipe",
    "list_recipes",
    "load_config",
    "recipe",
    "to_tensor_batch",
    "validate_batch",
]

_HOMES = {
    "BackendConfig": "stacx.trainer.config",
    "BatchSource": "stacx.trainer.protocols",
    "BatchValidationError": "stacx.trainer.errors",
    "CheckpointConfig": "stacx.trainer.config",
    "CheckpointError": "stacx.trainer.errors",
    "ConfigError": "stacx.trainer.errors",
    "DataSync": "stacx.trainer.recipe",
    "ExportConfig": "stacx.trainer.config",
    "InMemoryBatchSource": "stacx.trainer.sources",
    "InMemoryWeightPublisher": "stacx.trainer.publish",
    "KafkaBatchSource": "stacx.trainer.sources",
    "KafkaWeightPublisher": "stacx.trainer.publish",
    "ModelConfig": "stacx.trainer.model_config",
    "ModelOutput": "stacx.trainer.protocols",
    "ModelSlot": "stacx.trainer.recipe",
    "OptimizerConfig": "stacx.trainer.config",
    "RecipeError": "stacx.trainer.errors",
    "Role": "stacx.trainer.recipe",
    "SourceConfig": "stacx.trainer.config",
    "SourceError": "stacx.trainer.errors",
    "Specialization": "stacx.trainer.protocols",
    "StacxTrainer": "stacx.trainer.engine",
    "StepResult": "stacx.trainer.engine",
    "TensorBatch": "stacx.trainer.batch",
    "TrainerConfig": "stacx.trainer.config",
    "TrainerError": "stacx.trainer.errors",
    "TrainingConfig": "stacx.trainer.recipe",
    "WeightPublisher": "stacx.trainer.protocols",
    "get_recipe": "stacx.trainer.recipe",
    "list_recipes": "stacx.trainer.recipe",
    "load_config": "stacx.trainer.config",
    "recipe": "stacx.trainer.recipe",
    "to_tensor_batch": "stacx.trainer.batch",
    "validate_batch": "stacx.trainer.batch",
}


__getattr__ = lazy_attributes(__name__, _HOMES)
