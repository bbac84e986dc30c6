"""The pipeline config: one YAML file (e.g. `examples/quickstart.yaml`) for the whole loop.

The `pipeline` section is the orchestrator's own (`PipelineConfig`). The `rollout`, `assembler`
and `trainer` sections are handed, completed with the run's paths, URLs and topic names, to each
service's own config loader, so every service still runs alone from the files the run writes
under `runs/<name>/config/`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.config import ConfigError, bootstrap_servers, load_yaml, section
from infra.pipeline.errors import PipelineConfigError
from infra.pipeline.services import RestartPolicy

__all__ = [
    "DemonstrationsConfig",
    "EvaluationConfig",
    "PipelineConfig",
    "PipelineSpec",
    "SFTConfig",
    "ServicesConfig",
    "TasksConfig",
    "TinyModelSpec",
    "load_spec",
    "parse_spec",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(kw_only=True, slots=True)
class TasksConfig:
    """The arithmetic task set (examples/quickstart/arithmetic.py)."""

    num_train: int = 4096
    """Distinct training problems (the rollout service cycles through them)."""
    num_heldout: int = 128
    """Held-out problems for the success rate (never trained on)."""
    seed: int = 0
    """Problem generator seed."""


@dataclass(kw_only=True, slots=True)
class DemonstrationsConfig:
    """Synthetic SFT demonstrations."""

    tool_fraction: float = 0.3
    """Share of demonstrations that call the Python tool (always correct): the mixture the
    warm-started policy ends up imitating, hence its initial tool-use rate."""
    mental_accuracy: float = 0.5
    """How often a direct ("mental") answer in a demonstration is right."""
    skill_tool_fraction: float = 0.9
    """Tool share during the first `sft.skill_steps` steps, where the tiny model learns the
    skill itself (copying the expression into the call and the tool output into the answer)."""


@dataclass(kw_only=True, slots=True)
class TinyModelSpec:
    """Shape of the tiny Qwen2 made by `rollout.models.make_tiny_model`."""

    hidden_size: int = 64
    """Residual width."""
    intermediate_size: int = 256
    """MLP width."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 4
    """Query heads."""
    num_key_value_heads: int = 2
    """Key/value heads."""
    seed: int = 0
    """Initialisation seed."""


@dataclass(kw_only=True, slots=True)
class SFTConfig:
    """Warm start with the trainer's `sft` recipe (single process, in-memory batches)."""

    steps: int = 450
    """Optimizer steps in total."""
    skill_steps: int = 400
    """The first steps, on `demonstrations.skill_tool_fraction`; the rest use `tool_fraction`."""
    batch_size: int = 64
    """Demonstrations per step."""
    lr: float = 3e-3
    """Learning rate of the skill steps (AdamW, linear warmup, then constant)."""
    mixture_lr: float = 1e-3
    """Learning rate of the final mixture steps (lower: resets the tool-use habit without
    unlearning the copy skill; at 3e-3 the forced-tool success fell from 0.97 to 0.73)."""
    warmup_steps: int = 20
    """Warmup steps."""
    seed: int = 1
    """Demonstration sampling seed."""


@dataclass(kw_only=True, slots=True)
class ServicesConfig:
    """Ports and sizes of the services the pipeline starts."""

    host: str = "127.0.0.1"
    """Interface every service binds to."""
    gateway_port: int = 8710
    """Sandbox gateway port (not the default 8700, so a gateway started by hand can stay)."""
    gateway_backend: str = "docker"
    """`docker` or `process`."""
    gateway_warm_pool: int = 0
    """Pre-started sandboxes."""
    inference_port: int = 30010
    """Built-in inference server port."""
    inference_threads: int = 1
    """torch threads of the inference server."""
    inference_max_batch_size: int = 64
    """Rows per decoding step of the inference server."""
    startup_timeout_s: float = 180.0
    """How long a service may take to become ready."""
    restarts: RestartPolicy = field(default_factory=RestartPolicy)
    """How a crashed service is restarted: backoff and a restart budget per service."""


@dataclass(kw_only=True, slots=True)
class EvaluationConfig:
    """Held-out evaluation through the real rollout path (server + sandbox), not published."""

    every_versions: int = 4
    """Evaluate after every this many policy versions (0: only before and after)."""
    num_problems: int = 64
    """Held-out problems in a periodic evaluation (the first ones of the held-out set)."""
    samples_per_problem: int = 1
    """Samples per problem (temperature as in the rollout config)."""
    final_samples_per_problem: int = 1
    """Samples per held-out problem before and after training (all `num_heldout` problems)."""


@dataclass(kw_only=True, slots=True)
class PipelineConfig:
    """The orchestrator's own settings (`pipeline:` section)."""

    name: str = "quickstart"
    """Run name: the results go to `<runs_dir>/<name>/`."""
    runs_dir: str = "runs"
    """Where runs are written."""
    steps: int = 20
    """GRPO policy versions to train (the trainer's max_steps)."""
    fresh_topics: bool = True
    """Per-run topic names (`stacx.trajectories.<run_id>`, ...); false: the standard topics."""
    timeout_s: float = 1800.0
    """Give up (and say where it stalled) after this long."""
    stall_timeout_s: float = 300.0
    """Stop with a diagnosis when no trajectory, batch or policy version appears for this long."""
    live: bool = True
    """Show the live rich view (off when stdout is not a terminal)."""
    tasks: TasksConfig = field(default_factory=TasksConfig)
    """Task set."""
    demonstrations: DemonstrationsConfig = field(default_factory=DemonstrationsConfig)
    """SFT demonstrations."""
    model: TinyModelSpec = field(default_factory=TinyModelSpec)
    """Tiny model shape."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """SFT warm start."""
    services: ServicesConfig = field(default_factory=ServicesConfig)
    """Service ports and sizes."""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """Held-out evaluation."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise PipelineConfigError(
                f"pipeline.name={self.name!r}: use letters, digits, '.', '_' or '-' (max 64)"
            )
        if self.steps < 1:
            raise PipelineConfigError(f"pipeline.steps={self.steps}: must be >= 1")
        if not self.stall_timeout_s > 0:
            raise PipelineConfigError(
                f"pipeline.stall_timeout_s={self.stall_timeout_s}: must be > 0 seconds (default 300)"
            )


@dataclass(kw_only=True, slots=True)
class PipelineSpec:
    """A whole pipeline file: the orchestrator's config plus each service's raw section."""

    source: str
    """Where it was read from (for messages)."""
    bootstrap_servers: str
    """Kafka bootstrap servers for every service."""
    pipeline: PipelineConfig
    """Orchestrator settings."""
    rollout: dict[str, Any]
    """`rollout.config.RolloutConfig` section (data, urls and topics are filled in per run)."""
    assembler: dict[str, Any]
    """`consumers.assembly.AssemblerApp.Config` section (topics filled in per run)."""
    trainer: dict[str, Any]
    """`trainer.TrainerConfig` section (models, topics, export dir filled in per run)."""


def parse_spec(tree: dict[str, Any], *, source: str = "config") -> PipelineSpec:
    """A `PipelineSpec` from an already-loaded YAML tree."""
    allowed = {"bootstrap_servers", "pipeline", "rollout", "assembler", "trainer"}
    unknown = sorted(set(tree) - allowed)
    if unknown:
        raise PipelineConfigError(f"{source}: unknown section(s) {unknown}; valid: {sorted(allowed)}")
    try:
        return PipelineSpec(
            source=source,
            bootstrap_servers=bootstrap_servers(tree),
            pipeline=section(tree, "pipeline", PipelineConfig, source=source),
            rollout=_raw_section(tree, "rollout", source),
            assembler=_raw_section(tree, "assembler", source),
            trainer=_raw_section(tree, "trainer", source),
        )
    except ConfigError as exc:
        raise PipelineConfigError(str(exc)) from exc


def _raw_section(tree: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    value = tree.get(name) or {}
    if not isinstance(value, dict):
        raise PipelineConfigError(f"{source}: section `{name}` must be a mapping")
    return dict(value)


def load_spec(path: str | Path) -> PipelineSpec:
    """Read a pipeline YAML file."""
    try:
        tree = load_yaml(path)
    except ConfigError as exc:
        raise PipelineConfigError(str(exc)) from exc
    return parse_spec(tree, source=str(path))
