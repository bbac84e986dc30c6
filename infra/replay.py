"""Replay runs (`stacx replay CONFIG`): train again from a retained trajectories topic, into a run of its own.

Reads a range of the source topic (offsets, or times resolved with `offsets_for_times`),
assembles it deterministically (`stacx.consumers.replay`), publishes the batches to
`stacx.batches.<name>` and trains on them with any recipe and seed, publishing weights to
`stacx.weights.<name>`. Writes `<runs_dir>/<name>/replay.json`: range, batch ids, the sha256 of
every batch, the final weights' content hash."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stacx.consumers.replay import ReplayAssembler, ReplayRange, ReplayResult
from stacx.producers.kafka_log import kafka_logger
from stacx.schemas.topics import TopicPolicy


@dataclass(kw_only=True, slots=True)
class ReplaySettings:
    """The `replay:` section."""

    name: str
    """Run id of the replay: its topics are `stacx.batches.<name>` and `stacx.weights.<name>`."""
    source_topic: str
    """Retained trajectories topic to replay (e.g. `stacx.trajectories.<run id>`)."""
    from_offset: int | None = None
    to_offset: int | None = None
    from_timestamp_ms: int | None = None
    to_timestamp_ms: int | None = None
    runs_dir: str = "runs"
    """Checkpoints, exported weights and replay.json go to `<runs_dir>/<name>/`."""


@dataclass(kw_only=True, slots=True)
class ReplayFile:
    """A replay YAML: what to replay, how to assemble it, how to train on it."""

    replay: ReplaySettings
    bootstrap_servers: str | None = None
    """Kafka bootstrap servers (default: $STACX_KAFKA, else 127.0.0.1:9092)."""
    topics: TopicPolicy = field(default_factory=TopicPolicy)
    """How the replay's batches and weights topics are created."""
    assembler: ReplayAssembler.Config = field(default_factory=ReplayAssembler.Config)
    """Grouping, filtering, mixture (the live assembler's settings)."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """`stacx train` config (TrainerConfig); source, export and checkpoint are the replay's."""


def run_replay(spec: ReplayFile, *, base_dir: Path) -> dict[str, Any]:
    """Assemble, publish, train; the summary also written to `<runs_dir>/<name>/replay.json`."""
    from stacx.infra.config import bootstrap_servers
    from stacx.infra.pipeline.layout import RunTopics
    from stacx.infra.services.topics import ensure_topics

    bootstrap = str(spec.bootstrap_servers or bootstrap_servers({}))
    cfg = spec.replay
    check_role_options(spec.trainer)
    run = RunTopics.for_run(cfg.name, fresh=True)
    _refuse_existing(bootstrap, [run.batches, run.weights], cfg.name)
    source = ReplayRange(
        topic=cfg.source_topic, from_offset=cfg.from_offset, to_offset=cfg.to_offset,
        from_timestamp_ms=cfg.from_timestamp_ms, to_timestamp_ms=cfg.to_timestamp_ms,
    )  # fmt: skip
    result, num_records = _assemble(bootstrap, source, spec.assembler, run.batches)
    batches = result.batches
    if not batches:
        raise ValueError(f"the range of {cfg.source_topic} gave no batch ({num_records} records): widen it")
    check_vocabulary(spec.trainer, result.max_token_id, cfg.source_topic)
    ensure_topics(  # after the checks: a refused replay leaves nothing behind
        bootstrap,
        tuple(s for s in run.specs(spec.topics) if s.name in (run.batches, run.weights)),
        spec.topics,
    )
    _publish(bootstrap, run.batches, batches, result.headers)
    root = Path(cfg.runs_dir) / cfg.name
    trainer = _trainer_config(spec, bootstrap, run, root, num_batches=len(batches))
    from stacx.trainer import StacxTrainer

    StacxTrainer.launch(trainer)
    summary = {
        "run": cfg.name,
        "source_topic": cfg.source_topic,
        "records": num_records,
        "undecodable": result.undecodable,
        "batches": len(batches),
        "batch_ids": [b for b, _ in batches],
        "batch_sha256": [hashlib.sha256(v).hexdigest() for _, v in batches],
        "recipe": trainer.recipe,
        "seed": trainer.seed,
        "weights_topic": run.weights,
        "final_weights": _final_weights(bootstrap, run.weights, trainer.export.model_name),
        "assembler_stats": result.stats,
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "replay.json").write_text(json.dumps(summary, indent=2))
    return summary


def check_role_options(trainer: dict[str, Any]) -> None:
    """Every `trainer.role_options` entry names a role of the recipe and a field of that role's
    specialization (else one line naming it, before anything runs)."""
    name = str(trainer.get("recipe", "grpo"))
    roles = _recipe_options(name)
    if roles is None:  # not a registered name (a plug-in path): the trainer checks it itself
        return
    for role, options in (trainer.get("role_options") or {}).items():
        if role not in roles:
            raise ValueError(f"trainer.role_options.{role}: recipe {name!r} has no role {role!r} "
                             f"(its roles: {', '.join(sorted(roles))})")  # fmt: skip
        for option in options or {}:
            if option not in roles[role]:
                raise ValueError(
                    f"trainer.role_options.{role}.{option}: recipe {name!r} has no such option for "
                    f"role {role} (its options: {', '.join(sorted(roles[role]))}); remove it"
                )


def role_options_for(recipe: str, options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The `role_options` of another recipe's config that `recipe` accepts, and the dropped ones
    (`role.option`): what `--recipe` keeps of the file's options."""
    roles = _recipe_options(recipe)
    if roles is None:
        return options, []
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for role, values in options.items():
        accepted = roles.get(role, set())
        kept_values = {k: v for k, v in (values or {}).items() if k in accepted}
        dropped += [f"{role}.{k}" for k in (values or {}) if k not in accepted]
        if kept_values:
            kept[role] = kept_values
    return kept, dropped


def _recipe_options(recipe: str) -> dict[str, set[str]] | None:
    """The option names (specialization fields) of each role of a registered recipe; None when
    `recipe` is no registered name."""
    from stacx.trainer.errors import TrainerError
    from stacx.trainer.recipe import get_recipe

    try:
        roles = get_recipe(recipe).roles
    except TrainerError:
        return None
    specializations: dict[str, Any] = {r.name: r.specialization for r in roles}
    return {name: {f.name for f in dataclasses.fields(spec)} for name, spec in specializations.items()}


def check_vocabulary(trainer: dict[str, Any], max_token_id: int, source: str) -> None:
    """Every token model of the trainer has room for the replayed token ids (else one line)."""
    from stacx.infra.config import build
    from stacx.trainer import TrainerConfig
    from stacx.trainer.errors import TrainerError
    from stacx.trainer.recipe import get_recipe

    config = build(TrainerConfig, dict(trainer), where="trainer")
    try:
        slots = get_recipe(config.recipe).models
    except TrainerError:
        return
    for slot in slots:
        model = config.models.get(slot.init)
        if slot.head == "flow" or model is None:
            continue
        vocab = _vocab_size(model)
        if vocab is not None and max_token_id >= vocab:
            raise ValueError(
                f"trainer.models.{slot.init}: its vocabulary has {vocab} tokens but {source} holds token "
                f"id {max_token_id}: train a model with the source run's tokenizer (`path:` its base "
                f"model, or `tiny: {{vocab_size: {max_token_id + 1}}}` at least)"
            )


def _vocab_size(model: Any) -> int | None:
    if model.tiny is not None:
        from stacx.trainer.models import TINY_QWEN2

        return int({**TINY_QWEN2, **model.tiny}["vocab_size"])
    config = Path(str(model.path)) / "config.json"
    try:
        return int(json.loads(config.read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):  # the trainer reports a bad model path itself
        return None


def _refuse_existing(bootstrap: str, names: list[str], run: str) -> None:
    from stacx.infra.services.topics import missing_topics

    missing = missing_topics(bootstrap, names)
    if missing is None:
        raise ValueError(f"no Kafka broker answers at {bootstrap}")
    if len(missing) != len(names):
        raise ValueError(
            f"replay.name={run!r}: its topics exist already; pick another name or delete them "
            f"(`stacx topics gc --run {run}`)"
        )


def _assemble(
    bootstrap: str, source: ReplayRange, config: ReplayAssembler.Config, batches_topic: str
) -> tuple[ReplayResult, int]:
    from stacx.consumers.replay import read_range
    from stacx.schemas.catalogue import SchemaCatalogue, catalogue_codec

    records = read_range(bootstrap, source)
    codec = catalogue_codec(SchemaCatalogue.Config(bootstrap_servers=bootstrap))
    result = ReplayAssembler(config, codec, batches_topic=batches_topic).assemble(records)
    return result, len(records)


def _publish(
    bootstrap: str, topic: str, batches: list[tuple[str, bytes]], headers: dict[str, list[tuple[str, bytes]]]
) -> None:
    from confluent_kafka import Producer

    from stacx.schemas.topics import BATCHES_MAX_MESSAGE_BYTES

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "message.max.bytes": BATCHES_MAX_MESSAGE_BYTES,
            "logger": kafka_logger(),
        }
    )
    for batch_id, value in batches:
        described: Any = headers.get(batch_id) or None
        producer.produce(topic, key=batch_id.encode(), value=value, headers=described)
    if producer.flush(60) != 0:
        raise ValueError(f"could not publish every batch to {topic} within 60 s")


def _trainer_config(spec: ReplayFile, bootstrap: str, run: Any, root: Path, *, num_batches: int) -> Any:
    from stacx.infra.config import build
    from stacx.trainer import TrainerConfig

    tree = dict(spec.trainer)
    config = build(TrainerConfig, tree, where="trainer")
    config.source = dataclasses.replace(
        config.source, kind="kafka", bootstrap_servers=bootstrap, topic=run.batches,
        group_id=f"stacx-trainer-{spec.replay.name}", replay_from_offset=None, replay_from_timestamp_ms=None,
        idle_timeout_s=config.source.idle_timeout_s or 30.0,
    )  # fmt: skip
    config.export = dataclasses.replace(
        config.export, dir=str((root / "weights").resolve()), topic=run.weights, bootstrap_servers=bootstrap,
        publish=True,
    )  # fmt: skip
    config.checkpoint = dataclasses.replace(config.checkpoint, dir=str((root / "checkpoints").resolve()))
    config.max_steps = config.max_steps or num_batches
    config.trainer_id = f"stacx-trainer-{spec.replay.name}"
    return config


def _final_weights(bootstrap: str, topic: str, model_name: str) -> dict[str, Any] | None:
    """The newest WeightVersion of `model_name` on the replay's weights topic."""
    from stacx.consumers.replay import ReplayRange, read_range
    from stacx.schemas.codec import Codec
    from stacx.schemas.records import WeightVersion

    codec = Codec()
    latest: WeightVersion | None = None
    for record in read_range(bootstrap, ReplayRange(topic=topic)):
        value = codec.decode(record.value)
        if isinstance(value, WeightVersion) and value.model_name == model_name:
            if latest is None or value.version > latest.version:
                latest = value
    if latest is None:
        return None
    return {"version": latest.version, "content_hash": latest.content_hash, "path": latest.path}
