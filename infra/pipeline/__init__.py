"""The end-to-end pipeline orchestrator behind `stacx quickstart` and `stacx run CONFIG.yaml`.

from stacx.infra.pipeline import load_spec, run_pipeline
report = run_pipeline(load_spec("examples/quickstart.yaml"))
"""

from stacx.infra.pipeline.config import PipelineConfig, PipelineSpec, load_spec, parse_spec
from stacx.infra.pipeline.errors import (
    MissingComponentError,
    PipelineConfigError,
    PipelineError,
    ServiceError,
)
from stacx.infra.pipeline.orchestrator import Pipeline, run_pipeline

__all__ = [
    "MissingComponentError",
    "Pipeline",
    "PipelineConfig",
    "PipelineConfigError",
    "PipelineError",
    "PipelineSpec",
    "ServiceError",
    "load_spec",
    "parse_spec",
    "run_pipeline",
]
