"""The Faust worker: thin agents around `GroupAssembler` (stage 1) and `BatchBuilder` (stage 2).

Topology (all values raw bytes, decoded with the schema catalogue's codec like every consumer):

    trajectories (key: group id) ─┐
    <app>-ticks (same partitions) ─┴▶ group agent ─▶ <app>-groups (1 partition) ─▶ batch agent
                                       │ open groups: memory                       │ pool: memory
                                       │ table: groups (closed)                    │ table: packed
                                       └▶ dlq (undecodable, invalid)               ▼
    weights (key: model) ─▶ weights agent ─▶ global table latest_versions     batches (key: id)

Open groups and the pool live in memory, and the topic each agent reads is their changelog
(`holding`): the group agent acknowledges a sample only once its group is closed and its output
delivered, the batch agent a group only once it left the pool and the batch that took it is
delivered. A worker that takes a partition over reads again from the committed offset and
rebuilds them from the redelivered events. The tables get one record per closed group (`groups`:
duplicate and late samples) and one per packed group (`packed`: redelivered groups), each
written once the output it stands for is delivered.

Tables can only change inside stream processing, so group timeouts are driven by tick events
that a timer writes to every partition of the ticks topic (co-partitioned with trajectories).
A message is a tick because it arrived on the ticks topic, never because of its key. While a
batch's delivery is unconfirmed the timer also writes an empty record to the groups topic (a
group is never empty), so the batch agent confirms it without waiting for another group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import faust
from aiokafka.errors import UnknownTopicOrPartitionError
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from faust.types import TP
from opentelemetry import metrics

from stacx.consumers.assembly.assignor import make_assignor
from stacx.consumers.assembly.batched import batched_since_committed, group_ids_header
from stacx.consumers.assembly.batching import BatchBuilder, RejectedGroup
from stacx.consumers.assembly.claims import BatchEncoder, decode_trajectory
from stacx.consumers.assembly.envelope import encode_group
from stacx.consumers.assembly.errors import AssemblyConfigError, AssemblyError, OutputTopicMissing
from stacx.consumers.assembly.filters import SampleFilter, invalid_reason
from stacx.consumers.assembly.gaps import GapReader, InputOrder, KafkaGapReader, ack
from stacx.consumers.assembly.grouping import GroupAssembler
from stacx.consumers.assembly.holding import GroupRecords, HeldAcks, PendingMarks, TrackedPool
from stacx.consumers.assembly.missing import quiet_missing_topics
from stacx.consumers.assembly.mixture import MixturePlanner
from stacx.consumers.assembly.protocols import Forwarder, Output
from stacx.consumers.assembly.stats import AssemblyStats
from stacx.consumers.assembly.tracing import TraceLinks
from stacx.consumers.assembly.watchdog import RebalanceWatchdog
from stacx.consumers.assembly.worker import SignalledWorker, WorkerGaveUp
from stacx.consumers.dead_letters import keep_original
from stacx.consumers.library_patches import FETCH_MAX_WAIT_MS, IdempotentApp, use_fast_lz4
from stacx.producers.errors import BlobStoreError
from stacx.producers.kafka_log import limit_library_logs
from stacx.schemas import topics
from stacx.schemas.catalogue import SchemaCatalogue, catalogue_codec
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import Codec
from stacx.schemas.records import DeadLetter, TrainingBatch, WeightVersion, now_ms

__all__ = [
    "TICK_KEY",
    "AssemblerApp",
    "FaustForwarder",
    "IdempotentApp",
    "ensure_internal_topics",
    "topic_partitions",
    "topic_retention_ms",
]

_meter = metrics.get_meter("stacx.assembler")
_BATCHES = _meter.create_counter("stacx.assembler.batches", unit="{batch}", description="batches emitted")
_BLOB_STORE_DOWN = _meter.create_up_down_counter(
    "stacx.assembler.blob_store_down",
    unit="1",
    description="1 while batches wait because the claim-check blob store cannot be written",
)
_BATCHED_TRAJECTORIES = _meter.create_counter(
    "stacx.assembler.batched_trajectories", unit="{trajectory}", description="trajectories in batches"
)

log = logging.getLogger(__name__)

TICK_KEY = b"\x00stacx-assembler-tick"
"""Key of the timer's tick events (informative: ticks are told apart by their topic)."""

_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


class FaustForwarder:
    """Sends agent outputs to Kafka through the app's producer (the production `Forwarder`)."""

    def __init__(self, app: faust.App) -> None:
        self._app = app
        self._topics: dict[str, faust.TopicT] = {}

    async def send(self, output: Output) -> Awaitable[Any]:
        topic = self._topics.get(output.topic)
        if topic is None:
            topic = self._topics[output.topic] = self._app.topic(output.topic, **_RAW)
        try:
            if output.headers:
                return await topic.send(key=output.key, value=output.value, headers=output.headers)
            return await topic.send(key=output.key, value=output.value)
        except UnknownTopicOrPartitionError as exc:
            raise OutputTopicMissing(output.topic) from exc


class AssemblerApp:
    """Builds the Faust app, its topics, tables and agents from one `Config`."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        app_id: str = "stacx-assembler"
        """Faust app id: the consumer group and the prefix of internal topics."""
        bootstrap_servers: str = field(default_factory=topics.default_bootstrap)
        """Kafka bootstrap servers (host:port[,host:port])."""
        trajectories_topic: str = topics.TRAJECTORIES
        """Input: `Trajectory` events keyed by group id."""
        batches_topic: str = topics.BATCHES
        """Output: `TrainingBatch` events keyed by batch id."""
        weights_topic: str = topics.WEIGHTS
        """Input: `WeightVersion` events keyed by model name (for the staleness filter)."""
        dlq_topic: str = topics.DLQ
        """Output: `DeadLetter` events for undecodable or invalid input."""
        schemas_topic: str = topics.SCHEMAS
        """Schema catalogue: resolves writer schemas this build does not know (a compatible
        newer `Trajectory`) and registers the schemas of what the assembler writes."""
        partitions: int | None = None
        """Partitions of the trajectories topic (tables and ticks get as many); None: ask Kafka."""
        weights_partitions: int = 1
        """Partitions of the weights topic."""
        store: str = "memory://"
        """Table store URL: `memory://`, or `rocksdb://` (needs the rocksdict package)."""
        datadir: str = field(default_factory=lambda: _stacx_home("assembler"))
        """Directory for the worker's local data (RocksDB files, when used)."""
        web_port: int | None = None
        """Port of Faust's web server; None disables it."""
        tick_interval_s: float = 1.0
        """How often the group timeouts are checked."""
        quiet_check_s: float = 5.0
        """A partition of the trajectories or groups topic that got no event for this long is
        compared with its end in Kafka, and what its agent never got is read directly: Faust
        can drop the last events it fetched around a rebalance (`gaps`)."""
        session_timeout_s: float = 10.0
        """Kafka consumer-group session timeout: a worker killed without leaving the group holds
        its partitions this long, so a restarted worker rejoins within about this time (Kafka's
        and Faust's 45-60 s default made restarts take a minute). Brokers accept 6-300 s."""
        heartbeat_interval_s: float = 3.0
        """Consumer heartbeats; at most a third of `session_timeout_s`."""
        rebalance_timeout_s: float = 300.0
        """Longest time the worker may take to join its group and restore its tables, at start
        or in a rebalance; past it the worker stops with exit status 1 so that its supervisor
        restarts it (Faust can hang there, `watchdog`). Longer than a broker restart. 0: wait
        forever."""
        group_instance_id: str | None = None
        """Static membership (KIP-345): a restarted worker with the same id takes its partitions
        back without a rebalance. Give each worker its own stable id; None: dynamic members."""
        batch_stage_share: float = 0.25
        """The batch stage's share of the assembler's CPU (0.2-0.25 measured with groups of 8
        and batches of 8 groups). With several workers the one that runs the batch stage gets
        fewer trajectories partitions by this weight (`assignor`): 3 of 8 against 5 for two
        workers. 0: Faust's even split."""
        standby_replicas: int = 0
        """Standby copies of each table partition kept by the other workers (Faust's
        `table_standby_replicas`, whose default is 1). A standby re-applies every changelog record
        of the partitions it mirrors: with two workers that nearly tripled the CPU per trajectory
        (1.84 vs 0.65 ms) and made two workers slower than one. Without standbys a worker taking
        over a partition restores its tables from the changelog first; 1 buys faster failover
        with that CPU. A single worker never has standbys."""
        stats_interval_s: float = 30.0
        """How often the counters are logged (0: only at shutdown)."""
        producer_max_request_size: int = topics.BATCHES_MAX_MESSAGE_BYTES
        """Largest message the producer sends (batches can be big)."""
        consumer_max_fetch_bytes: int = 8 * 1024 * 1024
        """Most bytes a fetch returns per partition (Faust's `consumer_max_fetch_size`, default
        1 MiB): about 200 trajectories of 512 tokens. With 1 MiB one worker waited on its next
        fetch (2.7-2.8k trajectories/s, 0.6 of a core busy); with 8 MiB it is CPU-bound
        (4.8-5.5k, 0.9-0.98 of a core). A record larger than this is still fetched (alone)."""
        fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS
        """Longest time the broker holds a fetch whose partitions have no new records (Faust sets
        1,500 ms). The consumer keeps one fetch in flight per broker, so a fetch waiting on quiet
        partitions (ticks, a drained groups partition) keeps the busy ones from being fetched
        again: with 1,500 ms two workers idled in turns (0.75-0.80 of a core each)."""
        grouping: GroupAssembler.Config = field(default_factory=GroupAssembler.Config)
        """Grouping and partial-group policy."""
        filtering: SampleFilter.Config = field(default_factory=SampleFilter.Config)
        """Failure policy and staleness limit."""
        mixture: MixturePlanner.Config = field(default_factory=MixturePlanner.Config)
        """Batch size and task mixture."""
        batching: BatchBuilder.Config = field(default_factory=BatchBuilder.Config)
        """Packing-stage state retention."""
        output: BatchEncoder.Config = field(default_factory=BatchEncoder.Config)
        """Claim check for batches too large for the batches topic."""
        topic_policy: topics.TopicPolicy = field(default_factory=topics.TopicPolicy)
        """Replication and compression of the topics the worker creates (ticks, groups, Faust's
        changelogs and leader topic)."""

        def __post_init__(self) -> None:
            if (self.partitions is not None and self.partitions < 1) or self.weights_partitions < 1:
                raise AssemblyConfigError("partitions and weights_partitions must be >= 1")
            if self.consumer_max_fetch_bytes < 1024:
                raise AssemblyConfigError(
                    f"consumer_max_fetch_bytes must be >= 1024, got {self.consumer_max_fetch_bytes}"
                )
            if not 1 <= self.fetch_max_wait_ms <= 1500:
                raise AssemblyConfigError(
                    f"fetch_max_wait_ms must be between 1 and 1500, got {self.fetch_max_wait_ms}"
                )
            if not 0 <= self.batch_stage_share < 1:
                raise AssemblyConfigError(
                    f"batch_stage_share must be >= 0 and < 1, got {self.batch_stage_share}"
                )
            if self.standby_replicas < 0:
                raise AssemblyConfigError(f"standby_replicas must be >= 0, got {self.standby_replicas}")
            if self.web_port is not None and not 1 <= self.web_port <= 65535:
                raise AssemblyConfigError(
                    f"web_port must be a TCP port in 1..65535 (or unset: no web server), got {self.web_port}"
                )
            if self.tick_interval_s <= 0:
                raise AssemblyConfigError(f"tick_interval_s must be > 0, got {self.tick_interval_s}")
            if self.rebalance_timeout_s < 0:
                raise AssemblyConfigError(f"rebalance_timeout_s must be >= 0, got {self.rebalance_timeout_s}")
            if self.quiet_check_s <= 0:
                raise AssemblyConfigError(f"quiet_check_s must be > 0, got {self.quiet_check_s}")
            if self.grouping.max_clock_step_s < 2 * self.tick_interval_s:
                raise AssemblyConfigError(
                    f"grouping.max_clock_step_s={self.grouping.max_clock_step_s} must be at least "
                    f"twice tick_interval_s={self.tick_interval_s}: ticks advance the timeout clock"
                )
            if not 0 < 3 * self.heartbeat_interval_s <= self.session_timeout_s:
                raise AssemblyConfigError(
                    f"heartbeat_interval_s={self.heartbeat_interval_s} must be > 0 and at most a "
                    f"third of session_timeout_s={self.session_timeout_s}"
                )

        @property
        def groups_topic(self) -> str:
            return f"{self.app_id}-groups"

        @property
        def ticks_topic(self) -> str:
            return f"{self.app_id}-ticks"

    def __init__(
        self,
        config: Config,
        *,
        forwarder: Forwarder | None = None,
        clock: Callable[[], int] = now_ms,
        codec: Codec | None = None,
        gap_reader: GapReader | None = None,
    ) -> None:
        if config.partitions is None:
            found = topic_partitions(config.bootstrap_servers, config.trajectories_topic)
            config = dataclasses.replace(config, partitions=found)
        self.config = config
        self.clock = clock  # epoch ms; tests inject a fake one
        self.codec = codec or catalogue_codec(
            SchemaCatalogue.Config(
                bootstrap_servers=config.bootstrap_servers,
                topic=config.schemas_topic,
                topic_policy=config.topic_policy,
            )
        )
        """Decodes every input and encodes every output (unit tests pass a plain `Codec()`)."""
        self.gap_reader = gap_reader
        """Reads what Faust failed to deliver (`gaps`); `run` makes a Kafka one when None."""
        self.stats = AssemblyStats()
        self.unwritten: list[TrainingBatch] = []
        """Packed batches waiting for the claim-check blob store, oldest first."""
        self.blob_store_problem: str | None = None
        """Why the blob store cannot be written now (None: it can); a health signal."""
        self.batched_unchecked = False
        """The groups partition was assigned and `_mark_batched_groups` has not run since."""
        self.trace_links = TraceLinks()
        """Trajectory trace contexts on their way to the batch span that links them."""
        self.app = _new_faust_app(config)
        self.app.settle = self.settle
        self.forwarder: Forwarder = forwarder or FaustForwarder(self.app)
        self._build_tables()
        self._build_components()
        self._build_agents()

    def _build_tables(self) -> None:
        app, n = self.app, self.config.partitions
        # Values without a value_type use the json codec; value_type=bytes means raw bytes.
        self.groups_table = app.Table("groups", partitions=n)
        """Closed groups (duplicate and late detection); open ones are in `group_records`."""
        self.group_records = GroupRecords(self.groups_table)
        self.open_payloads: dict[str, bytes] = {}
        """Trajectory id -> encoded sample, while its group is open."""
        self.held: HeldAcks[Any] = HeldAcks()
        """Input events not acknowledged yet (their group is open, or an earlier one is)."""
        self._deliveries: dict[str, Awaitable[Any] | None] = {}
        """Closed group id -> delivery of its output (None: nothing to deliver)."""
        self._unsent: dict[str, Output] = {}
        self.inputs = InputOrder(self._reader, quiet_s=self.config.quiet_check_s)
        """Each event of the held inputs (trajectories, groups) once, in offset order."""
        """Closed group id -> its output, until it is handed to the forwarder."""
        self.pool = TrackedPool()
        """Stage 2: group id -> encoded `ReadyGroup`, while it waits for a batch."""
        self.pool_index: dict[str, list[Any]] = {}
        """Stage 2: model name -> pooled entries in arrival order."""
        self.packed_table = app.Table("packed", partitions=1)
        """Packed groups (redelivery detection)."""
        self.packed_marks = PendingMarks(self.packed_table)
        self.pool_held: HeldAcks[Any] = HeldAcks()
        """Groups-topic events not acknowledged yet (their group is pooled, or an earlier one)."""
        self._batch_deliveries: list[tuple[list[str], list[Any]]] = []
        """(groups that left the pool, deliveries of that event's outputs), oldest first."""
        self.latest_versions = app.GlobalTable("latest_versions", partitions=self.config.weights_partitions)

    def _build_components(self) -> None:
        cfg = self.config
        self.sample_filter = SampleFilter(cfg.filtering, self.latest_versions)
        self.grouper = GroupAssembler(
            cfg.grouping,
            sample_filter=self.sample_filter,
            groups=self.group_records,
            payloads=self.open_payloads,
            stats=self.stats,
        )
        self.encoder = BatchEncoder(cfg.output, self.codec, topic=cfg.batches_topic)
        self.builder = BatchBuilder(
            cfg.batching,
            planner=MixturePlanner(cfg.mixture),
            sample_filter=self.sample_filter,
            pool=self.pool,
            index=self.pool_index,
            packed=self.packed_marks,
            stats=self.stats,
            codec=self.codec,
        )

    def _build_agents(self) -> None:
        cfg, app = self.config, self.app
        self.trajectories_channel = app.topic(cfg.trajectories_topic, cfg.ticks_topic, **_RAW)
        self.ticks_topic = app.topic(cfg.ticks_topic, **_RAW)
        self.groups_topic = app.topic(cfg.groups_topic, **_RAW)
        self.weights_channel = app.topic(cfg.weights_topic, **_RAW)
        sink = [self._publish]
        # the group and batch agents publish their own outputs: they wait for their deliveries
        self.group_agent = app.agent(self.trajectories_channel, name="group")(self._group_stream)
        self.batch_agent = app.agent(self.groups_topic, name="batch")(self._batch_stream)
        self.weights_agent = app.agent(self.weights_channel, name="weights", sink=sink)(self._weights_stream)
        app.timer(cfg.tick_interval_s, name="ticks")(self._send_ticks)
        app.on_partitions_revoked.connect(cast(Any, self._on_partitions_revoked))
        app.on_partitions_assigned.connect(cast(Any, self._on_partitions_assigned))
        if cfg.stats_interval_s > 0:
            app.timer(cfg.stats_interval_s, name="stats")(self._log_stats)

    # Each agent yields exactly one list of outputs per event (possibly empty), so that
    # `agent.test_context().put()` returns once the event is processed. The group and batch
    # agents send their outputs themselves (they keep the deliveries), the weights agent's sink
    # publishes its dead letters.

    async def _group_stream(self, stream: faust.StreamT) -> AsyncIterator[list[Output]]:
        async for event in cast(faust.Stream, stream).noack().events():  # acks: `self.held`
            message = event.message
            outputs: list[Output] = []
            for taken in await self._in_order(event):
                taken_outputs = self.on_group_event(taken.message, self.held.arrived(taken.message.tp, taken))
                deliveries = [await self._send(output) for output in taken_outputs]
                self._expect_deliveries(taken_outputs, deliveries)
                _drop_bytes(taken)
                outputs += taken_outputs
            yield outputs
            # still in this event's context: the table writes go to its partition
            failed = self._confirm_delivered(message.partition)
            if failed is not None:
                await self.app.crash(failed)
            for done in self.held.ready():
                await ack(stream, done)

    async def _in_order(self, event: Any) -> list[Any]:
        """The events to process for one delivered `event`, in offset order: none when it was
        taken before, else the events Faust dropped ahead of it (read from Kafka) and itself.
        A tick also brings what a quiet trajectories partition never got; other topics (weights)
        are not held."""
        cfg = self.config
        delay, failing = 0.5, False
        while True:
            try:
                taken = await self.inputs.events(
                    event,
                    held=(cfg.trajectories_topic, cfg.groups_topic),
                    ticks=cfg.ticks_topic,
                    ticked=(cfg.trajectories_topic,),
                )
                break
            except AssemblyError as exc:
                if not exc.retriable:  # start over from the committed offset
                    await self.app.crash(exc)
                    return []
                if not failing:
                    log.warning("Kafka is settling (%s); retrying with backoff", exc)
                failing = True
                await asyncio.sleep(delay)
                delay = min(2 * delay, 10.0)
        if failing:
            log.info("Kafka answers again")
        return taken or []  # taken before: skipped, its first delivery is the one acknowledged

    def _reader(self) -> GapReader:
        if self.gap_reader is None:
            self.gap_reader = KafkaGapReader(self.config.bootstrap_servers, self.config.app_id)
        return self.gap_reader

    async def _batch_stream(self, stream: faust.StreamT) -> AsyncIterator[list[Output]]:
        async for event in cast(faust.Stream, stream).noack().events():  # acks: `self.pool_held`
            if self.batched_unchecked:
                self.batched_unchecked = False
                await self._mark_batched_groups()
            outputs: list[Output] = []
            for taken in await self._in_order(event):
                outputs += await self._on_pooled_event(taken)
            yield outputs
            failed = self._confirm_packed()
            if failed is not None:
                await self.app.crash(failed)
            for done in self.pool_held.ready():
                await ack(stream, done)

    async def _on_pooled_event(self, event: Any) -> list[Output]:
        """Stage 2 for one event of the groups topic; sends its outputs."""
        message = event.message
        entry = self.pool_held.arrived(message.tp, event)
        # an empty record is a tick (a group never is): it confirms the deliveries so far
        outputs = self.on_ready_group(message.value, headers=message.headers) if message.value else []
        if self.unwritten:
            outputs += await self._write_waiting()
        entered, left = self.pool.take_changes()
        for group_id in entered:
            self.pool_held.hold(group_id, entry)
        if not entered:
            self.pool_held.done(entry)
        deliveries = [await self._send(output) for output in outputs]
        if left:
            self._batch_deliveries.append((left, deliveries))
        _drop_bytes(event)
        return outputs

    def _confirm_packed(self) -> BaseException | None:
        """Groups that left the pool and whose event's outputs (a batch, dead letters) are
        delivered: write their `packed` marks, release their events. Returns a delivery's error."""
        while self._batch_deliveries and all(_delivered(d) for d in self._batch_deliveries[0][1]):
            left, deliveries = self._batch_deliveries.pop(0)
            errors = (d.exception() for d in deliveries if isinstance(d, asyncio.Future))
            failed = next((e for e in errors if e is not None), None)
            if failed is not None:
                log.error("a batch or dead letter of groups %s was not delivered: %s", left, failed)
                return failed
            self.packed_marks.confirm(left)
            for group_id in left:
                self.pool_held.release(group_id)
        return None

    def on_ready_group(self, payload: bytes, headers: Any = None) -> list[Output]:
        """Stage 2 for one closed group: the batches it completes, dead letters of rejected ones.
        A batch the blob store cannot take now waits in `unwritten` (`_write_waiting`)."""
        self.trace_links.take_group(headers)
        batches = self.builder.on_group(payload, now_ms=self.clock())
        letters = [o for r in self.builder.take_rejected() for o in self._rejected_output(r)]
        self.unwritten += batches
        return letters + self._write_unwritten()

    def _write_unwritten(self) -> list[Output]:
        """Outputs of the waiting batches, oldest first, up to the first one whose claim-check
        blob cannot be written (it and the later ones keep waiting)."""
        outputs: list[Output] = []
        while self.unwritten:
            try:
                outputs.append(self._batch_output(self.unwritten[0]))
            except BlobStoreError as exc:
                self._blob_store_down(exc)
                break
            self.unwritten.pop(0)
        else:
            self._blob_store_up()
        return outputs

    async def _write_waiting(self) -> list[Output]:
        """Wait (backing off) until the blob store takes every waiting batch: the batch stage
        holds its groups meanwhile, nothing is counted or acknowledged that was not sent."""
        outputs: list[Output] = []
        delay = 1.0
        while True:
            outputs += self._write_unwritten()
            if not self.unwritten:
                return outputs
            await asyncio.sleep(delay)
            delay = min(2 * delay, 30.0)

    def _blob_store_down(self, exc: BaseException) -> None:
        if self.blob_store_problem is None:
            log.error(
                "%d batch(es) wait: the claim-check blob store %s cannot be written (%s); "
                "retrying with backoff, the batch stage holds its groups meanwhile",
                len(self.unwritten),
                self.config.output.blob_store_url,
                exc,
            )
            _BLOB_STORE_DOWN.add(1)
        self.blob_store_problem = str(exc)

    def _blob_store_up(self) -> None:
        if self.blob_store_problem is not None:
            log.warning("the claim-check blob store takes batches again")
            _BLOB_STORE_DOWN.add(-1)
        self.blob_store_problem = None

    def _batch_output(self, batch: Any) -> Output:
        value = self.encoder.encode(batch)  # first: a blob that cannot be written sends nothing
        self.stats.batch_sent(batch)
        _BATCHES.add(1)
        _BATCHED_TRAJECTORIES.add(len(batch.trajectory_ids))
        with self.trace_links.batch_span(batch.batch_id, batch.trajectory_ids) as headers:
            return Output(
                self.config.batches_topic,
                batch.batch_id.encode(),
                value,
                headers=self._described(value, [*(headers or []), group_ids_header(batch.group_ids)]),
            )

    def _rejected_output(self, rejected: RejectedGroup) -> list[Output]:
        """One dead letter per sample of a group that could not be packed, with its full record."""
        group = rejected.group
        log.error(
            "group %s could not be packed, dead-lettering its samples: %s", group.group_id, rejected.error
        )
        outputs = []
        for payload in group.payloads:
            trace = self.trace_links.take_trajectory(self._trajectory_id(payload))
            value, note = keep_original(
                payload, dlq_topic=self.config.dlq_topic, store_url=self.config.output.blob_store_url
            )
            letter = DeadLetter(
                source_topic=self.config.trajectories_topic,
                source_partition=0,
                source_offset=-1,  # unknown here: the group was pooled from the groups topic
                reason=f"group {group.group_id} could not be packed: {rejected.error}"[:1000] + note,
                error_type=type(rejected.error).__name__,
                key=group.group_id.encode(),
                value=value,
                headers=_text_headers(trace),
            )
            self.stats.undecodable += 1
            encoded = self.codec.encode(letter)
            described = self._described(encoded, trace)
            outputs.append(Output(self.config.dlq_topic, letter.key, encoded, described))
        return outputs

    def _trajectory_id(self, payload: bytes) -> str:
        """The trajectory id of a pooled payload (a trajectory or its claim check; no blob is
        read); "" when the bytes do not decode."""
        try:
            record = self.codec.decode(payload)
        except Exception:  # the payload may be what broke the group
            return ""
        if isinstance(record, ClaimCheck):
            return record.record_id
        return str(getattr(record, "trajectory_id", ""))

    async def _weights_stream(self, stream: faust.StreamT) -> AsyncIterator[list[Output]]:
        async for event in stream.events():
            yield self.on_weights_event(event.message)

    async def _publish(self, outputs: list[Output]) -> None:
        for output in outputs:
            await self._send(output)

    async def _send(self, output: Output) -> Awaitable[Any]:
        """Hand `output` to the forwarder; while its topic does not exist (deleted under the
        worker), say so once and wait, backing off: the agent holds its events meanwhile."""
        delay, waited = 1.0, False
        while True:
            try:
                delivery = await self.forwarder.send(output)
            except OutputTopicMissing as exc:
                if not waited:
                    log.error(
                        "%s; outputs to it wait (retrying with backoff) until it is created again "
                        "(`stacx infra up` creates the standard topics)",
                        exc,
                    )
                waited = True
                await asyncio.sleep(delay)
                delay = min(2 * delay, 30.0)
                continue
            if waited:
                log.warning("topic %s exists again: its outputs go out", output.topic)
            return delivery

    def on_weights_event(self, message: Any) -> list[Output]:
        """Remember the newest version per model (drives the staleness filter)."""
        try:
            weights = self.codec.decode(message.value, WeightVersion)
        except Exception as exc:  # untrusted bytes: dead-letter them, keep going
            return [self._dead_letter(message, exc)]
        current = self.latest_versions.get(weights.model_name)
        if current is None or weights.version > current:
            self.latest_versions[weights.model_name] = weights.version
            log.info("latest weights %s=%d", weights.model_name, weights.version)
        return []

    def on_group_event(self, message: Any, entry: Any = None) -> list[Output]:
        """Stage 1 for one message of the trajectories topic or the ticks topic; `entry` (its
        `HeldAcks` entry) stays held while the sample's group is open."""
        now = self.clock()
        group_id: str | None = None
        if message.topic == self.config.ticks_topic:
            ready = self.grouper.expire(now_ms=now, partition=message.partition)
            outputs = [self._group_output(g) for g in ready]
        else:
            outputs, group_id = self._on_trajectory_event(message, now)
        if entry is not None:
            self._hold_or_release(entry, group_id)
        return outputs

    def _on_trajectory_event(self, message: Any, now: int) -> tuple[list[Output], str | None]:
        self.stats.trajectories += 1
        self.stats.first_event_ms = self.stats.first_event_ms or now
        try:
            trajectory = decode_trajectory(message.value, self.codec)
        except Exception as exc:  # untrusted bytes: dead-letter them, keep going
            return [self._dead_letter(message, exc)], None
        reason = invalid_reason(trajectory, self.config.filtering.vocab_size)
        if reason is not None:
            vocabulary_only = invalid_reason(trajectory) is None  # a sound record, another model's ids
            return [self._dead_letter(message, ValueError(reason), invalid=vocabulary_only)], None
        self.trace_links.remember(trajectory.group_id, trajectory.trajectory_id, message.headers)
        group = self.grouper.on_trajectory(trajectory, message.value, partition=message.partition, now_ms=now)
        return ([] if group is None else [self._group_output(group)]), trajectory.group_id

    def _hold_or_release(self, entry: Any, group_id: str | None) -> None:
        """Hold the event under its group while the group is open or closing; otherwise (a tick,
        a duplicate, a late or a dead-lettered sample) it is done."""
        closed = self.group_records.take_just_closed()
        for closed_id in closed:
            self._deliveries.setdefault(closed_id, None)
        if group_id is not None and (group_id in self.group_records.open or group_id in closed):
            self.held.hold(group_id, entry)
        else:
            self.held.done(entry)

    def _expect_deliveries(self, outputs: list[Output], deliveries: list[Any]) -> None:
        """Note the delivery of each closed group's output (its held events wait for it)."""
        sent = {id(output): delivery for output, delivery in zip(outputs, deliveries, strict=True)}
        for group_id, output in self._unsent.items():
            self._deliveries[group_id] = sent[id(output)]
        self._unsent.clear()

    def _confirm_delivered(self, partition: int) -> BaseException | None:
        """Groups of `partition` whose output is delivered: remember them as closed in the table
        and release their events. Returns the error of a failed delivery."""
        for group_id, delivery in list(self._deliveries.items()):
            record = self.group_records.closing.get(group_id)
            if record is None:  # its partition was revoked
                del self._deliveries[group_id]
                continue
            if record["partition"] != partition or not _delivered(delivery):
                continue
            if isinstance(delivery, asyncio.Future) and delivery.exception() is not None:
                log.error("group %s was not delivered: %s", group_id, delivery.exception())
                return delivery.exception()
            del self._deliveries[group_id]
            self.group_records.confirm(group_id)
            self.held.release(group_id)
        return None

    async def _on_partitions_revoked(self, sender: Any, revoked: set[Any], **kwargs: Any) -> None:
        """Forget the open groups of revoked partitions, unacknowledged: whoever gets a partition
        rebuilds them from its committed offset."""
        partitions = {tp.partition for tp in revoked if tp.topic == self.config.trajectories_topic}
        self.grouper.forget_partitions(partitions)
        for group_id, record in self.group_records.drop_partitions(partitions).items():
            self._deliveries.pop(group_id, None)
            for trajectory_id in record["members"]:
                self.open_payloads.pop(trajectory_id, None)
        self.held.drop(revoked)
        self.inputs.forget(revoked)
        if partitions:
            log.info("revoked partitions %s: their open groups are rebuilt by their next owner", partitions)
        if any(tp.topic == self.config.groups_topic for tp in revoked):
            self.pool.clear()
            self.pool_index.clear()
            self.packed_marks.pending.clear()
            self.builder.forget_marks_order()
            self._batch_deliveries.clear()
            self.pool_held.drop(revoked)

    async def _on_partitions_assigned(self, sender: Any, assigned: set[Any], **kwargs: Any) -> None:
        await self.inputs.assigned_of(assigned, (self.config.trajectories_topic, self.config.groups_topic))
        if any(tp.topic == self.config.groups_topic for tp in assigned):
            self.batched_unchecked = True

    async def _mark_batched_groups(self) -> None:
        """At stage 2's first event after taking the groups partition, before it packs a group
        read again: mark packed the groups of the batches its last owner delivered but had not
        marked yet (`batched`). Not in the rebalance callback: that one stays short."""
        cfg = self.config
        try:
            found = await asyncio.to_thread(
                batched_since_committed, self._reader(), groups_topic=cfg.groups_topic,
                batches_topic=cfg.batches_topic, codec=self.codec,
            )
        except AssemblyError as exc:
            log.warning("cannot read the batches delivered before this assignment (%s): a group a "
                        "stopped worker batched without marking it may be batched again", exc)
            return
        fresh = self.packed_marks.found_batched(found, at=self.clock())
        if fresh:
            log.info("%d group(s) already in batches on %s had no packed mark: marked packed",
                     fresh, cfg.batches_topic)

    def _group_output(self, group: Any) -> Output:
        output = Output(
            self.config.groups_topic,
            group.model_name.encode(),
            encode_group(group),
            headers=self.trace_links.group_headers(group.group_id),
        )
        self._unsent[group.group_id] = output
        return output

    def _dead_letter(self, message: Any, exc: BaseException, *, invalid: bool = False) -> Output:
        """`message` to the dead-letter topic with why; counted `invalid` (decoded, but refused
        here) or `undecodable`."""
        if invalid:
            self.stats.invalid += 1
        else:
            self.stats.undecodable += 1
        value, note = keep_original(
            message.value, dlq_topic=self.config.dlq_topic, store_url=self.config.output.blob_store_url
        )
        letter = DeadLetter(
            source_topic=str(message.topic),
            source_partition=int(message.partition or 0),
            source_offset=int(message.offset or 0),
            reason=str(exc)[:1000] + note,
            error_type=type(exc).__name__,
            key=message.key,
            value=value,
            headers=_text_headers(message.headers),
        )
        log.warning(
            "dead-lettered %s[%s]@%s: %s",
            letter.source_topic,
            letter.source_partition,
            letter.source_offset,
            letter.reason,
        )
        trace = [(k, v.encode()) for k, v in letter.headers.items() if k in _TRACE_HEADERS]
        encoded = self.codec.encode(letter)
        return Output(self.config.dlq_topic, message.key, encoded, headers=self._described(encoded, trace))

    def _described(
        self, value: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> list[tuple[str, bytes]] | None:
        """`headers` plus the event's `content-type` and schema fingerprint (as every producer
        writes them: `Codec.content_headers`)."""
        return [*(headers or []), *self.codec.content_headers(value)] or None

    async def _send_ticks(self) -> None:
        value = str(now_ms()).encode()
        for partition in range(self.config.partitions or 0):
            await self.ticks_topic.send(key=TICK_KEY, value=value, partition=partition)
        # the batch agent confirms deliveries on its next event, and checks for dropped ones
        if self._batch_deliveries or await self._groups_behind():
            await self.groups_topic.send(key=TICK_KEY, value=b"", partition=0)

    async def _groups_behind(self) -> bool:
        try:
            return await self.inputs.behind(TP(self.config.groups_topic, 0))
        except AssemblyError as exc:
            log.warning("cannot check the groups topic for undelivered events: %s", exc)
            return False

    @property
    def in_flight(self) -> int:
        """Closed groups and batches whose delivery is not confirmed yet."""
        return len(self._deliveries) + len(self._batch_deliveries)

    async def settle(self, timeout_s: float = 10.0) -> None:
        """Before the worker stops: let the agents confirm the outputs in flight, so that their
        marks are written and their events acknowledged (a clean stop re-emits nothing)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.in_flight and asyncio.get_running_loop().time() < deadline:
            await self._send_ticks()  # the agents confirm on their next event
            await asyncio.sleep(min(self.config.tick_interval_s, 0.2))
        if self.in_flight:
            log.warning("stopping with %d outputs unconfirmed: they are emitted again", self.in_flight)

    async def _log_stats(self) -> None:
        log.info("assembler stats %s", self.stats.as_dict())

    def _cover_retention(self) -> None:
        """Remember closed groups (duplicate detection) for as long as the trajectories topic
        keeps its records: a replay from any retained offset then yields no second batch."""
        retention_ms = topic_retention_ms(self.config.bootstrap_servers, self.config.trajectories_topic)
        grouping = self.config.grouping
        if retention_ms is None:
            return
        if retention_ms < 0:
            log.warning(
                "%s keeps records forever, the assembler remembers closed groups for "
                "grouping.closed_ttl_s=%.0fs: a replay from further back is not "
                "deduplicated",
                self.config.trajectories_topic,
                grouping.closed_ttl_s,
            )
        elif retention_ms / 1000 > grouping.closed_ttl_s:
            log.info(
                "closed groups are remembered for the retention of %s (%.0fs)",
                self.config.trajectories_topic,
                retention_ms / 1000,
            )
            grouping.closed_ttl_s = retention_ms / 1000
            self.config.batching.packed_ttl_s = max(self.config.batching.packed_ttl_s, retention_ms / 1000)

    def _watch_rebalances(self, worker: SignalledWorker, watchdog: RebalanceWatchdog) -> None:
        """Poll `watchdog` on the worker's loop (a callback: it runs while Faust's own tasks
        wait) until the worker stops; give up once it stays unsettled too long."""
        settled = self.app.rebalancing_count > 0 and not self.app.rebalancing
        waited = watchdog.overdue(settled)
        if waited is not None:
            worker.give_up(
                f"the assembler has not finished joining group {self.config.app_id} and restoring "
                f"its tables for {waited:.0f}s (rebalance_timeout_s={watchdog.timeout_s:g}): check "
                "the brokers; it exits so that its supervisor restarts it"
            )
        elif worker.stopped_by is None:
            worker.loop.call_later(watchdog.poll_s, self._watch_rebalances, worker, watchdog)

    def worker(self, *, loglevel: str = "info") -> SignalledWorker:
        """A Faust worker (`worker.run()` blocks until it is stopped)."""
        worker = SignalledWorker(self.app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
        # Faust's terminal spinner sets the root logger to DEBUG whenever loglevel >= WARNING,
        # which makes every aiokafka send build a log record: a large CPU cost per message.
        worker.spinner = None
        return worker

    def run(self, *, loglevel: str = "info") -> signal.Signals | None:
        """Create the internal topics, register the output schemas, run the worker until
        SIGINT/SIGTERM: the signal that stopped it. A crash of the worker is raised as
        `AssemblyError`."""
        ensure_internal_topics(self.config)
        for record_type in (TrainingBatch, ClaimCheck, DeadLetter):  # not inside the event loop
            self.codec.local_schema(record_type)
        self._cover_retention()
        worker = self.worker(loglevel=loglevel)
        limit_library_logs()  # aiokafka's line per failed attempt while a broker is away
        if self.config.rebalance_timeout_s > 0:
            self._watch_rebalances(worker, RebalanceWatchdog(self.config.rebalance_timeout_s))
        try:
            worker.run()
        except AssemblyError:
            raise
        except WorkerGaveUp as exc:
            raise AssemblyError(str(exc)) from exc
        except Exception as exc:  # the worker crashed (`app.crash`): Faust re-raises the reason
            raise AssemblyError(f"the assembler stopped on an error: {type(exc).__name__}: {exc}") from exc
        finally:
            log.info("assembler final stats %s", json.dumps(self.stats.as_dict()))
            if self.gap_reader is not None:
                self.gap_reader.close()
        return worker.stopped_by


_TRACE_HEADERS = ("traceparent", "tracestate", "baggage")


def _drop_bytes(event: Any) -> None:
    """A held event is kept for its acknowledgement only: the bytes it carried live on in an open
    group's payloads or a pooled group as long as they are needed, and no longer."""
    event.value = None
    event.message.value = None


def _delivered(delivery: Any) -> bool:
    """Whether an output's delivery is over (None: nothing was sent, or a test forwarder)."""
    return not isinstance(delivery, asyncio.Future) or delivery.done()


def _text_headers(headers: Any) -> dict[str, str]:
    """Kafka headers of a Faust message (a list of pairs or a mapping) as text."""
    pairs = headers.items() if hasattr(headers, "items") else (headers or [])
    return {
        str(k): v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        for k, v in pairs
        if v is not None
    }


def _admin(bootstrap_servers: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap_servers})


def topic_partitions(bootstrap_servers: str, topic: str, timeout_s: float = 15.0) -> int:
    """Partition count of an existing topic (the assembler must match the trajectories topic)."""
    try:
        # all topics: asking for one by name would auto-create it on brokers that allow that
        meta = _admin(bootstrap_servers).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise AssemblyError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from exc
    info = meta.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise AssemblyConfigError(
            f"topic {topic!r} does not exist at {bootstrap_servers}; create it "
            "(`stacx infra up` creates the standard topics) or set `partitions` in the config"
        )
    return len(info.partitions)


def topic_retention_ms(bootstrap_servers: str, topic: str, timeout_s: float = 15.0) -> int | None:
    """`retention.ms` of `topic` (-1: forever); None when it cannot be read."""
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        admin = _admin(bootstrap_servers)  # referenced until the answer is in
        configs = admin.describe_configs([resource])[resource].result(timeout_s)
        return int(configs["retention.ms"].value)
    except (KafkaException, KeyError, ValueError) as exc:
        log.warning("cannot read retention.ms of %s: %s", topic, exc)
        return None


def ensure_internal_topics(cfg: AssemblerApp.Config, timeout_s: float = 30.0) -> None:
    """Create the ticks and groups topics with the right partition counts (idempotent)."""
    assert cfg.partitions is not None
    wanted = {cfg.ticks_topic: cfg.partitions, cfg.groups_topic: 1}
    admin = _admin(cfg.bootstrap_servers)
    existing = admin.list_topics(timeout=timeout_s).topics
    for name, count in wanted.items():
        if name in existing and len(existing[name].partitions) != count:
            raise AssemblyConfigError(
                f"internal topic {name!r} has {len(existing[name].partitions)} partitions, "
                f"expected {count}: delete it or use another app_id"
            )
    config = cfg.topic_policy.internal_config(_INTERNAL_CONFIG)
    replicas = cfg.topic_policy.replication_factor
    missing = [
        NewTopic(name, num_partitions=count, replication_factor=replicas, config=config)
        for name, count in wanted.items()
        if name not in existing
    ]
    for name, future in admin.create_topics(missing).items() if missing else []:
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise AssemblyError(f"cannot create internal topic {name!r}: {exc}") from exc


_INTERNAL_CONFIG = {"max.message.bytes": str(topics.BATCHES_MAX_MESSAGE_BYTES)}


def _stacx_home(*parts: str) -> str:
    home = Path(os.environ.get("STACX_HOME", Path.home() / ".cache" / "stacx"))
    return str(home.joinpath(*parts))


def _new_faust_app(cfg: AssemblerApp.Config) -> IdempotentApp:
    use_fast_lz4()
    quiet_missing_topics()
    web: dict[str, Any] = {"web_enabled": False}
    if cfg.web_port is not None:
        web = {"web_enabled": True, "web_port": cfg.web_port, "web_bind": "127.0.0.1"}
    app = IdempotentApp(
        cfg.app_id,
        broker=[f"kafka://{host}" for host in cfg.bootstrap_servers.split(",")],
        store=cfg.store,
        datadir=cfg.datadir,
        topic_replication_factor=cfg.topic_policy.replication_factor,
        topic_partitions=cfg.partitions,
        consumer_auto_offset_reset="earliest",
        consumer_max_fetch_size=cfg.consumer_max_fetch_bytes,
        producer_max_request_size=cfg.producer_max_request_size,
        # lz4 like every STACX producer (aiokafka writes it with cramjam); topics keep it as written
        producer_compression_type="lz4",
        # fewer, larger produce requests: changelog and output records come in bursts
        producer_max_batch_size=1024 * 1024,
        producer_linger=0.005,
        producer_acks=-1,  # IdempotentApp: acks=all with enable_idempotence
        processing_guarantee="at_least_once",
        # held acknowledgements (open groups) are normal: never wait for them on a rebalance
        # or at shutdown, their events are read again by the partition's next owner
        stream_wait_empty=False,
        # the committed offset of a partition stays at its oldest open group, as long as that
        # group's timeout: not a stuck worker
        broker_commit_livelock_soft_timeout=max(300.0, 3 * cfg.grouping.group_timeout_s),
        broker_session_timeout=cfg.session_timeout_s,
        broker_heartbeat_interval=cfg.heartbeat_interval_s,
        consumer_group_instance_id=cfg.group_instance_id,
        table_standby_replicas=cfg.standby_replicas,
        PartitionAssignor=make_assignor(cfg.trajectories_topic, cfg.groups_topic, cfg.batch_stage_share),
        autodiscover=False,
        **web,
    )
    app.fetch_max_wait_ms = cfg.fetch_max_wait_ms
    return app
