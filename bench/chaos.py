"""Chaos soak: the quickstart pipeline, with its shipped defaults (failure policy, staleness
filter, restart budget), runs while a seeded schedule kills its services; an audit of the topics,
checkpoints and server logs then says whether anything was lost or trained twice.

The soak runs on a broker of its own (`--broker private`, the default): the jars `stacx infra up`
installed, its own `STACX_HOME`, data directory and loopback ports, stopped by its pid at the end.
Its services inherit that environment, so nothing of the user's broker, topics or groups is
touched. `--broker shared --no-broker-restarts` runs on the configured broker instead; the shared
broker is never restarted.

Every `--interval-s` (jittered) one victim is chosen with `--seed`: kill -9 of the trainer's whole
process group (launcher and ranks), of its launcher alone, or of one rank alone; of the assembler,
the rollout service, the sandbox gateway or the inference server; or a restart of the soak's
broker (SIGTERM by its pid, then `up` again). A victim whose restart budget (`max_restarts` within
`window_s`) would be spent by another kill is passed over: the schedule tests recovery, not the
budget. The pipeline's supervisor restarts the services. After `--minutes` the run finishes (final
swap, held-out evaluation, shutdown) and the audit reads:

  trajectories  every (group, sample slot) published to the run's trajectories topic
  batches       every TrainingBatch of the run's batches topic (trajectory ids per batch)
  dlq           dead letters whose source is the run's trajectories topic (the assembler's) or
                its batches topic (the trainer's)
  assembler     its committed offsets on the trajectories and groups topics (what lies past them is
                in open or pooled groups at the end: the next worker reads it again) and the
                changelog of its `groups` table (each closed group's verdicts: filtered samples
                are not lost)
  trainer       the final checkpoint's lineage (trained batch ids) and its committed offset on the
                batches topic (batches past it were not trained yet: the next trainer reads them)
  weights       the run's WeightVersion announcements, in order
  servers       the versions each inference server loaded (its weight subscriber's log lines;
                `logs/inference.log`, or `logs/<host>/inference.log` of each host of a cluster)

Counts: `lost` (a published slot in no trained batch, not dead-lettered, not filtered, not pending
in the assembler or the trainer), `trained_twice` (a batch id twice in the lineage, or a
trajectory id in two trained batches), `trainer_dead_letters` (batches the trainer set aside),
`version_regressions` (a version below an earlier one, or a version announced with two content
hashes), `repeated_versions` (the same version and hash announced again after a crash: ignored by
subscribers), `served_regressions` (a server loaded a version below one it loaded before),
`served_unannounced` (a server loaded a version, or a path, never announced), `served_behind`
(the last version announced minus the last one a server loaded), `orphans` (processes of the run
alive after shutdown, by their STACX_RUN_ID), `leaked_containers` (sandboxes with the run's owner
label after shutdown). `filtered` counts samples the assembler dropped by policy (failed
episodes, e.g. while the gateway was down) and `pending_at_end` those still in open or pooled
groups, or in batches not trained yet, when the run stopped. A topic the audit cannot read to its
end fails the audit (never a count over partial data).

    .venv/bin/python bench/chaos.py --json --minutes 10 [--seed 0] [--interval-s 30]

Last stdout line: the JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stacx.infra.pipeline import load_spec  # noqa: E402
from stacx.infra.pipeline.layout import service_logs  # noqa: E402
from stacx.infra.pipeline.orchestrator import TRAINING, Pipeline  # noqa: E402

log = logging.getLogger("stacx.chaos")

REPO = Path(__file__).resolve().parents[1]
VICTIMS = ("trainer", "trainer-launcher", "trainer-rank", "assembler", "rollout", "gateway", "inference")
"""`trainer`: its process group (launcher and ranks); `trainer-launcher`: the launcher alone;
`trainer-rank`: one rank alone; the others: the service's process group."""
SERVICE_OF = {"trainer-launcher": "trainer", "trainer-rank": "trainer"}


class AuditError(RuntimeError):
    """The audit could not read what it counts (a topic not read to its end)."""


# --------------------------------------------------------------------------------- the schedule


class Chaos:
    """Kills services of a running `Pipeline` on a seeded schedule."""

    def __init__(self, pipeline: Pipeline, *, seed: int, interval_s: float, broker: bool,
                 victims: tuple[str, ...] = VICTIMS) -> None:
        self.pipeline = pipeline
        self.rng = random.Random(seed)
        self.interval_s = interval_s
        self.victims = (*victims, "broker") if broker else victims
        self.kills: Counter[str] = Counter()
        self.broker_restarts = 0
        self.events: list[dict[str, Any]] = []
        self._recent: dict[str, deque[float]] = defaultdict(deque)

    def run(self, until: float, stop: threading.Event) -> None:
        """Strike until `until`. The first strike past a third of the time kills a lone trainer
        rank if the draw has not yet (when ranks are among the victims); the first past the
        half-way mark restarts the broker if the draw has not yet (when it is among them)."""
        start = time.monotonic()
        third, halfway = start + (until - start) / 3, start + (until - start) / 2
        while not stop.is_set() and time.monotonic() < until:
            if stop.wait(self.interval_s * self.rng.uniform(0.6, 1.4)):
                return
            now = time.monotonic()
            if now >= until:
                return
            victim = self.rng.choice(self.victims)
            if "trainer-rank" in self.victims and not self.kills["trainer-rank"] and now >= third:
                victim = "trainer-rank"
            if "broker" in self.victims and not self.broker_restarts and now >= halfway:
                victim = "broker"
            self.strike(self._within_budget(victim))

    def _within_budget(self, victim: str) -> str:
        """`victim`, or another one when one more kill could spend its service's restart budget
        (the supervisor fails the run then: that is the budget working, not a recovery to test)."""
        policy = self.pipeline.supervisor.policy
        now = time.monotonic()
        for recent in self._recent.values():
            while recent and now - recent[0] >= policy.window_s:
                recent.popleft()
        usable = [v for v in self.victims
                  if v == "broker" or len(self._recent[SERVICE_OF.get(v, v)]) < policy.max_restarts - 1]
        return victim if victim in usable or not usable else self.rng.choice(usable)

    def strike(self, victim: str) -> None:
        started = time.monotonic()
        if victim == "broker":
            restart_broker()
            self.broker_restarts += 1
        else:
            name = SERVICE_OF.get(victim, victim)
            service = self.pipeline.services.get(name)
            if service is None or not service.alive() or service.pid is None:
                return
            if victim == "trainer-rank":
                ranks = rank_pids(service.pid)
                if not ranks:
                    return  # between two launches: no ranks yet
                os.kill(self.rng.choice(ranks), signal.SIGKILL)
            elif victim == "trainer-launcher":
                os.kill(service.pid, signal.SIGKILL)  # the ranks are left to notice
            else:
                os.killpg(service.pid, signal.SIGKILL)  # the service and what it spawned (ranks)
            self.kills[victim] += 1
            self._recent[name].append(time.monotonic())
        m = self.pipeline.metrics
        self.events.append({"victim": victim, "at_version": m.policy_version,
                            "took_s": round(time.monotonic() - started, 1)})
        log.warning("chaos: %s at policy version %d", victim, m.policy_version)


def rank_pids(launcher: int) -> list[int]:
    """The trainer's ranks: the launcher's children started by multiprocessing's spawn (not its
    resource tracker)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher and b"spawn_main" in cmdline:
            found.append(int(proc.name))
    return found


# --------------------------------------------------------------------------------- the broker


_PRIVATE_HOME: list[Path] = []
"""The STACX_HOME of the broker this process started (restarts go to that one only)."""


@contextlib.contextmanager
def private_broker(heap: str = "512m") -> Iterator[str]:
    """A broker of the soak's own: the jars `stacx infra up` installed (linked), a fresh
    STACX_HOME with its own data directory, log and pid file, free loopback ports. This process
    and the services it starts see it through the environment (STACX_HOME, STACX_KAFKA,
    STACX_KAFKA_PORT, STACX_KAFKA_CONTROLLER_PORT). Stopped by its pid and removed at the end."""
    from stacx.infra.services import kafka
    from stacx.infra.services.errors import InfraError
    from stacx.infra.services.topics import ensure_topics

    jars = kafka.jar_dir()
    if not (jars / ".complete").exists():
        raise InfraError(f"no Kafka jars in {jars}: run `.venv/bin/stacx infra up` once")
    saved = {k: os.environ.get(k) for k in ("STACX_HOME", "STACX_KAFKA", "STACX_KAFKA_PORT",
                                             "STACX_KAFKA_CONTROLLER_PORT")}
    with tempfile.TemporaryDirectory(prefix="stacx-chaos-broker-") as root:
        home = Path(root)
        config = kafka.KafkaConfig(port=_free_port(), controller_port=_free_port(), heap=heap)
        os.environ.update(STACX_HOME=str(home), STACX_KAFKA=config.bootstrap,
                          STACX_KAFKA_PORT=str(config.port),
                          STACX_KAFKA_CONTROLLER_PORT=str(config.controller_port))
        _PRIVATE_HOME.append(home)
        try:
            kafka.jar_dir().parent.mkdir(parents=True)
            kafka.jar_dir().symlink_to(jars)
            log.warning("chaos: private broker: %s (STACX_HOME %s)", kafka.up(config), home)
            ensure_topics(config.bootstrap)
            yield config.bootstrap
        finally:
            log.warning("chaos: private broker: %s", kafka.down())
            _PRIVATE_HOME.remove(home)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def restart_broker(down_s: float = 5.0) -> None:
    """Stop the soak's own broker (by its pid file), wait, start it again. Refuses any other
    broker: a restart breaks every client of that broker."""
    from stacx.infra import paths
    from stacx.infra.services import kafka
    from stacx.infra.services.processes import stop_pid

    if not _PRIVATE_HOME or paths.stacx_home() != _PRIVATE_HOME[-1]:
        raise RuntimeError("chaos: the broker restart is only for the soak's own broker "
                           "(`--broker private`)")
    pid = kafka.running_pid()
    if pid is None:
        raise RuntimeError(f"no broker recorded in {kafka.pid_file()}")
    stop_pid(pid, timeout_s=60)
    kafka.pid_file().unlink(missing_ok=True)
    time.sleep(down_s)
    # a loaded machine can take minutes to bring a broker back: wait as long as it takes
    log.warning("chaos: %s", kafka.up(kafka.KafkaConfig(start_timeout_s=600.0)))


# --------------------------------------------------------------------------------- reading topics


def read_topic(bootstrap: str, topic: str, timeout_s: float = 120.0) -> list[Any]:
    """Every record of `topic` from the beginning to its end when the read began (confluent
    Message list); [] for a topic that does not exist. AuditError when some partition was not
    read to that end within `timeout_s`: the caller never counts over partial data."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"stacx-chaos-audit-{os.getpid()}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=timeout_s)[1] for p in parts}
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign(parts)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is None:
                out.append(msg)
            if msg.offset() is not None and msg.offset() + 1 >= ends.get(msg.partition(), 0):
                todo.discard(msg.partition())
        if todo:
            short = {p: ends[p] for p in sorted(todo)}
            raise AuditError(f"read_topic: {topic}: partitions {sorted(todo)} not read to their end "
                             f"(end offsets {short}) within {timeout_s:.0f}s; {len(out)} records read")
        return out
    finally:
        consumer.close()


def _latest_by_key(messages: list[Any]) -> dict[Any, Any]:
    """A changelog's table: the latest value per key (tombstones delete)."""
    table: dict[Any, Any] = {}
    for msg in messages:
        key = json.loads(msg.key()) if msg.key() else None
        if msg.value() is None:
            table.pop(key, None)
        else:
            table[key] = msg.value()
    return table


def _committed_offsets(bootstrap: str, group: str, topic_names: list[str]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the consumer group's committed offset (partitions without one left out)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    known = admin.list_topics(timeout=30).topics
    parts = [TopicPartition(t, p) for t in topic_names if t in known for p in known[t].partitions]
    if not parts:
        return {}
    answer = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)])
    found = answer[group].result(timeout=30).topic_partitions
    return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}


# --------------------------------------------------------------------------------- the audit


Slot = tuple[str, int]


def audit(pipeline: Pipeline) -> dict[str, Any]:
    """Counts over the run's topics, the assembler's changelogs, the trainer's lineage and
    committed offset, and the inference server's loads."""
    from stacx.consumers.assembly.claims import decode_trajectory
    from stacx.consumers.assembly.envelope import decode_group
    from stacx.schemas import topics
    from stacx.schemas.codec import decode
    from stacx.schemas.records import DeadLetter, TrainingBatch, WeightVersion

    bootstrap, run = pipeline.spec.bootstrap_servers, pipeline.layout
    app_id = f"stacx-assembler-{run.run_id}"
    unread = _committed_offsets(bootstrap, app_id, [run.topics.trajectories, f"{app_id}-groups"])
    slots: dict[Slot, set[str]] = defaultdict(set)
    pending: set[Slot] = set()
    for msg in read_topic(bootstrap, run.topics.trajectories):
        t = decode_trajectory(msg.value())
        slots[(t.group_id, t.sample_index)].add(t.trajectory_id)
        if msg.offset() >= unread.get((msg.topic(), msg.partition()), 0):
            pending.add((t.group_id, t.sample_index))  # in an open group, or not read yet
    id_slot = {tid: slot for slot, ids in slots.items() for tid in ids}

    def slots_of(batch: TrainingBatch) -> set[Slot]:
        return {id_slot[tid] for tid in batch.trajectory_ids if tid in id_slot}

    trainer_read = _committed_offsets(bootstrap, f"stacx-trainer-{run.run_id}", [run.topics.batches])
    batches: dict[str, TrainingBatch] = {}
    untrained_yet: set[str] = set()  # past the trainer's committed offset: read again next time
    for msg in read_topic(bootstrap, run.topics.batches):
        batch = decode(msg.value(), TrainingBatch)
        batches[batch.batch_id] = batch
        if msg.offset() >= trainer_read.get((msg.topic(), msg.partition()), 0):
            untrained_yet.add(batch.batch_id)
    lineage = _lineage(pipeline)
    trained = set(lineage) & set(batches)
    trained_slots = {s for bid in trained for s in slots_of(batches[bid])}
    batched_slots = {s for b in batches.values() for s in slots_of(b)}
    pending |= {s for bid in untrained_yet - trained for s in slots_of(batches[bid])}

    dead: set[Slot] = set()
    trainer_letters: list[str] = []
    for msg in read_topic(bootstrap, topics.DLQ):
        letter = decode(msg.value(), DeadLetter)
        if not letter.value:
            continue
        try:
            if letter.source_topic == run.topics.trajectories:
                t = decode_trajectory(letter.value)
                dead.add((t.group_id, t.sample_index))
            elif letter.source_topic == run.topics.batches:
                trainer_letters.append(letter.reason)
                dead |= slots_of(decode(letter.value, TrainingBatch))
        except Exception:  # a letter whose value is the undecodable record itself
            continue
    groups = {k: json.loads(v) for k, v in
              _latest_by_key(read_topic(bootstrap, f"{app_id}-groups-changelog")).items()}
    pooled = {decode_group(m.value()).group_id for m in read_topic(bootstrap, f"{app_id}-groups")
              if m.value() and m.offset() >= unread.get((m.topic(), m.partition()), 0)}
    filtered = set()
    dropped = {k: v for path in service_logs(pipeline.layout.logs_dir, "assembler.log")
               for k, v in dropped_groups(path).items()}
    for slot in slots:
        record = groups.get(slot[0])
        if slot[0] in pooled:
            pending.add(slot)
        elif slot[0] in dropped:  # dropped whole by the staleness filter or the partial policy
            filtered.add(slot)
        elif record is not None:
            verdicts = {m[0]: m[1] for m in record["members"].values()}
            if verdicts.get(slot[1]) not in (None, "keep", "flag"):
                filtered.add(slot)
    lost = [s for s in slots if s not in trained_slots and s not in dead and s not in pending
            and s not in filtered]
    in_lineage = Counter(lineage)
    trained_ids = Counter(tid for bid in trained for tid in set(batches[bid].trajectory_ids))
    announced = [decode(m.value(), WeightVersion) for m in read_topic(bootstrap, run.topics.weights)]
    announced = [v for v in announced if v.model_name == run.model_name]
    regressions, repeats, hashes, top = 0, 0, {}, 0
    for v in announced:
        known = hashes.setdefault(v.version, v.content_hash)
        if v.version < top or known != v.content_hash:
            regressions += 1
        elif v.version == top:
            repeats += 1
        top = max(top, v.version)
    return {
        "trajectories": sum(len(ids) for ids in slots.values()),
        "slots": len(slots),
        "regenerated": sum(len(ids) - 1 for ids in slots.values()),
        # sample slots (group, index) generated more than once: by two workers after a
        # rebalance, or again after a lost host (goal 0; the assembler keeps one of each)
        "duplicate_slots": sum(1 for ids in slots.values() if len(ids) > 1),
        "batches": len(batches),
        "batched_slots": len(batched_slots),
        "trained_slots": len(trained_slots),
        "dead_lettered": len(dead),
        "trainer_dead_letters": len(trainer_letters),
        "trainer_dead_letter_reasons": sorted(set(trainer_letters))[:5],
        "filtered": len(filtered),
        "groups_dropped": dict(Counter(dropped.values())),
        "pending_at_end": len(pending - trained_slots),
        "untrained_batches_at_end": len(untrained_yet - trained),
        "lost": len(lost),
        "lost_examples": [list(s) for s in lost[:5]],
        "lost_batched_untrained": sum(1 for s in lost if s in batched_slots),
        "trained_batches": len(in_lineage),
        "trained_twice": sum(n - 1 for n in in_lineage.values() if n > 1)
        + sum(1 for n in trained_ids.values() if n > 1),
        "versions_announced": len(announced),
        "version_regressions": regressions,
        "repeated_versions": repeats,
        # false when steps left the weights unchanged (all-zero advantages): not a conflict
        "distinct_contents": len(set(hashes.values())) == len(hashes),
        **served_by_servers(pipeline.layout.logs_dir, run.model_name, announced),
    }


def served_by_servers(logs_dir: Path, model_name: str, announced: list[Any]) -> dict[str, Any]:
    """`served_versions` of every inference server's log: loads, regressions and unannounced
    loads summed, `served_last` the newest any server loaded, `served_behind` that of the server
    closest to the last announcement (a host lost mid-run stops loading), `served_last_by_log`."""
    found = {str(p.relative_to(logs_dir)): served_versions(p, model_name, announced)
             for p in service_logs(logs_dir, "inference.log")}
    if not found:
        return served_versions(logs_dir / "inference.log", model_name, announced)
    each = list(found.values())
    return {
        "server_loads": sum(s["server_loads"] for s in each),
        "served_last": max(s["served_last"] for s in each),
        "served_regressions": sum(s["served_regressions"] for s in each),
        "served_unannounced": sum(s["served_unannounced"] for s in each),
        "served_behind": min(s["served_behind"] for s in each),
        "served_last_by_log": {name: s["served_last"] for name, s in found.items()},
    }


_DROPPED = re.compile(r"group (?P<group>\S+) of \S+ dropped: (?P<reason>[a-z ]+)")


def dropped_groups(log_path: Path) -> dict[str, str]:
    """{group id: why} of the groups the assembler dropped whole, from its own lines (one per
    group, across every restart; `stacx.consumers.assembly.stats.DROPPED_LINE`)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    found = (_DROPPED.search(line) for line in lines)
    return {m["group"]: m["reason"].strip() for m in found if m}


_LOADED = re.compile(r"server \S+ now serves (?P<model>\S+) v(?P<version>\d+) \((?P<path>.*)\)\s*$")


def served_versions(log_path: Path, model_name: str, announced: list[Any]) -> dict[str, Any]:
    """What the inference server loaded, from its weight subscriber's lines (one per confirmed
    load, across every restart of the server): regressions, loads of versions or paths never
    announced, and how far the last load is behind the last announcement."""
    loads = []
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        match = _LOADED.search(line)
        if match and match["model"] == model_name:
            loads.append((int(match["version"]), match["path"]))
    known = {(v.version, v.path) for v in announced}
    regressions = sum(1 for i, (version, _) in enumerate(loads) if any(version < p for p, _ in loads[:i]))
    last_announced = max((v.version for v in announced), default=0)
    last_loaded = loads[-1][0] if loads else 0
    return {
        "server_loads": len(loads),
        "served_last": last_loaded,
        "served_regressions": regressions,
        "served_unannounced": sum(1 for load in loads if load not in known),
        "served_behind": max(0, last_announced - last_loaded),
    }


def _lineage(pipeline: Pipeline) -> list[str]:
    root = pipeline.layout.checkpoints_dir
    marker = root / "latest"
    if not marker.is_file():
        return []
    state = json.loads((root / marker.read_text().strip() / "trainer_state.json").read_text())
    return list(state["trained_batch_ids"])


def orphans(run_id: str) -> list[int]:
    """Live processes started for the run (their environment names it)."""
    needle = f"STACX_RUN_ID={run_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
                if state != "Z":
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


def leaked_containers(owner: str) -> int:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=stacx.sandbox.owner={owner}"],
                         capture_output=True, text=True, timeout=60)
    return len(out.stdout.split())


# --------------------------------------------------------------------------------- main


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spec(args: argparse.Namespace, bootstrap: str | None) -> Any:
    """The config as shipped, but for what a soak must change: its name and ports, its length
    (by time, not steps) and, with `--quick`, its size. The failure policy, the staleness filter
    and the restart budget stay as shipped."""
    spec = load_spec(args.config)
    if bootstrap is not None:
        spec.bootstrap_servers = bootstrap
    cfg = spec.pipeline
    cfg.name, cfg.live = args.name, False
    cfg.steps = 100_000  # the soak ends by time (then stops at the version reached), not by steps
    cfg.timeout_s = args.minutes * 60 + 3600
    cfg.stall_timeout_s = max(cfg.stall_timeout_s, 600.0)
    spec.gateway["port"] = _free_port()
    spec.inference.setdefault("server", {})["port"] = _free_port()
    if args.sft_steps is not None:
        cfg.sft.steps, cfg.sft.skill_steps = args.sft_steps, int(args.sft_steps * 0.9)
    if args.tolerant:  # see `--tolerant`: recovery alone, without the shipped policies
        spec.assembler.setdefault("filtering", {}).update(failure_policy="mask", max_staleness=None)
        cfg.services.restarts.max_restarts = 1000
    if args.quick:  # the slow test: plumbing under fire, not learning
        cfg.tasks.options.update(num_train=256, num_heldout=8)
        cfg.sft.steps, cfg.sft.skill_steps, cfg.sft.batch_size = 10, 8, 16
        cfg.evaluation.every_versions = 0
        spec.rollout["data"]["samples_per_task"] = 4
        spec.assembler.setdefault("grouping", {})["group_size"] = 4
        spec.assembler.setdefault("mixture", {})["batch_size"] = 2
        spec.rollout.setdefault("manager", {})["train_groups_per_version"] = 2
        spec.rollout["manager"]["max_concurrent_episodes"] = 16
    return spec


def _on_signals(stop: threading.Event) -> list[signal.Signals]:
    """SIGINT and SIGTERM end the strikes and stop the run (the main thread's pipeline stops its
    services on the way out); a second signal does not cut that short. Returns the signals seen."""
    received: list[signal.Signals] = []

    def interrupt(signum: int, frame: Any) -> None:
        if received:
            return
        received.append(signal.Signals(signum))
        stop.set()
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)
    return received


def _strike_then_finish(pipeline: Pipeline, chaos: Chaos, minutes: float, stop: threading.Event) -> None:
    """Once the pipeline trains through Kafka, strike for `minutes`, then let the run finish (final
    swap, held-out evaluation)."""
    while not stop.wait(1.0) and TRAINING not in pipeline.metrics.stage:
        pass
    chaos.run(time.monotonic() + minutes * 60, stop)
    if not stop.is_set():  # time is up: finish now (final swap, evaluation)
        pipeline.cfg.steps = max(1, pipeline.metrics.policy_version)


def _victims(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in names if v not in VICTIMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown victims {unknown}: choose among {', '.join(VICTIMS)}")
    return names


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "examples" / "quickstart.yaml"))
    parser.add_argument("--name", default="chaos")
    parser.add_argument("--minutes", type=float, default=10.0, help="GRPO time under fire")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interval-s", type=float, default=30.0, help="mean time between strikes")
    parser.add_argument("--victims", type=_victims, default=VICTIMS,
                        help=f"comma-separated, among {', '.join(VICTIMS)} (default: all)")
    parser.add_argument("--broker", choices=("private", "shared"), default="private",
                        help="private (default): a broker of the soak's own, restarted mid-soak; "
                             "shared: the configured broker, never restarted")
    parser.add_argument("--no-broker-restarts", "--no-broker", dest="no_broker_restarts",
                        action="store_true", help="never restart the broker")
    parser.add_argument("--sft-steps", type=int, default=None, help="override the SFT warm start")
    parser.add_argument("--quick", action="store_true", help="tiny SFT, tasks and batches (tests)")
    parser.add_argument(
        "--tolerant", action="store_true",
        help="not the shipped defaults: episodes failed by a kill stay in their group with a zero "
             "loss mask, no staleness drops, no restart budget (soaks recovery alone; by default "
             "the shipped failure policy, staleness filter and restart budget are under fire too)")
    parser.add_argument("--json", action="store_true", help="print the JSON line only")
    args = parser.parse_args()
    if args.broker == "shared" and not args.no_broker_restarts:
        parser.error("--broker shared needs --no-broker-restarts: a restart breaks every other "
                     "client of the shared broker")
    return args


def main() -> int:
    args = _args()
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with private_broker() if args.broker == "private" else contextlib.nullcontext() as bootstrap:
        return _soak(args, bootstrap)


def _soak(args: argparse.Namespace, bootstrap: str | None) -> int:
    pipeline = Pipeline(_spec(args, bootstrap))
    chaos = Chaos(pipeline, seed=args.seed, interval_s=args.interval_s,
                  broker=not args.no_broker_restarts, victims=args.victims)
    stop = threading.Event()
    striker = threading.Thread(target=_strike_then_finish, args=(pipeline, chaos, args.minutes, stop),
                               name="chaos")
    report: dict[str, Any] = {}
    failure: list[BaseException] = []
    received = _on_signals(stop)
    striker.start()
    try:  # the pipeline runs here, in the main thread: a signal stops it and its services
        report.update(pipeline.run())
    except KeyboardInterrupt:
        if not received:
            raise
    except BaseException as exc:  # reported below
        failure.append(exc)
    finally:
        stop.set()  # no strikes once the run is over
        striker.join()
    if received:
        print(f"bench/chaos.py: stopped by {received[0].name}; the run's services are stopped",
              file=sys.stderr, flush=True)
        return 128 + received[0].value
    time.sleep(2.0)
    result = {
        "minutes": args.minutes, "seed": args.seed, "broker": args.broker,
        "run_id": pipeline.layout.run_id,
        "kills": sum(chaos.kills.values()), "kills_by_victim": dict(chaos.kills),
        "broker_restarts": chaos.broker_restarts,
        "restarts": dict(pipeline.supervisor.restarts),
        "policy_versions": pipeline.metrics.policy_version,
        "success_before": report.get("success_before"), "success_after": report.get("success_after"),
        "pipeline_status": report.get("status", "failed"),
        "pipeline_error": f"{type(failure[0]).__name__}: {failure[0]}"[:500] if failure else None,
        **audit(pipeline),
        "orphans": len(orphans(pipeline.layout.run_id)),
        "leaked_containers": leaked_containers(pipeline.sandbox_owner),
        "strikes": chaos.events,
    }
    before, after = result["success_before"], result["success_after"]
    result["success_gain"] = None if before is None or after is None else round(after - before, 4)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
