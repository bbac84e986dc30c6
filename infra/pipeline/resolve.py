"""Everything a run will start, resolved and checked before anything starts.

`check_sections` (at load): every service section, completed with the run's values, is validated
against the service's own schema; wires agree; nothing the user set contradicts what the pipeline
owns (its service URLs, its task source, its model). `check_resolved` (before the run dir, SFT or
any service): the recipe, the scaffolds, rewards and scheduling strategy, the resource budget, the
model directory and its tokenizer, the task folder or file. `explain` prints what each service
will get. Every problem is one line; all of them are reported at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stacx.infra.checks import (
    bad_row_lines,
    harbor_problems,
    jsonl_problems,
    model_problem,
    plugin_problems,
    rollout_config_problem,
    tokenizer_problem,
)
from stacx.infra.config import ConfigError, build, resolve_path
from stacx.infra.pipeline.config import PipelineSpec
from stacx.infra.pipeline.errors import PipelineConfigError
from stacx.infra.pipeline.layout import (
    RunLayout,
    assembler_section,
    gateway_section,
    inference_section,
    inference_services,
    placement,
    rollout_section,
    router_section,
    service_urls,
    task_data,
    trainer_section,
)
from stacx.infra.pipeline.wires import WIRES, get_path, wire_conflicts
from stacx.rollout.tokens import model_vocab_size
from stacx.schemas.config import build_partial
from stacx.schemas.plugins import first_line
from stacx.schemas.records import export_dir_name

__all__ = [
    "ServicePlan",
    "check_resolved",
    "check_sections",
    "explain",
    "resolved_config",
    "plan",
    "planned_model_dir",
    "transcript_adapter",
]


@dataclass(kw_only=True, slots=True)
class ServicePlan:
    """What every service of a run gets: its config section, completed with the run's values."""

    model_dir: Path
    """The policy the services start from (after SFT, when there is one)."""
    gateway: dict[str, Any]
    inference: dict[str, Any]
    rollout: dict[str, Any]
    assembler: dict[str, Any]
    trainer: dict[str, Any]


def urls(spec: PipelineSpec) -> tuple[str, str]:
    """(inference URL, gateway URL) of the services the pipeline starts."""
    return service_urls(spec)


def base_model_dir(spec: PipelineSpec, layout: RunLayout) -> Path:
    """The model before SFT: the user's directory, or where the tiny model is made."""
    model = spec.pipeline.model
    return resolve_path(model.path, spec.base_dir) if model.path is not None else layout.base_model


def planned_model_dir(spec: PipelineSpec, layout: RunLayout) -> Path:
    """The model the services start from: the SFT export when there is an SFT stage."""
    sft = spec.pipeline.sft
    if sft is None or sft.steps == 0:
        return base_model_dir(spec, layout)
    skill = min(sft.skill_steps, sft.steps)
    mixture = sft.steps - skill
    return layout.sft_root / ("sft" if mixture else "sft-skill") / export_dir_name(mixture or skill)


def plan(spec: PipelineSpec, layout: RunLayout, *, model_dir: Path | None = None) -> ServicePlan:
    """Every service's config section for this run."""
    model_dir = model_dir or planned_model_dir(spec, layout)
    inference_url, gateway_url = urls(spec)
    return ServicePlan(
        model_dir=model_dir,
        gateway=gateway_section(spec, layout),
        inference=inference_section(spec, layout, model_dir=model_dir),
        rollout=rollout_section(
            spec, layout, model_dir=model_dir, inference_url=inference_url, gateway_url=gateway_url
        ),
        assembler=_with_vocab_size(assembler_section(spec, layout), model_dir),
        trainer=trainer_section(spec, layout, model_dir=model_dir),
    )


def _with_vocab_size(section: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    """The assembler section with `filtering.vocab_size` from the model, unless the user set it
    (or the model is not made yet): the assembler then dead-letters samples the trainer cannot embed."""
    filtering = section["assembler"].setdefault("filtering", {})
    if isinstance(filtering, dict) and "vocab_size" not in filtering:
        vocab_size = model_vocab_size(model_dir)
        if vocab_size is not None:
            filtering["vocab_size"] = vocab_size
    return section


def explain(spec: PipelineSpec, layout: RunLayout) -> str:
    """The resolved config of every service, defaults included, as YAML (`stacx run --explain`)."""
    return yaml.safe_dump(resolved_config(spec, layout), sort_keys=False, width=110)


def resolved_config(spec: PipelineSpec, layout: RunLayout) -> dict[str, Any]:
    """The run, the pipeline section and every service's config, defaults included (what
    `stacx run --explain` prints and the trackers record)."""
    import pydantic

    p = plan(spec, layout)
    built, lines = _built_sections(spec, layout)
    if lines:
        raise PipelineConfigError("\n".join(lines))
    resolved = {
        name: pydantic.TypeAdapter(type(config)).dump_python(config, mode="json")
        for name, config in built.items()
    }
    return {
        "run": {
            "run_id": layout.run_id,
            "dir": str(layout.root),
            "model_dir": str(p.model_dir),
            "topics": {
                "trajectories": layout.topics.trajectories,
                "batches": layout.topics.batches,
                "weights": layout.topics.weights,
            },
        },
        "pipeline": spec.pipeline.model_dump(mode="json", exclude_none=True),
        "placement": serving_explained(spec, layout, p.model_dir),
        "services": resolved,
    }


def serving_explained(spec: PipelineSpec, layout: RunLayout, model_dir: Path) -> dict[str, Any]:
    """What `stacx run` starts for inference and where: each server (its GPUs, its command; the
    SGLang launch line for `engine: sglang`), the router in front of them, the trainer's GPUs."""
    placed = placement(spec)[0]
    servers = []
    for service in inference_services(spec, layout, model_dir=model_dir):
        entry: dict[str, Any] = {"name": service.name, "url": service.url,
                                 "ready": f"{service.url}{service.ready_path}",
                                 "env": service.env or None, "command": _serve_command(service.section)}
        servers.append({k: v for k, v in entry.items() if v is not None})
    router = router_section(spec, layout, model_dir=model_dir)
    trainer = {"gpus": placed.trainer, "world_size": len(placed.trainer), "backend": "fsdp2 (nccl)"} \
        if placed.trainer else {"gpus": [], "note": "not placed: trainer.backend decides"}
    return {
        "inference_servers": servers,
        "router": None if router is None else {
            "url": f"http://{router['host']}:{router['port']}", "upstreams": router["upstreams"],
            "policy": "prefix affinity (cache-aware), least in-flight when imbalanced, failover",
        },
        "trainer": trainer,
    }


def _serve_command(section: dict[str, Any]) -> list[str] | str:
    """The command an inference server runs: SGLang's launch line, or `stacx serve` (built-in)."""
    from stacx.rollout.inference.serving import ServeConfig, sglang_server

    try:
        config = build(ServeConfig, section, where="inference")
    except ConfigError as exc:
        return f"(invalid: {exc.lines[0]})"
    if config.engine == "sglang":
        return [str(part) for part in sglang_server(config).command()]
    return ["stacx", "serve", "--config", "<run>/config/<name>.yaml", f"(engine {config.engine})"]


# ------------------------------------------------------------------------------------ at load


def _owned(spec: PipelineSpec, layout: RunLayout) -> list[tuple[tuple[str, ...], Any, str]]:
    """(place, the run's value, how to change it) of values the pipeline owns: None means the
    user may not set it at all."""
    inference_url, gateway_url = urls(spec)
    tasks = "the tasks come from pipeline.tasks (source, harbor, jsonl or topic); set them there"
    model = "the model comes from pipeline.model (path or tiny); set it there"
    return [
        *((("rollout", "data", key), None, tasks) for key in ("path", "task_dirs", "topic")),
        (
            ("rollout", "inference", "url"),
            inference_url,
            "the pipeline starts the inference server there; set inference.server.host/port instead",
        ),
        (
            ("rollout", "sandbox", "url"),
            gateway_url,
            "the pipeline starts the sandbox gateway there; set gateway.host/port instead",
        ),
        (("rollout", "kafka", "publish"), True, "the trainer learns from the published trajectories"),
        (("inference", "server", "model_path"), None, model),
        (("inference", "follow_weights"), None, "the server follows the run's policy on its weights topic"),
        *(
            (("inference", "router", key), None,
             "the run's router listens on inference.server.host/port in front of its servers; set those")
            for key in ("host", "port", "upstreams")
        ),
        (("gateway", "sessions", "owner"), None, "the run labels its sandboxes with its own owner"),
        (("rollout", "kafka", "follow_weights"), True, "rollouts must follow the trained policy"),
        (("trainer", "models", "policy", "path"), None, model),
        (("trainer", "models", "policy", "tiny"), None, model),
        (("trainer", "max_steps"), spec.pipeline.steps, "set pipeline.steps instead"),
        (("trainer", "source", "kind"), "kafka", "the trainer reads the run's batches topic"),
        (("trainer", "export", "publish"), True, "the inference server follows the published versions"),
    ]


def _sections(spec: PipelineSpec) -> dict[str, Any]:
    return {
        "gateway": spec.gateway,
        "inference": spec.inference,
        "rollout": spec.rollout,
        "assembler": spec.assembler,
        "trainer": spec.trainer,
    }


def _owned_conflicts(spec: PipelineSpec, layout: RunLayout) -> dict[str, str]:
    """Dotted place -> its line, for each value the user set that the pipeline owns."""
    lines = {}
    sections = _sections(spec)
    for place, expected, how in _owned(spec, layout):
        value = get_path(sections, place)
        if value is not None and value != expected:
            dotted = ".".join(place)
            lines[dotted] = f"{spec.source}: {dotted}={value!r}: {how}"
    return lines


def _built_sections(spec: PipelineSpec, layout: RunLayout) -> tuple[dict[str, Any], list[str]]:
    """Every service section, completed with the run's values, built by the one config loader;
    a section with invalid fields is built with those at their defaults (left out when it cannot
    be), their problems are the lines."""
    from stacx.consumers.assembly import AssemblerApp
    from stacx.rollout.config import RolloutConfig
    from stacx.rollout.inference.router import RouterConfig
    from stacx.rollout.inference.serving import ServeConfig
    from stacx.sandbox.gateway import Gateway
    from stacx.trainer.config import TrainerConfig

    p = plan(spec, layout)
    built: dict[str, Any] = {}
    lines: list[str] = [f"{spec.source}: {line}" for line in [*placement(spec)[1], *_trainer_placement(spec)]]
    router = router_section(spec, layout, model_dir=p.model_dir)
    if router is not None:
        try:
            build(RouterConfig, router, where=f"{spec.source}: inference.router")
        except ConfigError as exc:
            lines += exc.lines
    for name, cls, data in (
        ("gateway", Gateway.Config, p.gateway),
        ("inference", ServeConfig, p.inference),
        ("rollout", RolloutConfig, p.rollout),
        ("assembler", AssemblerApp.Config, p.assembler["assembler"]),
        ("trainer", TrainerConfig, p.trainer),
    ):
        value, problems = build_partial(cls, data, where=f"{spec.source}: {name}")
        lines += problems
        if value is not None:  # with its invalid fields at their defaults: what it names is checked too
            built[name] = value
    return built, lines


def _trainer_placement(spec: PipelineSpec) -> list[str]:
    """A trainer section that contradicts `resources.trainer` (one rank per listed GPU, CUDA)."""
    gpus = spec.resources.trainer if spec.resources is not None else []
    backend = spec.trainer.get("backend") or {}
    if not gpus or not isinstance(backend, dict):
        return []
    lines = []
    if "world_size" in backend and backend["world_size"] != len(gpus):
        lines.append(f"trainer.backend.world_size={backend['world_size']!r} but resources.trainer lists "
                     f"{len(gpus)} GPU(s) (one rank each); drop world_size, the run sets it")
    if backend.get("device") == "cpu":
        lines.append("trainer.backend.device='cpu' but resources.trainer places it on GPUs; drop device")
    return lines


def _structural(spec: PipelineSpec, layout: RunLayout) -> tuple[dict[str, Any], list[str]]:
    """Wires, values the pipeline owns, and every section's types and values."""
    lines = wire_conflicts({"bootstrap_servers": spec.bootstrap_servers, **_sections(spec)}, spec.source)
    owned = _owned_conflicts(spec, layout)
    built, build_lines = _built_sections(spec, layout)
    prefix = f"{spec.source}: "
    fields = [line.removeprefix(prefix).split(": ", 1)[0] for line in build_lines]
    consequences = {  # a section left invalid by the owned value set there: said once, by `owned`
        line for line, field in zip(build_lines, fields, strict=True)
        if any(place == field or place.startswith(field + ".") for place in owned)
    }
    return built, [*lines, *owned.values(), *(line for line in build_lines if line not in consequences)]


def _semantic(spec: PipelineSpec, built: dict[str, Any], unchecked: set[str] | None = None) -> list[str]:
    """What the built sections name (recipe, plug-ins, budgets) and what the file points at
    (model, tasks, transcripts); `unchecked`: `pipeline` fields that were invalid (stood in for)."""
    unchecked = unchecked or set()
    if "*" in unchecked:
        return []
    lines: list[str] = []
    if "trainer" in built:
        lines += _recipe_problems(spec, built["trainer"])
    if "inference" in built:
        lines += _engine_problems(spec, built["inference"])
    if "rollout" in built:
        lines += _rollout_problems(spec, built["rollout"])
        if "assembler" in built:
            lines += _grouping_problems(spec, built["rollout"], built["assembler"])
    if "model" not in unchecked:
        lines += _model_problems(spec)
    if "tasks" not in unchecked:
        lines += _task_problems(spec, RunLayout.create(spec, now=0.0))
    if "transcripts" not in unchecked:
        lines += _transcript_problems(spec)
    return lines


def check_sections(
    spec: PipelineSpec, problems: list[str] | None = None, *, unchecked: set[str] | None = None
) -> None:
    """Raise PipelineConfigError listing every problem of the service sections (with
    `problems` of the file found before). When anything is wrong, everything is checked, so the
    report is complete: every type and semantic error of every section, one line each."""
    layout = RunLayout.create(spec, now=0.0)
    built, lines = _structural(spec, layout)
    lines = [*(problems or []), *lines]
    if lines:
        lines += _semantic(spec, built, unchecked)
        raise PipelineConfigError("\n".join(_unique(lines)))


# ------------------------------------------------------------------------------ before starting


def check_resolved(spec: PipelineSpec) -> None:
    """Resolve recipes, scaffolds, rewards, strategies, budgets, model and task paths; raise
    PipelineConfigError listing every problem. Reads files, starts nothing."""
    layout = RunLayout.create(spec, now=0.0)
    built, lines = _structural(spec, layout)
    lines += _semantic(spec, built)
    if lines:
        raise PipelineConfigError("\n".join(_unique(lines)))


def _unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def _recipe_problems(spec: PipelineSpec, config: Any) -> list[str]:
    from stacx.trainer import TrainerError, get_recipe
    from stacx.trainer.recipe import role_options_problems

    try:
        recipe = get_recipe(config.recipe)
    except TrainerError as exc:
        return [f"{spec.source}: trainer.recipe: {exc}"]
    options = role_options_problems(recipe, config.recipe, config.role_options)
    if options:
        return [f"{spec.source}: trainer.{line}" for line in options]
    if recipe.needs_greedy_row:  # the rollout samples every group at its evaluators' temperature
        return [f"{spec.source}: trainer.recipe: {config.recipe!r} needs one greedy (temperature 0) "
                "sample per prompt group as its baseline, and the pipeline's rollout samples none; "
                "use rloo or grpo here, or train it with `stacx train` on batches that carry one"]
    return []


def _rollout_problems(spec: PipelineSpec, config: Any) -> list[str]:
    """Resolve every plug-in (one line each, with its field path), then build the rollout manager
    as the service will, on fakes: the resource budget is checked exactly as at start."""
    lines = [f"{spec.source}: rollout.{line}" for line in plugin_problems(config)]
    if lines:
        return lines
    problem = rollout_config_problem(config)
    return [f"{spec.source}: rollout: {problem}"] if problem else []


def _engine_problems(spec: PipelineSpec, config: Any) -> list[str]:
    """The inference engine imports and has an engine factory's signature (a plug-in engine's
    module is imported here, not first in the server process)."""
    from stacx.rollout.inference.serving import ENGINES
    from stacx.schemas.plugins import PluginError

    try:
        ENGINES.resolve(config.engine)
    except PluginError as exc:
        return [f"{spec.source}: inference.engine: {exc}"]
    return []


def _grouping_problems(spec: PipelineSpec, rollout: Any, assembler: Any) -> list[str]:
    n, group = rollout.data.samples_per_task, assembler.grouping.group_size
    places = WIRES["group_size"].places
    if n == group or all(get_path(_sections(spec), place) is not None for place in places):
        return []  # both set by the user: the wire conflict says so
    return [
        f"{spec.source}: assembler.grouping.group_size={group} but rollout.data.samples_per_task={n}: "
        "a group is the samples of one task; set both to the same number"
    ]


def _model_problems(spec: PipelineSpec) -> list[str]:
    lines = []
    model = spec.pipeline.model
    if model.path is not None:
        problem = model_problem(resolve_path(model.path, spec.base_dir), "pipeline.model.path")
        if problem:
            lines.append(f"{spec.source}: {problem}")
    tokenizer = get_path(spec.rollout, ("inference", "tokenizer"))
    if tokenizer:
        problem = tokenizer_problem(
            resolve_path(str(tokenizer), spec.base_dir), "rollout.inference.tokenizer"
        )
        if problem:
            lines.append(f"{spec.source}: {problem}")
    return lines


def _task_problems(spec: PipelineSpec, layout: RunLayout) -> list[str]:
    tasks = spec.pipeline.tasks
    lines = []
    data = task_data(spec, layout)
    if tasks.source is not None:
        lines += _source_problems(spec)
    elif tasks.harbor is not None:
        lines += harbor_problems(Path(data["task_dirs"]), "pipeline.tasks.harbor")
    elif tasks.jsonl is not None:
        lines += jsonl_problems(Path(data["path"]), "pipeline.tasks.jsonl")
    if tasks.heldout is not None:
        path = resolve_path(tasks.heldout, spec.base_dir)
        check = jsonl_problems if path.is_file() else harbor_problems
        lines += check(path, "pipeline.tasks.heldout")
    return [f"{spec.source}: {line}" for line in lines]


def _source_problems(spec: PipelineSpec) -> list[str]:
    """The task-source plug-in imports, builds with its options, and can warm-start `sft`."""
    from stacx.rollout.data import build_task_set
    from stacx.rollout.errors import ConfigError as RolloutConfigError

    tasks, cfg = spec.pipeline.tasks, spec.pipeline
    assert tasks.source is not None
    try:
        task_set = build_task_set(tasks.source, tasks.options)
    except RolloutConfigError as exc:
        return [f"pipeline.tasks.source: {exc}"]
    lines = _source_row_problems(task_set, tasks.source)
    if lines:
        return lines
    demonstrates = callable(getattr(task_set, "demonstration", None))
    if cfg.sft is not None and cfg.transcripts is None and not demonstrates:
        return [
            f"pipeline.sft: the task source {tasks.source!r} has no demonstration(rng, *, skill); "
            "set `pipeline.transcripts`, or remove `pipeline.sft`"
        ]
    return []


def _source_row_problems(task_set: Any, ref: str) -> list[str]:
    """Every row `train_tasks()` (and `heldout_tasks()`) returns is a task: all bad rows at once."""
    from stacx.rollout.data import row_problems

    lines = []
    for method in ("train_tasks", "heldout_tasks"):
        produce = getattr(task_set, method, None)
        if not callable(produce):
            continue
        what = f"pipeline.tasks.source: {ref}.{method}()"
        try:
            rows = list(produce() or [])
        except Exception as exc:  # the user's source: one line, not a traceback
            lines.append(f"{what} raised {first_line(exc)}")
            continue
        lines += bad_row_lines(row_problems(rows, where=f"{ref}.{method}()"), "pipeline.tasks.source", "row")
    return lines


def transcript_adapter(spec: PipelineSpec) -> Any:
    """The black-box scaffold adapter that renders `pipeline.transcripts` (its evaluator's)."""
    from stacx.rollout.blackbox.adapter import build_external, is_external

    transcripts = spec.pipeline.transcripts
    assert transcripts is not None
    evaluators = get_path(spec.rollout, ("manager", "evaluators")) or {}
    evaluator = evaluators.get(transcripts.evaluator)
    if not isinstance(evaluator, dict):
        raise ConfigError(
            f"pipeline.transcripts.evaluator: {transcripts.evaluator!r} is not an evaluator of "
            f"rollout.manager.evaluators ({sorted(evaluators)})"
        )
    scaffold = str(evaluator.get("scaffold", ""))
    if not is_external(scaffold):
        raise ConfigError(
            f"pipeline.transcripts: evaluator {transcripts.evaluator!r} runs scaffold {scaffold!r}; "
            "transcripts are for black-box scaffolds (e.g. mini-swe-agent)"
        )
    return build_external(scaffold, evaluator.get("scaffold_options") or {})


def _transcript_problems(spec: PipelineSpec) -> list[str]:
    """The transcripts file reads, each row has its fields, the first renders as the first call."""
    from stacx.rollout.errors import ConfigError as RolloutConfigError

    transcripts = spec.pipeline.transcripts
    if transcripts is None:
        return []
    path = resolve_path(transcripts.path, spec.base_dir)
    where = f"{spec.source}: pipeline.transcripts.path: {path}"
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        return [f"{where}: cannot read it ({exc.strerror})"]
    except ValueError as exc:
        return [f"{where}: not JSONL ({exc})"]
    bad = [
        i
        for i, r in enumerate(rows)
        if not isinstance(r, dict) or not {"instruction", "answer", "kind"} <= set(r)
    ]
    if not rows or bad:
        which = f"row {bad[0] + 1}" if bad else "no rows"
        return [f"{where}: {which}; each row needs instruction, answer and kind (expert or novice)"]
    try:
        transcript_adapter(spec).first_messages(str(rows[0]["instruction"]))
    except (ConfigError, RolloutConfigError) as exc:
        return [f"{spec.source}: {exc}"]
    return []
