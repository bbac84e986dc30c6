"""Chaos soak: the quickstart pipeline runs while a seeded schedule kills its services; an audit
of the topics and checkpoints then says whether anything was lost or trained twice.

Every `--interval-s` (jittered) one victim is chosen with `--seed`: kill -9 of the trainer (its
whole process group: launcher and ranks), the assembler, the rollout service, the sandbox gateway
or the inference server; or a restart of the local Kafka broker (the one `stacx infra up` started,
found by its pid file: SIGTERM, then `up` again). The pipeline's supervisor restarts the services.
After `--minutes` the run finishes (final swap, held-out evaluation, shutdown) and the audit reads:

  trajectories  every (group, sample slot) published to the run's trajectories topic
  batches       every TrainingBatch of the run's batches topic (trajectory ids per batch)
  dlq           dead letters whose source is the run's trajectories topic
  assembler     its committed offsets on the trajectories and groups topics (what lies past them is
                in open or pooled groups at the end: the next worker reads it again) and the
                changelog of its `groups` table (each closed group's verdicts: filtered samples
                are not lost)
  trainer       the final checkpoint's lineage (trained batch ids)
  weights       the run's WeightVersion announcements, in order

Counts: `lost` (a published slot in no batch, not dead-lettered, not filtered, not pending in the
assembler), `trained_twice` (a batch id twice in the lineage, or a trajectory id in two trained
batches), `version_regressions` (a version below an earlier one, or a version announced with two
content hashes), `repeated_versions` (the same version and hash announced again after a crash:
ignored by subscribers), `orphans` (processes of the run alive after shutdown, by their
STACX_RUN_ID), `leaked_containers` (sandboxes with the run's owner label after shutdown). `filtered` counts
samples the assembler dropped by policy (failed episodes, e.g. while the gateway was down) and
`pending_at_end` those still in open or pooled groups when the run stopped.

    .venv/bin/python bench/chaos.py --json --minutes 10 [--seed 0] [--interval-s 30] [--no-broker]

Last stdout line: the JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.pipeline import load_spec  # noqa: E402
from infra.pipeline.orchestrator import Pipeline  # noqa: E402

log = logging.getLogger("stacx.chaos")

REPO = Path(__file__).resolve().parents[1]
VICTIMS = ("trainer", "assembler", "rollout", "gateway", "inference")


# --------------------------------------------------------------------------------- the schedule


class Chaos:
    """Kills services of a running `Pipeline` on a seeded schedule."""

    def __init__(self, pipeline: Pipeline, *, seed: int, interval_s: float, broker: bool) -> None:
        self.pipeline = pipeline
        self.rng = random.Random(seed)
        self.interval_s = interval_s
        self.victims = (*VICTIMS, "broker") if broker else VICTIMS
        self.kills: Counter[str] = Counter()
        self.broker_restarts = 0
        self.events: list[dict[str, Any]] = []

    def run(self, until: float, stop: threading.Event) -> None:
        """Strike until `until`; with the broker among the victims, the first strike past the
        half-way mark restarts it if the draw has not yet."""
        halfway = time.monotonic() + (until - time.monotonic()) / 2
        while not stop.is_set() and time.monotonic() < until:
            if stop.wait(self.interval_s * self.rng.uniform(0.6, 1.4)):
                return
            if time.monotonic() >= until:
                return
            victim = self.rng.choice(self.victims)
            if "broker" in self.victims and not self.broker_restarts and time.monotonic() >= halfway:
                victim = "broker"
            self.strike(victim)

    def strike(self, victim: str) -> None:
        started = time.monotonic()
        if victim == "broker":
            restart_broker()
            self.broker_restarts += 1
        else:
            service = self.pipeline.services.get(victim)
            if service is None or not service.alive():
                return
            assert service.pid is not None
            os.killpg(service.pid, signal.SIGKILL)  # the service and what it spawned (ranks)
            self.kills[victim] += 1
        m = self.pipeline.metrics
        self.events.append({"victim": victim, "at_version": m.policy_version,
                            "took_s": round(time.monotonic() - started, 1)})
        log.warning("chaos: %s at policy version %d", victim, m.policy_version)


def restart_broker(down_s: float = 5.0) -> None:
    """Stop the broker `stacx infra up` started (its pid file), wait, start it again."""
    from infra.services import kafka
    from infra.services.processes import stop_pid

    pid = kafka.running_pid()
    if pid is None:
        raise RuntimeError(f"no broker recorded in {kafka.pid_file()}: start it with `stacx infra up`")
    stop_pid(pid, timeout_s=60)
    kafka.pid_file().unlink(missing_ok=True)
    time.sleep(down_s)
    log.warning("chaos: %s", kafka.up(kafka.KafkaConfig()))


# --------------------------------------------------------------------------------- reading topics


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Any]:
    """Every record of `topic` from the beginning to the current end (confluent Message list)."""
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


def audit(pipeline: Pipeline) -> dict[str, Any]:
    """Counts over the run's topics, the assembler's changelogs and the trainer's lineage."""
    from consumers.assembly.claims import decode_trajectory
    from consumers.assembly.envelope import decode_group
    from schemas import topics
    from schemas.codec import decode
    from schemas.records import DeadLetter, TrainingBatch, WeightVersion

    bootstrap, run = pipeline.spec.bootstrap_servers, pipeline.layout
    app_id = f"stacx-assembler-{run.run_id}"
    unread = _committed_offsets(bootstrap, app_id, [run.topics.trajectories, f"{app_id}-groups"])
    slots: dict[tuple[str, int], set[str]] = defaultdict(set)
    pending = set()
    for msg in read_topic(bootstrap, run.topics.trajectories):
        t = decode_trajectory(msg.value())
        slots[(t.group_id, t.sample_index)].add(t.trajectory_id)
        if msg.offset() >= unread.get((msg.topic(), msg.partition()), 0):
            pending.add((t.group_id, t.sample_index))  # in an open group, or not read yet
    batches: dict[str, TrainingBatch] = {}
    for msg in read_topic(bootstrap, run.topics.batches):
        batch = decode(msg.value(), TrainingBatch)
        batches[batch.batch_id] = batch
    batched: set[tuple[str, str]] = set()
    id_slot = {tid: slot for slot, ids in slots.items() for tid in ids}
    for batch in batches.values():
        batched |= {id_slot[tid] for tid in batch.trajectory_ids if tid in id_slot}  # type: ignore[misc]
    dead = set()
    for msg in read_topic(bootstrap, topics.DLQ):
        letter = decode(msg.value(), DeadLetter)
        if letter.source_topic == run.topics.trajectories and letter.value:
            try:
                t = decode_trajectory(letter.value)
            except Exception:
                continue
            dead.add((t.group_id, t.sample_index))
    groups = {k: json.loads(v) for k, v in
              _latest_by_key(read_topic(bootstrap, f"{app_id}-groups-changelog")).items()}
    pooled = {decode_group(m.value()).group_id for m in read_topic(bootstrap, f"{app_id}-groups")
              if m.value() and m.offset() >= unread.get((m.topic(), m.partition()), 0)}
    filtered = set()
    for slot in slots:
        record = groups.get(slot[0])
        if slot[0] in pooled:
            pending.add(slot)
        elif record is not None:
            verdicts = {m[0]: m[1] for m in record["members"].values()}
            if verdicts.get(slot[1]) not in (None, "keep", "flag"):
                filtered.add(slot)
    lost = [s for s in slots if s not in batched and s not in dead and s not in pending
            and s not in filtered]
    lineage = _lineage(pipeline)
    in_lineage = Counter(lineage)
    trained_ids = Counter(tid for bid in set(lineage) if bid in batches
                          for tid in set(batches[bid].trajectory_ids))
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
        "batches": len(batches),
        "batched_slots": len(batched),
        "dead_lettered": len(dead),
        "filtered": len(filtered),
        "pending_at_end": len(pending - batched),
        "lost": len(lost),
        "lost_examples": [list(s) for s in lost[:5]],
        "trained_batches": len(in_lineage),
        "trained_twice": sum(n - 1 for n in in_lineage.values() if n > 1)
        + sum(1 for n in trained_ids.values() if n > 1),
        "versions_announced": len(announced),
        "version_regressions": regressions,
        "repeated_versions": repeats,
        # false when steps left the weights unchanged (all-zero advantages): not a conflict
        "distinct_contents": len(set(hashes.values())) == len(hashes),
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


def _spec(args: argparse.Namespace) -> Any:
    spec = load_spec(args.config)
    cfg = spec.pipeline
    cfg.name, cfg.live = args.name, False
    cfg.steps = 100_000  # the soak ends by time (then stops at the version reached), not by steps
    cfg.timeout_s = args.minutes * 60 + 3600
    cfg.stall_timeout_s = max(cfg.stall_timeout_s, 600.0)
    cfg.services.gateway_port, cfg.services.inference_port = _free_port(), _free_port()
    cfg.services.restarts.max_restarts = 1000  # the schedule kills far more than a real run
    cfg.services.restarts.max_backoff_s = 10.0
    if args.sft_steps is not None:
        cfg.sft.steps, cfg.sft.skill_steps = args.sft_steps, int(args.sft_steps * 0.9)
    if args.quick:  # the slow test: plumbing under fire, not learning
        cfg.tasks.options.update(num_train=256, num_heldout=8)
        cfg.sft.steps, cfg.sft.skill_steps, cfg.sft.batch_size = 10, 8, 16
        cfg.evaluation.every_versions = 0
        spec.rollout["data"]["samples_per_task"] = 4
        spec.assembler.setdefault("grouping", {})["group_size"] = 4
        spec.assembler.setdefault("mixture", {})["batch_size"] = 2
        spec.rollout.setdefault("manager", {})["train_groups_per_version"] = 2
        spec.rollout["manager"]["max_concurrent_episodes"] = 16
    filtering = spec.assembler.setdefault("filtering", {})
    filtering["max_staleness"] = None  # no stage-2 drops
    # episodes failed by a kill stay in their group with a zero loss mask: dropping them would
    # leave the rollout service (bounded staleness) waiting for a batch that never fills
    filtering["failure_policy"] = "mask"
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
    while not stop.wait(1.0) and not pipeline.metrics.stage.startswith("GRPO through Kafka"):
        pass
    chaos.run(time.monotonic() + minutes * 60, stop)
    if not stop.is_set():  # time is up: finish now (final swap, evaluation)
        pipeline.cfg.steps = max(1, pipeline.metrics.policy_version)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "examples" / "quickstart.yaml"))
    parser.add_argument("--name", default="chaos")
    parser.add_argument("--minutes", type=float, default=10.0, help="GRPO time under fire")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interval-s", type=float, default=30.0, help="mean time between strikes")
    parser.add_argument("--no-broker", action="store_true", help="never restart the broker")
    parser.add_argument("--sft-steps", type=int, default=None, help="override the SFT warm start")
    parser.add_argument("--quick", action="store_true", help="tiny SFT, tasks and batches (tests)")
    parser.add_argument("--json", action="store_true", help="print the JSON line only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pipeline = Pipeline(_spec(args))
    chaos = Chaos(pipeline, seed=args.seed, interval_s=args.interval_s, broker=not args.no_broker)
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
        "minutes": args.minutes, "seed": args.seed,
        "kills": sum(chaos.kills.values()), "kills_by_service": dict(chaos.kills),
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
