"""The on-call join as a Faust worker (`stacx oncall-join CONFIG`).

    agent-logs (key: session) ─┐
    feedback   (key: session) ─┼▶ join agent ─▶ oncall trajectories (key: session, 1 partition)
    <app>-ticks (same parts.)  ─┘   │ table: sessions             └▶ dlq (late, unmatched, invalid)

The three inputs are co-partitioned (same partition count, keyed by session id), so one
partition's agent sees every event of its sessions in order, and the `sessions` table (changelog
backed) survives restarts. Window ends are driven by tick events a timer writes to every
partition of the ticks topic, since tables change only inside stream processing; a tick ends the
windows its partition's event-time watermark passed (`consumers/oncall/clock.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import faust
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from faust.types import TP

from stacx.consumers.assembly.app import FaustForwarder
from stacx.consumers.assembly.errors import AssemblyError
from stacx.consumers.assembly.gaps import GapReader, InputOrder, KafkaGapReader, ack
from stacx.consumers.assembly.protocols import Forwarder, Output
from stacx.consumers.assembly.worker import SignalledWorker
from stacx.consumers.library_patches import IdempotentApp
from stacx.consumers.oncall.clock import EventClock
from stacx.consumers.oncall.join import FeedbackJoin, Joined, JoinStats, Rejected, feedback_id
from stacx.producers.kafka_log import limit_library_logs
from stacx.schemas import topics
from stacx.schemas.codec import decode, encode
from stacx.schemas.records import AgentInteraction, DeadLetter, Feedback, now_ms
from stacx.schemas.validation import validate

__all__ = ["ONCALL_TICK_KEY", "OncallJoinApp", "ensure_join_topics"]

log = logging.getLogger(__name__)

ONCALL_TICK_KEY = b"\x00stacx-oncall-tick"
"""Key of the timer's tick events (never a session id)."""

_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


class OncallJoinApp:
    """Builds the Faust app, its topics, table and agent from one `Config`."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        app_id: str = "stacx-oncall-join"
        """Faust app id: the consumer group and the prefix of internal topics."""
        bootstrap_servers: str = field(default_factory=topics.default_bootstrap)
        """Kafka bootstrap servers."""
        agent_logs_topic: str = topics.AGENT_LOGS
        """Input: `AgentInteraction` events keyed by session id."""
        feedback_topic: str = topics.FEEDBACK
        """Input: `Feedback` events keyed by session id (same partition count)."""
        trajectories_topic: str = topics.ONCALL_TRAJECTORIES
        """Output: rewarded `Trajectory` events (created with 1 partition when missing)."""
        dlq_topic: str = topics.DLQ
        """Output: late or unmatched feedback and invalid events, with the reason."""
        partitions: int = 4
        """Partitions of the input topics (the table and ticks get as many)."""
        store: str = "memory://"
        """Table store URL (`memory://` rebuilds from the changelog on start)."""
        datadir: str = field(
            default_factory=lambda: os.path.join(
                os.environ.get("STACX_HOME", os.path.expanduser("~/.cache/stacx")), "oncall-join"
            )
        )
        """Worker data directory."""
        tick_interval_s: float = 1.0
        """How often window ends are checked."""
        quiet_check_s: float = 5.0
        """An input partition that got no event for this long is compared with its end in Kafka,
        and what the agent never got is read directly: Faust can drop the last events it fetched
        around a rebalance (`consumers/assembly/gaps.py`)."""
        stats_interval_s: float = 30.0
        """How often the counters are logged (0: only at shutdown)."""
        session_timeout_s: float = 10.0
        """Kafka consumer-group session timeout: a worker killed without leaving the group holds
        its partitions this long (Faust's default, 60 s, made a restarted worker wait a minute).
        Brokers accept 6-300 s."""
        heartbeat_interval_s: float = 3.0
        """Consumer heartbeats; at most a third of `session_timeout_s`."""
        join: FeedbackJoin.Config = field(default_factory=FeedbackJoin.Config)
        """Window, unrewarded policy, trajectory limits."""
        topic_policy: topics.TopicPolicy = field(default_factory=topics.TopicPolicy)
        """Replication, retention and compression of the topics the worker creates."""

        def __post_init__(self) -> None:
            if self.partitions < 1 or self.tick_interval_s <= 0 or self.quiet_check_s <= 0:
                raise ValueError(
                    "oncall join: partitions must be >= 1, tick_interval_s and quiet_check_s > 0"
                )
            if not 0 < 3 * self.heartbeat_interval_s <= self.session_timeout_s:
                raise ValueError(
                    f"oncall join: heartbeat_interval_s={self.heartbeat_interval_s} must be > 0 and at "
                    f"most a third of session_timeout_s={self.session_timeout_s}"
                )

        @property
        def ticks_topic(self) -> str:
            return f"{self.app_id}-ticks"

    def __init__(
        self,
        config: Config,
        *,
        forwarder: Forwarder | None = None,
        clock: Callable[[], int] = now_ms,
        gap_reader: GapReader | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.gap_reader = gap_reader
        """Reads what Faust failed to deliver (`gaps`); a Kafka one is made when None."""
        self.inputs = InputOrder(self._reader, quiet_s=config.quiet_check_s)
        """Each event of the inputs (agent logs, feedback) once, in offset order."""
        self.stats = JoinStats()
        self.app = _faust_app(config)
        self.forwarder: Forwarder = forwarder or FaustForwarder(self.app)
        self.sessions = self.app.Table("sessions", partitions=config.partitions, value_type=bytes)
        self.join = FeedbackJoin(config.join, self.sessions, self.stats)
        self.event_clock = EventClock(self._input_topics, grace_ms=int(config.join.grace_s * 1000))
        """When windows end: the inputs' event times, per partition."""
        self.channel = self.app.topic(
            config.agent_logs_topic, config.feedback_topic, config.ticks_topic, **_RAW
        )
        self.ticks = self.app.topic(config.ticks_topic, **_RAW)
        self.agent = self.app.agent(self.channel, name="join", sink=[self._publish])(self._stream)
        self.app.timer(config.tick_interval_s, name="ticks")(self._send_ticks)
        self.app.on_partitions_assigned.connect(cast(Any, self._on_partitions_assigned))
        self.app.on_partitions_revoked.connect(cast(Any, self._on_partitions_revoked))
        if config.stats_interval_s > 0:
            self.app.timer(config.stats_interval_s, name="stats")(self._log_stats)

    async def _stream(self, stream: faust.StreamT) -> AsyncIterator[list[Output]]:
        async for event in cast(faust.Stream, stream).noack().events():
            taken = await self._in_order(event)
            if taken is None:  # a second delivery of an event taken before: acknowledged like it
                yield []
                await ack(stream, event)
                continue
            outputs: list[Output] = []
            for each in taken:
                if self._is_tick(each.message):
                    await self._check_inputs(int(each.message.partition or 0))
                outputs += self.on_message(each.message)
            yield outputs
            for each in taken:
                await ack(stream, each)

    async def _in_order(self, event: Any) -> list[Any] | None:
        """The events to process for one delivered `event`, in offset order: None when it was
        taken before, else the events Faust dropped ahead of it (read from Kafka) and itself
        (none when Kafka did not answer: the worker crashes, nothing is acknowledged). A tick
        also brings what a quiet input partition never got."""
        inputs = (self.config.agent_logs_topic, self.config.feedback_topic)
        try:
            return await self.inputs.events(event, held=inputs, ticks=self.config.ticks_topic, ticked=inputs)
        except AssemblyError as exc:  # Kafka did not answer: start over from the committed offset
            await self.app.crash(exc)
            return []

    @property
    def _input_topics(self) -> tuple[str, str]:
        return (self.config.agent_logs_topic, self.config.feedback_topic)

    def _is_tick(self, message: Any) -> bool:
        return bool(message.topic == self.config.ticks_topic and message.key == ONCALL_TICK_KEY)

    async def _check_inputs(self, partition: int) -> None:
        """Before a tick: whether each input of `partition` has anything left to read in Kafka
        (a caught-up input's clock is the wall clock, a lagging one's its newest event)."""
        for topic in self._input_topics:
            expected = self.inputs.guard.next_offset(TP(topic, partition))
            caught_up = False
            if expected is not None:
                try:
                    end = await asyncio.to_thread(self._reader().end_offset, topic, partition)
                except AssemblyError as exc:  # unknown: the input holds the windows open
                    log.warning("cannot read the end of %s[%d]: %s", topic, partition, exc)
                else:
                    caught_up = expected >= end
            self.event_clock.caught_up(partition, topic, caught_up)

    def _reader(self) -> GapReader:
        if self.gap_reader is None:
            self.gap_reader = KafkaGapReader(self.config.bootstrap_servers, self.config.app_id)
        return self.gap_reader

    async def _on_partitions_assigned(self, sender: Any, assigned: set[Any], **kwargs: Any) -> None:
        await self.inputs.assigned_of(assigned, (self.config.agent_logs_topic, self.config.feedback_topic))

    async def _on_partitions_revoked(self, sender: Any, revoked: set[Any], **kwargs: Any) -> None:
        self.inputs.forget(set(revoked))

    async def _publish(self, outputs: list[Output]) -> None:
        for output in outputs:
            await self.forwarder.send(output)

    def on_message(self, message: Any) -> list[Output]:
        """One message of any input topic -> the records to publish."""
        partition = int(message.partition or 0)
        if message.key == ONCALL_TICK_KEY:
            watermark = self.event_clock.watermark(partition, self.clock())
            if watermark is None:  # an input's position is unknown yet: no window can end
                return []
            return self._outputs(message, self.join.on_tick(watermark, partition=partition))
        try:
            record = decode(message.value)
            validate(record)
        except Exception as exc:  # untrusted bytes: dead-letter them, keep going
            self.stats.invalid += 1
            return [self._dead_letter(message, str(exc), type(exc).__name__)]
        if isinstance(record, AgentInteraction | Feedback):
            self.event_clock.observe(partition, str(message.topic), int(record.created_at_ms))
        if isinstance(record, AgentInteraction):
            return self._safe(message, lambda: self.join.on_interaction(record, partition=partition))
        if isinstance(record, Feedback):
            fid = feedback_id(record, str(message.topic), partition, int(message.offset or 0))
            return self._safe(message, lambda: self.join.on_feedback(record, fid, partition=partition))
        self.stats.invalid += 1
        return [
            self._dead_letter(
                message, f"unexpected {type(record).__name__} on {message.topic}", "UnexpectedRecord"
            )
        ]

    def _safe(self, message: Any, step: Callable[[], list[Any]]) -> list[Output]:
        try:
            return self._outputs(message, step())
        except ValueError as exc:  # an inconsistent event (prompt length, logprobs): dead-letter
            self.stats.invalid += 1
            return [self._dead_letter(message, str(exc), type(exc).__name__)]

    def _outputs(self, message: Any, results: list[Any]) -> list[Output]:
        out: list[Output] = []
        for result in results:
            if isinstance(result, Joined):
                t = result.trajectory
                out.append(Output(self.config.trajectories_topic, t.group_id.encode(), encode(t)))
            elif isinstance(result, Rejected):
                out.append(self._dead_letter(message, result.reason, result.error_type))
        return out

    def _dead_letter(self, message: Any, reason: str, error_type: str) -> Output:
        letter = DeadLetter(
            source_topic=str(message.topic),
            source_partition=int(message.partition or 0),
            source_offset=int(message.offset or 0),
            reason=reason[:1000],
            error_type=error_type,
            key=message.key,
            value=message.value,
        )
        log.warning(
            "dead-lettered %s[%s]@%s: %s",
            letter.source_topic,
            letter.source_partition,
            letter.source_offset,
            reason,
        )
        return Output(self.config.dlq_topic, message.key, encode(letter))

    async def _send_ticks(self) -> None:
        value = str(now_ms()).encode()
        for partition in range(self.config.partitions):
            await self.ticks.send(key=ONCALL_TICK_KEY, value=value, partition=partition)

    async def _log_stats(self) -> None:
        log.info("oncall join stats %s", json.dumps(self.stats.as_dict()))

    def worker(self, *, loglevel: str = "info") -> SignalledWorker:
        worker = SignalledWorker(self.app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
        worker.spinner = None  # see AssemblerApp.worker: the spinner makes logging expensive
        return worker

    def run(self, *, loglevel: str = "info") -> signal.Signals | None:
        """Create the ticks and output topics, run until SIGINT/SIGTERM: the signal that stopped
        it (a crash of the worker is raised)."""
        ensure_join_topics(self.config)
        worker = self.worker(loglevel=loglevel)
        limit_library_logs()  # aiokafka's line per failed attempt while a broker is away
        try:
            worker.run()
        finally:
            log.info("oncall join final stats %s", json.dumps(self.stats.as_dict()))
        return worker.stopped_by


def ensure_join_topics(cfg: OncallJoinApp.Config, timeout_s: float = 30.0) -> None:
    """Check the inputs' partition counts; create the ticks and output topics (idempotent)."""
    admin = AdminClient({"bootstrap.servers": cfg.bootstrap_servers})
    existing = admin.list_topics(timeout=timeout_s).topics
    for name in (cfg.agent_logs_topic, cfg.feedback_topic):
        if name in existing and len(existing[name].partitions) != cfg.partitions:
            raise ValueError(
                f"topic {name!r} has {len(existing[name].partitions)} partitions but "
                f"oncall join partitions={cfg.partitions}: the inputs must be "
                "co-partitioned; set `partitions` to match"
            )
    wanted = {
        cfg.ticks_topic: cfg.partitions,
        cfg.trajectories_topic: 1,
        cfg.agent_logs_topic: cfg.partitions,
        cfg.feedback_topic: cfg.partitions,
    }
    policy = cfg.topic_policy
    missing = [
        NewTopic(
            name,
            num_partitions=n,
            replication_factor=policy.replication_factor,
            config=policy.apply(topics.TopicSpec(name, config=_TOPIC_BASE), kind="").config,
        )
        for name, n in wanted.items()
        if name not in existing
    ]
    for name, future in admin.create_topics(missing).items() if missing else []:
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"cannot create topic {name!r}: {exc}") from exc


_TOPIC_BASE = {"cleanup.policy": "delete", "max.message.bytes": str(topics.DEFAULT_MAX_MESSAGE_BYTES)}


def _faust_app(cfg: OncallJoinApp.Config) -> faust.App:
    return IdempotentApp(
        cfg.app_id,
        broker=[f"kafka://{host}" for host in cfg.bootstrap_servers.split(",")],
        store=cfg.store,
        datadir=cfg.datadir,
        topic_replication_factor=cfg.topic_policy.replication_factor,
        topic_partitions=cfg.partitions,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_linger=0.005,
        processing_guarantee="at_least_once",
        # an event left unacknowledged (the worker crashed before its missing records could be
        # read) is read again by the partition's next owner: never wait for it on a rebalance or
        # at shutdown, and a second delivery is recognised (`gaps`)
        stream_wait_empty=False,
        broker_session_timeout=cfg.session_timeout_s,
        broker_heartbeat_interval=cfg.heartbeat_interval_s,
        autodiscover=False,
        web_enabled=False,
    )
