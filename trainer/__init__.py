"""STACX trainer: declarative recipes on FSDP2 or single-process backends.

Public names are imported lazily (PEP 562), so `import trainer.config` (and the rank launcher,
`trainer.ranks`) stays free of torch.

    from trainer import StacxTrainer, TrainerConfig, InMemoryBatchSource
    trainer = StacxTrainer.from_config(config, source=InMemoryBatchSource(batches))
    trainer.run(max_steps=10)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.lazy import lazy_attributes

if TYPE_CHECKING:  # the real types for mypy; at run time `__getattr__` imports them on first use
    from trainer.batch import TensorBatch, to_tensor_batch, validate_batch
    from trainer.config import (
        BackendConfig,
        CheckpointConfig,
        ExportConfig,
        OptimizerConfig,
        SourceConfig,
        TrainerConfig,
        load_config,
    )
    from trainer.engine import StacxTrainer, StepResult
    from trainer.errors import (
        BatchValidationError,
        CheckpointError,
        ConfigError,
        RecipeError,
        SourceError,
        TrainerError,
    )
    from trainer.model_config import ModelConfig
    from trainer.protocols import BatchSource, ModelOutput, Specialization, WeightPublisher
    from trainer.publish import InMemoryWeightPublisher, KafkaWeightPublisher
    from trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, get_recipe, list_recipes, recipe
    from trainer.sources import InMemoryBatchSource, KafkaBatchSource

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
    "BackendConfig": "trainer.config",
    "BatchSource": "trainer.protocols",
    "BatchValidationError": "trainer.errors",
    "CheckpointConfig": "trainer.config",
    "CheckpointError": "trainer.errors",
    "ConfigError": "trainer.errors",
    "DataSync": "trainer.recipe",
    "ExportConfig": "trainer.config",
    "InMemoryBatchSource": "trainer.sources",
    "InMemoryWeightPublisher": "trainer.publish",
    "KafkaBatchSource": "trainer.sources",
    "KafkaWeightPublisher": "trainer.publish",
    "ModelConfig": "trainer.model_config",
    "ModelOutput": "trainer.protocols",
    "ModelSlot": "trainer.recipe",
    "OptimizerConfig": "trainer.config",
    "RecipeError": "trainer.errors",
    "Role": "trainer.recipe",
    "SourceConfig": "trainer.config",
    "SourceError": "trainer.errors",
    "Specialization": "trainer.protocols",
    "StacxTrainer": "trainer.engine",
    "StepResult": "trainer.engine",
    "TensorBatch": "trainer.batch",
    "TrainerConfig": "trainer.config",
    "TrainerError": "trainer.errors",
    "TrainingConfig": "trainer.recipe",
    "WeightPublisher": "trainer.protocols",
    "get_recipe": "trainer.recipe",
    "list_recipes": "trainer.recipe",
    "load_config": "trainer.config",
    "recipe": "trainer.recipe",
    "to_tensor_batch": "trainer.batch",
    "validate_batch": "trainer.batch",
}


__getattr__ = lazy_attributes(__name__, _HOMES)
