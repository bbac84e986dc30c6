"""Where a run writes (`runs/<name>/...`), which topics it uses, and the config file of every
service, filled in from the pipeline spec. Pure functions: unit-tested without services.

The run's values fill only what the user left empty: a value set in the YAML is kept (and
`stacx.infra.pipeline.resolve` rejects one that would break the loop, naming it)."""

from __future__ import annotations

import copy
import dataclasses
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stacx.infra.config import resolve_path
from stacx.infra.pipeline.config import PipelineSpec
from stacx.infra.pipeline.placement import Placement, place, visible_devices
from stacx.infra.pipeline.wires import wire_value
from stacx.schemas import topics

__all__ = [
    "RunLayout",
    "RunTopics",
    "assembler_section",
    "gateway_backend",
    "InferenceService",
    "gateway_section",
    "inference_section",
    "inference_services",
    "placement",
    "router_section",
    "rollout_section",
    "service_urls",
    "trainer_section",
]


@dataclass(kw_only=True, slots=True)
class RunTopics:
    """The topics one run reads and writes."""

    trajectories: str
    batches: str
    weights: str
    tasks: str
    """The run's training tasks (always its own topic: the rollout service resumes from its
    consumer group's committed offsets after a restart)."""

    @classmethod
    def for_run(cls, run_id: str, *, fresh: bool, chosen: dict[str, str | None] | None = None) -> RunTopics:
        """`stacx.<kind>.<run_id>` when fresh (nothing left over from other runs), else the
        standard topics of schemas/topics.py; a topic the user `chosen` wins over both. The tasks
        topic is always the run's own."""
        derived = cls._derived(run_id, fresh=fresh)
        picked = {k: v for k, v in (chosen or {}).items() if v}
        return cls(
            **{**{k: getattr(derived, k) for k in ("trajectories", "batches", "weights", "tasks")}, **picked}
        )

    @classmethod
    def _derived(cls, run_id: str, *, fresh: bool) -> RunTopics:
        tasks = f"{topics.TASKS}.{run_id}"
        if not fresh:
            return cls(
                trajectories=topics.TRAJECTORIES, batches=topics.BATCHES, weights=topics.WEIGHTS, tasks=tasks
            )
        return cls(
            trajectories=f"{topics.TRAJECTORIES}.{run_id}",
            batches=f"{topics.BATCHES}.{run_id}",
            weights=f"{topics.WEIGHTS}.{run_id}",
            tasks=tasks,
        )

    def specs(self, policy: topics.TopicPolicy | None = None) -> tuple[topics.TopicSpec, ...]:
        """The standard topics' specs under this run's names and `policy` (default: one node's)."""
        policy = policy or topics.TopicPolicy()
        kinds = ("trajectories", "batches", "weights", "tasks")
        return tuple(policy.apply(topics.spec_for(kind, getattr(self, kind)), kind=kind) for kind in kinds)


@dataclass(kw_only=True, slots=True)
class RunLayout:
    """Paths and names of one run."""

    name: str
    run_id: str
    root: Path
    topics: RunTopics
    model_name: str
    """Kafka key of the policy on the weights topic."""

    @classmethod
    def create(cls, spec: PipelineSpec, *, now: float | None = None) -> RunLayout:
        cfg = spec.pipeline
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
        cluster = spec.cluster
        # every host of a cluster joins the same run: its id is fixed, not a start time
        fixed = cluster.run_id or (cfg.name if len(cluster.hosts) > 1 else None)
        run_id = fixed or f"{cfg.name}-{stamp}"
        sections = _user_sections(spec)
        kinds = ("trajectories", "batches", "weights")
        chosen = {kind: wire_value(sections, f"{kind}_topic") for kind in kinds}
        return cls(
            name=cfg.name,
            run_id=run_id,
            root=Path(cfg.runs_dir) / cfg.name,
            topics=RunTopics.for_run(run_id, fresh=cfg.fresh_topics, chosen=chosen),
            model_name=wire_value(sections, "model_name") or ("policy" if cfg.fresh_topics else run_id),
        )

    @property
    def config_dir(self) -> Path:
        return self.root / "config"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def base_model(self) -> Path:
        return self.root / "models" / "base"

    @property
    def sft_root(self) -> Path:
        return self.root / "models"

    @property
    def weights_dir(self) -> Path:
        return self.root / "weights"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def train_tasks(self) -> Path:
        return self.root / "tasks" / "train.jsonl"

    @property
    def heldout_tasks(self) -> Path:
        return self.root / "tasks" / "heldout.jsonl"

    @property
    def report_path(self) -> Path:
        return self.root / "report.json"

    @property
    def curve_path(self) -> Path:
        return self.root / "reward_curve.png"


def clear_run_dir(root: Path, *, keep: Sequence[str]) -> None:
    """Empty a reused run folder for a new run of its name, but for the entries named in `keep`
    (the trackers' data: each run is its own run there)."""
    if not root.exists():
        return
    for path in root.iterdir():
        if path.name in keep:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _fill(user: dict[str, Any], derived: dict[str, Any]) -> dict[str, Any]:
    """`user` with `derived` values where the user left them empty (user values win)."""
    return _merge(derived, user)


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def task_data(spec: PipelineSpec, layout: RunLayout) -> dict[str, Any]:
    """`stacx.rollout.data`'s task source for `pipeline.tasks` (a task-source plug-in: the run's topic)."""
    tasks = spec.pipeline.tasks
    if tasks.harbor is not None:
        return {"task_dirs": str(resolve_path(tasks.harbor, spec.base_dir))}
    if tasks.jsonl is not None:
        return {"path": str(resolve_path(tasks.jsonl, spec.base_dir))}
    if tasks.topic is not None:
        return {"topic": tasks.topic}
    # generated tasks go through the run's tasks topic and a consumer group: a restarted
    # rollout service goes on where it stopped
    return {"path": None, "topic": layout.topics.tasks, "consumer_group": f"stacx-rollout-{layout.run_id}"}


def _group_size(spec: PipelineSpec, key: str) -> dict[str, Any]:
    """The GRPO group size where the user set it in one of its places (rollout or assembler)."""
    n = wire_value(_user_sections(spec), "group_size")
    return {} if n is None else {key: n}


def _trained_groups(spec: PipelineSpec) -> dict[str, Any]:
    """What the rollout's staleness bound must know of the assembler: which episodes it trains on
    and how many a group needs, so that a group it will drop does not hold the bound."""
    from stacx.consumers.assembly.filters import FailurePolicy, SampleFilter
    from stacx.consumers.assembly.grouping import GroupAssembler, PartialPolicy

    filtering = spec.assembler.get("filtering") or {}
    grouping = spec.assembler.get("grouping") or {}
    kept, ways = SampleFilter.Config(), GroupAssembler.Config()
    drops = str(filtering.get("failure_policy", kept.failure_policy)) == FailurePolicy.DROP.value
    statuses = filtering.get("ok_statuses", list(kept.ok_statuses)) if drops else None
    if str(grouping.get("partial_policy", ways.partial_policy)) == PartialPolicy.DROP.value:
        needed = wire_value(_user_sections(spec), "group_size") or ways.group_size
    else:
        needed = grouping.get("min_group_size", ways.min_group_size)
    return {"trained_statuses": statuses, "min_trained_per_group": needed}


def _user_sections(spec: PipelineSpec) -> dict[str, Any]:
    return {"rollout": spec.rollout, "assembler": spec.assembler, "trainer": spec.trainer}


def host_logs_dir(logs_dir: Path, host: str) -> Path:
    """Where the services of one host of a cluster run log (`stacx node up --host HOST`)."""
    return logs_dir / host


def service_logs(logs_dir: Path, name: str) -> list[Path]:
    """A service's log files: `logs/<name>` of a one-host run, `logs/<host>/<name>` of each host
    of a cluster run."""
    return [p for p in (logs_dir / name, *sorted(logs_dir.glob(f"*/{name}"))) if p.is_file()]


def rollout_section(
    spec: PipelineSpec,
    layout: RunLayout,
    *,
    model_dir: Path,
    inference_url: str,
    gateway_url: str,
    fallback_gateways: Sequence[str] = (),
    worker: str | None = None,
) -> dict[str, Any]:
    """`stacx rollout` config: the spec's `rollout` section plus this run's data and endpoints;
    `gateway_url` preferred, `fallback_gateways` (other hosts') used while it is down or full.
    `worker` (a cluster host's name) names this worker's weights follower group: each worker
    needs its own, since the weights topic has one partition and a shared group hands it to
    one member only (the others would stop seeing new versions)."""
    user_sandbox = spec.rollout.get("sandbox") or {}
    sandbox: dict[str, Any] = {"url": gateway_url}
    if fallback_gateways and not {"url", "urls"} & set(user_sandbox):
        sandbox = {"urls": [gateway_url, *fallback_gateways], "preferred": [gateway_url]}
    return _fill(
        spec.rollout,
        {
            "data": {**task_data(spec, layout), **_group_size(spec, "samples_per_task")},
            "inference": {
                "url": inference_url,
                "tokenizer": str(model_dir.resolve()),
                "wait_ready_s": spec.pipeline.services.startup_timeout_s,  # started with the server
            },
            "sandbox": sandbox,
            "kafka": {
                "bootstrap_servers": spec.bootstrap_servers,
                "publish": True,
                "follow_weights": True,
                "trajectories_topic": layout.topics.trajectories,
                "weights_topic": layout.topics.weights,
                "weights_group": f"stacx-rollout-weights-{layout.run_id}" + (f"-{worker}" if worker else ""),
            },
            "manager": {"model_name": layout.model_name, **_trained_groups(spec)},
            "progress": False,
        },
    )


def assembler_section(spec: PipelineSpec, layout: RunLayout) -> dict[str, Any]:
    """`stacx assemble --config` file contents (an `assembler:` section)."""
    section = _fill(
        spec.assembler,
        {
            "app_id": f"stacx-assembler-{layout.run_id}",
            "bootstrap_servers": spec.bootstrap_servers,
            "trajectories_topic": layout.topics.trajectories,
            "batches_topic": layout.topics.batches,
            "weights_topic": layout.topics.weights,
            "datadir": str((layout.root / "assembler").resolve()),
            "grouping": _group_size(spec, "group_size"),
            "topic_policy": dataclasses.asdict(spec.topics),
        },
    )
    return {"assembler": section}


def trainer_section(spec: PipelineSpec, layout: RunLayout, *, model_dir: Path) -> dict[str, Any]:
    """`stacx train` config (TrainerConfig) for the GRPO loop of this run."""
    return _fill(
        spec.trainer,
        {
            "models": {"policy": {"path": str(model_dir.resolve())}},
            "source": {
                "bootstrap_servers": spec.bootstrap_servers,
                "topic": layout.topics.batches,
                "group_id": f"stacx-trainer-{layout.run_id}",
            },
            "export": {
                "dir": str(layout.weights_dir.resolve()),
                "model_name": layout.model_name,
                "publish": True,
                "topic": layout.topics.weights,
                "bootstrap_servers": spec.bootstrap_servers,
            },
            # resume stays on (TrainerConfig's default): a restarted trainer goes on from its
            # last checkpoint, so nothing is trained twice or left out
            "checkpoint": {"dir": str(layout.checkpoints_dir.resolve())},
            "max_steps": spec.pipeline.steps,
            "trainer_id": f"stacx-trainer-{layout.run_id}",
            **_trainer_devices(spec),
        },
    )


def _trainer_devices(spec: PipelineSpec) -> dict[str, Any]:
    """FSDP2 over NCCL, one rank per GPU of `resources.trainer` (nothing when not placed)."""
    gpus = placement(spec)[0].trainer
    return {"backend": {"kind": "fsdp2", "world_size": len(gpus), "device": "cuda"}} if gpus else {}


GATEWAY_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 8710,  # not the gateway's own default 8700, so a gateway started by hand can stay
    "backend": "docker",
    "sessions": {"reuse_pool_size": 64},  # resetting a sandbox is one exec, starting one a container
}
INFERENCE_DEFAULTS: dict[str, Any] = {
    "server": {"host": "127.0.0.1", "port": 30010, "device": "cpu", "torch_threads": 1},
}


def gateway_section(spec: PipelineSpec, layout: RunLayout) -> dict[str, Any]:
    """`stacx gateway --config` section (Gateway.Config): the spec's `gateway:` section, the
    pipeline's defaults where it is silent, and the run's sandbox owner."""
    return _fill(_fill(spec.gateway, GATEWAY_DEFAULTS), {"sessions": {"owner": f"stacx-{layout.run_id}"}})


def inference_section(spec: PipelineSpec, layout: RunLayout, *, model_dir: Path) -> dict[str, Any]:
    """`stacx serve --config` section (ServeConfig): the spec's `inference:` section plus the
    run's model and weight topic (the server follows the run's weights itself)."""
    return _fill(
        _fill(spec.inference, INFERENCE_DEFAULTS),
        {
            "server": {"model_path": str(model_dir), "weight_version": "0"},
            "follow_weights": layout.model_name,
            "weights_topic": layout.topics.weights,
            "bootstrap_servers": spec.bootstrap_servers,
        },
    )


def service_urls(spec: PipelineSpec) -> tuple[str, str]:
    """(inference URL, gateway URL) of the services the pipeline starts."""
    gateway = _fill(spec.gateway, GATEWAY_DEFAULTS)
    server = _fill(spec.inference, INFERENCE_DEFAULTS)["server"]
    return f"http://{server['host']}:{server['port']}", f"http://{gateway['host']}:{gateway['port']}"


def gateway_backend(spec: PipelineSpec) -> str:
    """The sandbox backend of the run's gateway (`docker` or `process`)."""
    return str(_fill(spec.gateway, GATEWAY_DEFAULTS)["backend"])


def _int(value: Any, default: int) -> int:
    """An int option as written (an invalid one: `default`; the section's own check says why)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def serving_options(spec: PipelineSpec) -> tuple[str, int, int, float | None]:
    """(engine, servers, tp_size, mem_fraction) of the `inference:` section."""
    section = spec.inference
    fraction = section.get("mem_fraction")
    return (
        str(section.get("engine") or "builtin"),
        max(1, _int(section.get("servers"), 1)),
        max(1, _int(section.get("tp_size"), 1)),
        float(fraction) if isinstance(fraction, int | float) else None,
    )


def placement(spec: PipelineSpec) -> tuple[Placement, list[str]]:
    """GPUs of the trainer and of every inference server, and the `resources:` problems."""
    _, servers, tp_size, mem_fraction = serving_options(spec)
    return place(spec.resources, servers=servers, tp_size=tp_size, mem_fraction=mem_fraction)


@dataclass(kw_only=True, slots=True)
class InferenceService:
    """One inference server the run starts: its service name, section, URL and devices."""

    name: str
    """`inference` (one server), else `inference-<i>`."""
    section: dict[str, Any]
    """Its `stacx serve --config` section."""
    url: str
    env: dict[str, str]
    """`CUDA_VISIBLE_DEVICES` when placed."""
    ready_path: str
    """Ready when GET of this answers 2xx: `/health_generate` for SGLang (one real generation),
    `/health` for the built-in server (503 until it serves the newest weights)."""


def inference_services(spec: PipelineSpec, layout: RunLayout, *, model_dir: Path) -> list[InferenceService]:
    """Every inference server of the run: one on `inference.server.port`, or `servers` of them
    on the ports after it (the router then listens on `inference.server.port`)."""
    base = inference_section(spec, layout, model_dir=model_dir)
    engine, num_servers, _, _ = serving_options(spec)
    gpus = placement(spec)[0].servers or [[] for _ in range(num_servers)]
    user_device = (spec.inference.get("server") or {}).get("device")
    out = []
    for i in range(num_servers):
        section = copy.deepcopy(base)
        server = section["server"]
        if num_servers > 1:
            server["port"] = _int(server.get("port"), 0) + 1 + i
            section["servers"] = 1
        if gpus[i] and user_device is None:
            server["device"] = "cuda"  # the built-in server on its placed GPU (SGLang: always)
        out.append(
            InferenceService(
                name="inference" if num_servers == 1 else f"inference-{i}",
                section=section,
                url=f"http://{server['host']}:{server['port']}",
                env=visible_devices(gpus[i]),
                ready_path="/health_generate" if engine == "sglang" else "/health",
            )
        )
    return out


def router_section(spec: PipelineSpec, layout: RunLayout, *, model_dir: Path) -> dict[str, Any] | None:
    """`stacx route --config` section in front of the servers (None: one server, no router)."""
    services = inference_services(spec, layout, model_dir=model_dir)
    if len(services) == 1:
        return None
    server = _fill(spec.inference, INFERENCE_DEFAULTS)["server"]
    user = spec.inference.get("router") or {}
    return _fill(
        user if isinstance(user, dict) else {},
        {"host": server["host"], "port": server["port"], "upstreams": [s.url for s in services]},
    )
