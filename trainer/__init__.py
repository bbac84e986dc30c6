"""STACX trainer: declarative recipes on FSDP2 or single-process backends.

    from trainer import StacxTrainer, TrainerConfig, InMemoryBatchSource
    trainer = StacxTrainer.from_config(config, source=InMemoryBatchSource(batches))
    trainer.run(max_steps=10)
"""

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
from trainer.models import ModelConfig
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
