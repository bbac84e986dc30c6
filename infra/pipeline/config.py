"""The pipeline config: one YAML file (e.g. `examples/quickstart.yaml`) for the whole loop.

One pydantic schema covers the whole file. The `pipeline` section is the orchestrator's own
(`PipelineConfig`): the model (a Hugging Face directory, or the tiny factory), the tasks (a Harbor
folder, a JSONL file, a Kafka topic, or a task-source plug-in), the run, the services. The
`rollout`, `assembler` and `trainer` sections are each service's own config; the run fills in
only what the user left empty (paths, URLs, topic names), and `load_spec` validates every section
completed that way against the service's own schema, so a mistake anywhere is reported at load,
one line per problem, before anything starts.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from stacx.infra.config import ConfigError, load_yaml
from stacx.infra.pipeline.errors import PipelineConfigError
from stacx.infra.pipeline.placement import ResourcesConfig
from stacx.infra.pipeline.raycluster import RayPlacementConfig
from stacx.infra.pipeline.services import RestartPolicy
from stacx.infra.pipeline.wires import wire_value
from stacx.infra.telemetry import TracingConfig
from stacx.infra.tracking.config import TrackingConfig
from stacx.schemas.plugins import did_you_mean
from stacx.schemas.topics import BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP, TopicPolicy

__all__ = [
    "ROLES",
    "ClusterConfig",
    "EvaluationConfig",
    "HostConfig",
    "ModelSource",
    "PipelineConfig",
    "PipelineFile",
    "PipelineSpec",
    "SFTConfig",
    "MOVED_SERVICE_FIELDS",
    "ServicesConfig",
    "TasksConfig",
    "TinyModelSpec",
    "TranscriptsConfig",
    "load_spec",
    "parse_spec",
    "use_plugin_paths",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SERVICE_SECTIONS = ("gateway", "inference", "rollout", "assembler", "trainer")
"""Sections handed (completed) to each service's own config loader."""


class _Schema(BaseModel):
    """Unknown fields are errors; assignments (command-line overrides) are validated too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TasksConfig(_Schema):
    """Where the training tasks come from: set exactly one of `source`, `harbor`, `jsonl`, `topic`."""

    source: str | None = None
    """A task-source plug-in (`package.module:Factory`, a registered name, or an entry point in
    `stacx.task_sources`): `Factory(**options)` has `train_tasks()`, optionally `heldout_tasks()`
    and `demonstration(rng, skill=...)` (SFT warm start); see docs/extending.md."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of the task source."""
    harbor: str | None = None
    """A folder of Harbor-format tasks (task.toml, instruction.md, environment/, tests/)."""
    jsonl: str | None = None
    """A tasks.jsonl of TaskSample rows (`stacx tasks import` writes one from Harbor tasks)."""
    topic: str | None = None
    """A Kafka topic of TaskSample events (e.g. stacx.tasks), shared by rollout workers."""
    heldout: str | None = None
    """Evaluation set before/after training: a Harbor folder or a JSONL file. Default: the training
    tasks themselves (harbor, jsonl), the source's `heldout_tasks()` (source), none (topic)."""

    @pydantic.model_validator(mode="after")
    def _exactly_one(self) -> TasksConfig:
        chosen = [n for n in _TASK_KINDS if getattr(self, n) is not None]
        if len(chosen) != 1:
            got = ", ".join(chosen) or "none"
            raise ValueError(f"set exactly one of {', '.join(_TASK_KINDS)} (got {got})")
        if self.options and self.source is None:
            raise ValueError("options are the keyword options of a task `source`; set `source` or drop them")
        return self

    @property
    def kind(self) -> str:
        return next(n for n in _TASK_KINDS if getattr(self, n) is not None)


_TASK_KINDS = ("source", "harbor", "jsonl", "topic")


class TranscriptsConfig(_Schema):
    """SFT transcripts of a black-box scaffold (Harbor or JSONL tasks): each row of a JSONL file
    is a task instruction and an answer, rendered as the scaffold's first model call
    (`stacx.rollout.blackbox.transcripts`) with the answer as the generated part."""

    path: str
    """JSONL rows `{"instruction": ..., "answer": ..., "kind": "expert" | "novice"}`: an expert
    answer solves its task, a novice one does not."""
    evaluator: str = "default"
    """The rollout evaluator whose scaffold and `scaffold_options` render the transcripts."""
    expert_fraction: float = Field(default=0.3, ge=0.0, le=1.0)
    """Share of expert rows in the final SFT steps: the warm-started policy's habit, hence
    roughly its success rate before GRPO."""
    skill_expert_fraction: float = Field(default=0.9, ge=0.0, le=1.0)
    """Share of expert rows during the first `sft.skill_steps` steps (the skill: the format and
    copying the task's names into the command)."""


class TinyModelSpec(_Schema):
    """Shape of the tiny Qwen2 made by `stacx.rollout.models.make_tiny_model` (`stacx models tiny`)."""

    hidden_size: int = Field(default=64, ge=1)
    """Residual width."""
    intermediate_size: int = Field(default=256, ge=1)
    """MLP width."""
    num_hidden_layers: int = Field(default=2, ge=1)
    """Transformer blocks."""
    num_attention_heads: int = Field(default=4, ge=1)
    """Query heads."""
    num_key_value_heads: int = Field(default=2, ge=1)
    """Key/value heads."""
    seed: int = 0
    """Initialisation seed."""


class ModelSource(_Schema):
    """The policy to start from: set exactly one of `path` and `tiny`."""

    path: str | None = None
    """A local Hugging Face causal-LM directory (config.json, weights, tokenizer) that
    transformers loads; used as is, never written to."""
    tiny: TinyModelSpec | None = None
    """Make a tiny random Qwen2 with this shape in the run directory."""

    @pydantic.model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        if (self.path is None) == (self.tiny is None):
            raise ValueError("set exactly one of path (a Hugging Face model directory) or tiny (a shape)")
        return self


class SFTConfig(_Schema):
    """Warm start with the trainer's `sft` recipe (single process, in-memory batches)."""

    steps: int = Field(default=450, ge=0)
    """Optimizer steps in total."""
    skill_steps: int = Field(default=400, ge=0)
    """The first steps (the source's `skill` demonstrations, the transcripts' skill mixture)."""
    batch_size: int = Field(default=64, ge=1)
    """Demonstrations per step."""
    lr: float = Field(default=3e-3, gt=0)
    """Learning rate of the skill steps (AdamW, linear warmup, then constant)."""
    mixture_lr: float = Field(default=1e-3, gt=0)
    """Learning rate of the final mixture steps (lower: resets the tool-use habit without
    unlearning the copy skill; at 3e-3 the forced-tool success fell from 0.97 to 0.73)."""
    warmup_steps: int = Field(default=20, ge=0)
    """Warmup steps."""
    seed: int = 1
    """Demonstration sampling seed."""


class ServicesConfig(_Schema):
    """How the pipeline supervises its services (each service's own settings are its section:
    `gateway:`, `inference:`, `rollout:`, `assembler:`, `trainer:`)."""

    startup_timeout_s: float = Field(default=180.0, gt=0)
    """How long a service may take to become ready."""
    restarts: RestartPolicy = Field(default_factory=RestartPolicy)
    """How a crashed service is restarted: backoff and a restart budget per service."""
    preload: bool = True
    """Fork the services that import torch (inference server, trainer) from one process that has
    imported torch and transformers once: they start sooner and share those pages. Off: each
    starts as a fresh process."""


MOVED_SERVICE_FIELDS = {
    "host": "gateway.host and inference.server.host",
    "gateway_port": "gateway.port",
    "gateway_backend": "gateway.backend",
    "gateway_warm_pool": "gateway.sessions.warm_pool_size",
    "gateway_reuse_pool": "gateway.sessions.reuse_pool_size",
    "inference_port": "inference.server.port",
    "inference_threads": "inference.server.torch_threads",
    "inference_max_batch_size": "inference.server.engine.max_batch_size",
}
"""Former `pipeline.services` fields and where each one is set now."""


class EvaluationConfig(_Schema):
    """Held-out evaluation through the real rollout path (server + sandbox), not published."""

    every_versions: int = Field(default=4, ge=0)
    """Evaluate after every this many policy versions (0: only before and after)."""
    num_problems: int = Field(default=64, ge=1)
    """Held-out tasks in a periodic evaluation (the first ones of the held-out set)."""
    samples_per_problem: int = Field(default=1, ge=1)
    """Samples per task (temperature as in the rollout config)."""
    final_samples_per_problem: int = Field(default=1, ge=0)
    """Samples per held-out task before and after training (all of them; 0: no evaluation)."""


class PipelineConfig(_Schema):
    """The orchestrator's own settings (`pipeline:` section)."""

    name: str = "quickstart"
    """Run name: the results go to `<runs_dir>/<name>/`."""
    runs_dir: str = "runs"
    """Where runs are written (relative: to the working directory)."""
    steps: int = Field(default=20, ge=1)
    """GRPO policy versions to train (the trainer's max_steps)."""
    fresh_topics: bool = True
    """Per-run topic names (`stacx.trajectories.<run_id>`, ...); false: the standard topics."""
    timeout_s: float = Field(default=1800.0, gt=0)
    """Give up (and say where it stalled) after this long."""
    stall_timeout_s: float = Field(default=300.0, gt=0)
    """Stop with a diagnosis when no trajectory, batch or policy version appears for this long."""
    live: bool = True
    """Show the live rich view (off when stdout is not a terminal)."""
    max_failed_fraction: float = Field(default=0.2, ge=0.0, le=1.0)
    """A run whose training episodes failed or timed out in a larger share ends `failed` (exit
    status 1), with the share and the commonest reasons in report.json."""
    plugin_paths: list[str] = Field(default_factory=list)
    """Folders put in front of `sys.path` here and of PYTHONPATH in every service, so that the
    plug-ins this file names (`package.module:object`) import everywhere (relative: to this file)."""
    model: ModelSource
    """The policy to start from."""
    tasks: TasksConfig
    """Training (and evaluation) tasks."""
    sft: SFTConfig | None = None
    """SFT warm start: on the task source's demonstrations or on `transcripts` (absent: none)."""
    transcripts: TranscriptsConfig | None = None
    """SFT transcripts of a black-box scaffold (harbor or jsonl tasks)."""
    services: ServicesConfig = Field(default_factory=lambda: ServicesConfig())
    """Service ports and sizes."""
    evaluation: EvaluationConfig = Field(default_factory=lambda: EvaluationConfig())
    """Held-out evaluation."""
    tracing: TracingConfig | None = None
    """OpenTelemetry tracing of every service (absent: the OTEL_* variables decide, off by
    default); passed to each service as the standard OTEL_* variables."""
    # -- experiment trackers (stacx.infra.tracking) --
    tracking: TrackingConfig | None = None
    """Experiment trackers fed from the run's topics (`[tensorboard, wandb, mlflow]`, each a
    name or `{name, options}`); their files go to `<runs_dir>/<name>/tracking/<tracker>/`."""

    @pydantic.field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"{name!r}: use letters, digits, '.', '_' or '-' (max 64)")
        return name

    @pydantic.model_validator(mode="after")
    def _sft_needs_demonstrations(self) -> PipelineConfig:
        if self.sft is not None and self.tasks.source is None and self.transcripts is None:
            raise ValueError(
                "sft: harbor, jsonl or topic tasks warm-start on scaffold transcripts; set "
                "`pipeline.transcripts.path`, or remove `pipeline.sft` (start from a model that "
                "already follows the scaffold's format)"
            )
        return self


ROLES = ("broker", "gateway", "inference", "rollout", "assembler", "trainer")
"""What a host of a cluster can run; `stacx node up` starts a host's roles, nothing else."""
Role = Literal["broker", "gateway", "inference", "rollout", "assembler", "trainer"]


class HostConfig(_Schema):
    """One host of the cluster: where it is and which services it runs."""

    name: str
    """The host's name in this file (`stacx node up --host NAME`)."""
    address: str = "127.0.0.1"
    """The address the other hosts reach this one at; its services listen on it."""
    roles: list[Role]
    """Services of this host: broker, gateway, inference, rollout, assembler, trainer."""
    trainer_ranks: int | None = Field(default=None, ge=1)
    """Trainer ranks on this host (role `trainer`; default: the `trainer.backend.world_size` on a
    lone trainer host, 1 on each of several). The ranks of all trainer hosts form one
    torch.distributed group through torchrun's c10d rendezvous."""
    interface: str | None = None
    """Network interface of `address` (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME of the trainer
    ranks); None: the libraries pick one from the host name."""

    @pydantic.field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"{name!r}: use letters, digits, '.', '_' or '-' (max 64)")
        return name

    @pydantic.field_validator("roles")
    @classmethod
    def _some_roles(cls, roles: list[str]) -> list[str]:
        if not roles or len(set(roles)) != len(roles):
            raise ValueError(f"list each role once, at least one of {', '.join(ROLES)}")
        return roles


class ClusterConfig(_Schema):
    """Which host runs which service (`cluster:` section). Absent: one host, `local`, runs every
    service but the broker (`stacx infra up` runs that one): the single-host pipeline."""

    hosts: list[HostConfig] = Field(min_length=1)
    """The hosts, each with its roles."""
    run_id: str | None = None
    """The run every host joins (its topics, groups and `<runs_dir>/<name>/` files); default:
    `pipeline.name`. Hosts share `pipeline.runs_dir` (a shared file system: model, checkpoints,
    weight exports)."""
    kafka_port: int = Field(default=9092, ge=1, le=65535)
    """Client listener of every broker host, on its address."""
    controller_port: int = Field(default=9093, ge=1, le=65535)
    """KRaft controller listener of every broker host, on its address."""
    broker_heap: str = "1g"
    """JVM heap (-Xmx) of each broker."""
    rendezvous_port: int = Field(default=29400, ge=1, le=65535)
    """torch.distributed c10d rendezvous port, on the first trainer host."""
    setup_timeout_s: float = Field(default=600.0, gt=0)
    """How long a host waits for the brokers and for the run's setup (topics, model, tasks)."""

    @pydantic.field_validator("run_id")
    @classmethod
    def _valid_run_id(cls, run_id: str | None) -> str | None:
        if run_id is not None and not _NAME.match(run_id):
            raise ValueError(f"{run_id!r}: use letters, digits, '.', '_' or '-' (max 64)")
        return run_id

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> ClusterConfig:
        names = [h.name for h in self.hosts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"host names must be unique: {', '.join(twice)} appear more than once")
        missing = [
            r for r in ("gateway", "inference", "rollout", "assembler", "trainer") if not self.with_role(r)
        ]
        if missing:
            raise ValueError(f"no host has the role(s) {', '.join(missing)}; give each to at least one host")
        if len(self.with_role("assembler")) > 1:
            raise ValueError("the assembler runs on one host (it is one consumer group; give it to one host)")
        brokers = [h.address for h in self.with_role("broker")]
        if len(set(brokers)) != len(brokers):
            raise ValueError("broker hosts need distinct addresses (each listens on kafka_port there)")
        return self

    @classmethod
    def one_host(cls) -> ClusterConfig:
        """The single-host pipeline: every service on 127.0.0.1, the broker from `stacx infra up`."""
        return cls(
            hosts=[
                HostConfig(name="local", roles=["gateway", "inference", "rollout", "assembler", "trainer"])
            ]
        )

    def with_role(self, role: str) -> list[HostConfig]:
        """Hosts that run `role`, in file order."""
        return [h for h in self.hosts if role in h.roles]

    def host(self, name: str) -> HostConfig:
        """The host called `name`; ValueError naming the known hosts otherwise."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise ValueError(f"no host {name!r} in cluster.hosts; hosts: {', '.join(h.name for h in self.hosts)}")

    @property
    def bootstrap_servers(self) -> str | None:
        """The broker hosts' listeners (None: no broker host; `bootstrap_servers` decides)."""
        brokers = self.with_role("broker")
        return ",".join(f"{h.address}:{self.kafka_port}" for h in brokers) or None

    def ranks_of(self, host: HostConfig, lone_default: int = 1) -> int:
        """Trainer ranks of `host` (`lone_default`: the trainer section's world size, used
        when it is the only trainer host and sets none)."""
        if host.trainer_ranks is not None:
            return host.trainer_ranks
        return lone_default if len(self.with_role("trainer")) == 1 else 1

    def trainer_world_size(self, lone_default: int = 1) -> int:
        return sum(self.ranks_of(h, lone_default) for h in self.with_role("trainer"))


def topic_policy_for(brokers: int, written: Mapping[str, Any]) -> dict[str, Any]:
    """The `topics:` section with replication from the broker count where the user left it out:
    one copy on one broker, 3 copies with `min.insync.replicas` 2 on three or more."""
    if brokers < 3:
        return dict(written)
    cluster = TopicPolicy.cluster()
    defaults = {
        "replication_factor": cluster.replication_factor,
        "min_insync_replicas": cluster.min_insync_replicas,
    }
    if "replication_factor" in written and "min_insync_replicas" not in written:
        defaults.pop("min_insync_replicas")
    return {**defaults, **written}


class PipelineFile(_Schema):
    """The whole pipeline YAML. Service sections are checked against the services' own schemas
    once the run's values are filled in (see `stacx.infra.pipeline.resolve`)."""

    bootstrap_servers: str | None = None
    """Kafka bootstrap servers of every service (default: $STACX_KAFKA, else 127.0.0.1:9092)."""
    pipeline: PipelineConfig
    """The orchestrator."""
    topics: TopicPolicy = Field(default_factory=TopicPolicy)
    """Replication, partitions, retention and compression of the run's topics (default
    replication: 1 on one broker; 3 with `min.insync.replicas` 2 on three or more broker hosts)."""
    resources: ResourcesConfig | None = None
    """GPUs of the trainer ranks and of the inference servers (absent: nothing placed)."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig.one_host)
    """Which host runs which service (`stacx node up --cluster FILE --host NAME`); default:
    one host runs them all (`stacx run`)."""
    placement: RayPlacementConfig | None = None
    """Where `stacx run` places the services: absent, this machine; `{kind: ray, address: ...}`,
    a Ray cluster (stacx.infra.pipeline.raycluster)."""
    gateway: dict[str, Any] = Field(default_factory=dict)
    """`stacx gateway --config` section (stacx.sandbox.gateway.Gateway.Config)."""
    inference: dict[str, Any] = Field(default_factory=dict)
    """`stacx serve --config` section (stacx.rollout.inference.serving.ServeConfig)."""
    rollout: dict[str, Any] = Field(default_factory=dict)
    """`stacx rollout` config (stacx.rollout.config.RolloutConfig)."""
    assembler: dict[str, Any] = Field(default_factory=dict)
    """`stacx assemble` config (stacx.consumers.assembly.AssemblerApp.Config)."""
    trainer: dict[str, Any] = Field(default_factory=dict)
    """`stacx train` config (stacx.trainer.TrainerConfig)."""

    @pydantic.model_validator(mode="after")
    def _replicas_fit(self) -> PipelineFile:
        brokers = len(self.cluster.with_role("broker"))
        if brokers and self.topics.replication_factor > brokers:
            raise ValueError(
                f"topics.replication_factor={self.topics.replication_factor} needs as many broker "
                f"hosts; cluster.hosts has {brokers} with role broker"
            )
        return self


@dataclass(kw_only=True, slots=True)
class PipelineSpec:
    """A whole pipeline file: the orchestrator's config plus each service's section as written."""

    source: str
    """Where it was read from (for messages)."""
    base_dir: Path
    """Directory that relative paths in the file are resolved against (after the working dir)."""
    bootstrap_servers: str
    """Kafka bootstrap servers for every service."""
    pipeline: PipelineConfig
    """Orchestrator settings."""
    rollout: dict[str, Any]
    """`stacx.rollout.config.RolloutConfig` section as the user wrote it."""
    gateway: dict[str, Any] = dataclasses.field(default_factory=dict)
    """`stacx.sandbox.gateway.Gateway.Config` section as the user wrote it."""
    inference: dict[str, Any] = dataclasses.field(default_factory=dict)
    """`stacx.rollout.inference.serving.ServeConfig` section as the user wrote it."""
    assembler: dict[str, Any]
    """`stacx.consumers.assembly.AssemblerApp.Config` section as the user wrote it."""
    trainer: dict[str, Any]
    """`stacx.trainer.TrainerConfig` section as the user wrote it."""
    topics: TopicPolicy = dataclasses.field(default_factory=TopicPolicy)
    """How the run's topics (and the assembler's own) are created."""
    plugin_paths: list[Path] = dataclasses.field(default_factory=list)
    """`pipeline.plugin_paths`, resolved against the file's folder."""
    resources: ResourcesConfig | None = None
    """Device placement of the trainer and the inference servers."""
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig.one_host)
    """The hosts and their roles (one host: the single-host pipeline)."""
    placement: RayPlacementConfig | None = None
    """A Ray cluster that places the services (None: this machine)."""


def schema_errors(exc: pydantic.ValidationError, source: str) -> list[str]:
    """One line per pydantic error: `file: section.field: what is expected, got what`."""
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        kind, message = err["type"], str(err["msg"])
        if kind == "extra_forbidden":
            lines.append(f"{source}: {field}: unknown field{_valid_hint(err['loc'])}")
        elif kind == "missing":
            lines.append(f"{source}: {field}: required field is missing")
        elif kind == "value_error":
            where = f"{source}: {field}" if field else source  # a whole-file check names its fields
            lines.append(f"{where}: {message.removeprefix('Value error, ')}")
        else:
            message = message.replace("Input should be", "expected").split(", unable to parse")[0]
            got = repr(err.get("input"))
            lines.append(f"{source}: {field}: {message}, got {got if len(got) <= 60 else got[:57] + '...'}")
    return lines


def _valid_hint(loc: tuple[Any, ...]) -> str:
    model: Any = PipelineFile
    for part in loc[:-1]:
        info = getattr(model, "model_fields", {}).get(part)
        if info is None:
            return ""
        model = _model_of(info.annotation)
    fields = sorted(getattr(model, "model_fields", None) or [])
    return f"; valid fields: {', '.join(fields)}{did_you_mean(str(loc[-1]), fields)}" if fields else ""


def _model_of(annotation: Any) -> Any:
    import typing

    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def parse_spec(
    tree: dict[str, Any], *, source: str = "config", base_dir: Path | None = None, check: bool = True
) -> PipelineSpec:
    """A `PipelineSpec` from an already-loaded YAML tree; with `check`, every service section is
    validated (completed with the run's values) too. All problems of every section are raised
    at once: a broken `pipeline` section does not hide the service sections' problems."""
    base_dir = base_dir or Path.cwd()
    use_plugin_paths(_written_plugin_paths(tree, base_dir))  # what the file's sections name imports
    parsed, lines, replaced = _parse_file(tree, source)
    spec = _spec(parsed, source, base_dir)
    use_plugin_paths(spec.plugin_paths)
    if check:
        from stacx.infra.pipeline.resolve import check_sections

        check_sections(spec, lines, unchecked=replaced)
    elif lines:
        raise PipelineConfigError("\n".join(lines))
    return spec


def _written_plugin_paths(tree: Mapping[str, Any], base_dir: Path) -> list[Path]:
    """`pipeline.plugin_paths` as written (before validation: the plug-ins that `pipeline.tracking`
    names are imported while the file is validated); a malformed list is reported by the schema."""
    pipeline = tree.get("pipeline")
    paths = pipeline.get("plugin_paths") if isinstance(pipeline, Mapping) else None
    if not isinstance(paths, list):
        return []
    return [(base_dir / p).resolve() for p in paths if isinstance(p, str)]


_PLACEHOLDERS: dict[str, Any] = {"model": {"tiny": {}}, "tasks": {"jsonl": "tasks.jsonl"}}
"""Stand-ins for an invalid required `pipeline` field while the other sections are checked."""


def _parse_file(tree: dict[str, Any], source: str) -> tuple[PipelineFile, list[str], set[str]]:
    """The file's schema, and its problems: an invalid field is dropped (a required one is
    stood in for) and the rest validated again, so every section gets checked in one pass.
    The third value names the `pipeline` fields that were stood in for or dropped (`*`: all)."""
    current = copy.deepcopy(tree)
    lines = _moved_fields(current, source)
    _cluster_topic_policy(current)
    replaced: set[str] = set()
    for _ in range(4):  # each round drops what the last one found; nesting is shallow
        try:
            return PipelineFile.model_validate(current), lines, replaced
        except pydantic.ValidationError as exc:
            lines += [line for line in schema_errors(exc, source) if line not in lines]
            for err in exc.errors():
                replaced |= _drop(current, tuple(str(p) for p in err["loc"]))
    raise PipelineConfigError("\n".join(lines))


def _cluster_topic_policy(tree: dict[str, Any]) -> None:
    """Fill `topics` replication from the number of broker hosts in `cluster` (user values win)."""
    cluster, written = tree.get("cluster"), tree.get("topics") or {}
    if not isinstance(cluster, dict) or not isinstance(written, dict):
        return
    listed = cluster.get("hosts")
    hosts: list[Any] = listed if isinstance(listed, list) else []
    brokers = len([h for h in hosts if isinstance(h, dict) and "broker" in (h.get("roles") or [])])
    if brokers >= 3:
        tree["topics"] = topic_policy_for(brokers, written)


def _moved_fields(tree: dict[str, Any], source: str) -> list[str]:
    """One line per former `pipeline.services` field (taken out of `tree`), naming its new place."""
    pipeline = tree.get("pipeline")
    services = pipeline.get("services") if isinstance(pipeline, dict) else None
    if not isinstance(services, dict):
        return []
    moved = [key for key in services if key in MOVED_SERVICE_FIELDS]
    for key in moved:
        del services[key]
    return [
        f"{source}: pipeline.services.{key}: moved; set {MOVED_SERVICE_FIELDS[key]} (its own section)"
        for key in moved
    ]


def _drop(tree: dict[str, Any], loc: tuple[str, ...]) -> set[str]:
    """Remove the value at `loc` (or its nearest existing parent); put a stand-in for a required
    `pipeline` field. Returns the `pipeline` field touched, if any."""
    if loc and loc[0] == "cluster":  # a broken host list: the other sections are checked on one host
        tree.pop("cluster", None)
        return set()
    node: Any = tree
    for depth, part in enumerate(loc):
        if not isinstance(node, dict) or part not in node:
            loc = loc[:depth]
            break
        if depth < len(loc) - 1:
            node = node[part]
    if not loc:
        return set()
    if len(loc) == 1:
        tree.pop(loc[0], None)
        if loc[0] == "pipeline":
            tree["pipeline"] = copy.deepcopy(_PLACEHOLDERS)
            return {"*"}
        return set()
    parent = tree
    for part in loc[:-1]:
        parent = parent[part]
    if isinstance(parent, dict):
        parent.pop(loc[-1], None)
    pipeline = tree.get("pipeline")
    if loc[0] == "pipeline" and isinstance(pipeline, dict):
        field = loc[1]
        if field in _PLACEHOLDERS:
            pipeline[field] = copy.deepcopy(_PLACEHOLDERS[field])
        return {field}
    return set()


def _spec(parsed: PipelineFile, source: str, base_dir: Path) -> PipelineSpec:
    sections = {"rollout": parsed.rollout, "assembler": parsed.assembler, "trainer": parsed.trainer}
    bootstrap = (
        parsed.bootstrap_servers
        or parsed.cluster.bootstrap_servers
        or wire_value(sections, "bootstrap_servers")
    )
    return PipelineSpec(
        source=source,
        base_dir=base_dir,
        bootstrap_servers=str(bootstrap or os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP),
        pipeline=parsed.pipeline,
        gateway=dict(parsed.gateway),
        inference=dict(parsed.inference),
        rollout=dict(parsed.rollout),
        assembler=dict(parsed.assembler),
        trainer=dict(parsed.trainer),
        topics=parsed.topics,
        resources=parsed.resources,
        cluster=parsed.cluster,
        placement=parsed.placement,
        plugin_paths=[(base_dir / p).resolve() for p in parsed.pipeline.plugin_paths],
    )


def use_plugin_paths(paths: list[Path]) -> None:
    """Put `paths` in front of `sys.path` (this process) and of $PYTHONPATH (every service it
    starts inherits it), once each."""
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for path in reversed(paths):
        text = str(path)
        if text not in sys.path:
            sys.path.insert(0, text)
        if text not in current:
            current.insert(0, text)
    if current:
        os.environ["PYTHONPATH"] = os.pathsep.join(current)


def load_spec(path: str | Path, *, check: bool = True) -> PipelineSpec:
    """Read and validate a pipeline YAML file."""
    try:
        tree = load_yaml(path)
    except ConfigError as exc:
        raise PipelineConfigError(str(exc)) from exc
    return parse_spec(tree, source=str(path), base_dir=Path(path).resolve().parent, check=check)
