"""The run's Kafka topics as the view needs them: a summary of every trajectory read so far (read
on from where it stopped, so a live run grows), the policy versions on the weights topic, and one
whole trajectory fetched again by its partition and offset when a page shows it.

Nothing joins a consumer group or commits: partitions are assigned by hand, so viewing a run
leaves no trace on the broker. Events decode through the product's codec, with writer schemas
resolved from the schema catalogue (read only).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from stacx.consumers.assembly.claims import decode_trajectory
from stacx.consumers.assembly.errors import InvalidTrajectoryError
from stacx.producers.errors import BlobStoreError
from stacx.producers.kafka_log import kafka_logger
from stacx.schemas.catalogue import SchemaCatalogue
from stacx.schemas.codec import Codec
from stacx.schemas.errors import SchemaError
from stacx.schemas.records import Trajectory, WeightVersion

__all__ = ["Fetched", "RunTopicsReader", "TrajectorySummary", "VersionPoint", "trace_id_of"]

log = logging.getLogger(__name__)

_UNDECODABLE = (SchemaError, InvalidTrajectoryError, BlobStoreError, ValueError)
"""What a record that is not a valid trajectory event raises when decoded."""


@dataclass(frozen=True, slots=True)
class TrajectorySummary:
    """What the list and the curves need of one trajectory event."""

    partition: int
    offset: int
    timestamp_ms: int
    """Record timestamp (when it was written to the topic)."""
    trajectory_id: str
    task_id: str
    task_type: str
    model_name: str
    policy_version: int
    reward: float
    status: str
    num_tokens: int
    num_trained: int
    """Tokens with loss mask 1."""
    num_turns: int
    num_tool_calls: int
    trace_id: str


@dataclass(frozen=True, slots=True)
class VersionPoint:
    """One policy version published on the weights topic."""

    version: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Fetched:
    """One whole trajectory and the headers of its event."""

    trajectory: Trajectory
    headers: dict[str, bytes]
    partition: int
    offset: int

    @property
    def trace_id(self) -> str:
        return trace_id_of(self.headers)


def trace_id_of(headers: dict[str, bytes] | None) -> str:
    """The trace id of a W3C `traceparent` header (version-traceid-spanid-flags); "" without one."""
    parts = (headers or {}).get("traceparent", b"").decode("ascii", "replace").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else ""


def _headers(raw: Any) -> dict[str, bytes]:
    """Kafka headers as a dict (a header without a value is left out)."""
    return {k: v if isinstance(v, bytes) else str(v).encode() for k, v in (raw or []) if v is not None}


def _summary(
    t: Trajectory, partition: int, offset: int, timestamp_ms: int, trace_id: str
) -> TrajectorySummary:
    return TrajectorySummary(
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        trajectory_id=t.trajectory_id,
        task_id=t.task_id,
        task_type=t.task_type,
        model_name=t.model_name,
        policy_version=t.policy_version,
        reward=float(t.reward),
        status=str(t.status),
        num_tokens=int(len(t.token_ids)),
        num_trained=int(t.loss_mask.sum()) if len(t.loss_mask) else 0,
        num_turns=len(t.turns),
        num_tool_calls=sum(len(turn.tool_calls) for turn in t.turns),
        trace_id=trace_id,
    )


class RunTopicsReader:
    """Reads one run's trajectories (and weights) topic on demand; thread-safe."""

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        trajectories_topic: str,
        weights_topic: str | None,
        model_name: str | None = None,
        min_refresh_interval_s: float = 2.0,
        timeout_s: float = 10.0,
    ) -> None:
        from confluent_kafka import Consumer

        self.trajectories_topic = trajectories_topic
        self.weights_topic = weights_topic
        self.model_name = model_name
        self.min_refresh_interval_s = min_refresh_interval_s
        self.timeout_s = timeout_s
        self.summaries: list[TrajectorySummary] = []
        self.versions: list[VersionPoint] = []
        self.undecodable = 0
        self.error: str | None = None
        self._positions: dict[str, dict[int, int]] = {t: {} for t in (trajectories_topic, weights_topic) if t}
        self._known: set[tuple[int, int]] = set()
        """(partition, offset) of every trajectory read: a page of any other answers 404 at once."""
        """topic -> partition -> next offset to read."""
        self._last_refresh = 0.0
        self._lock = threading.Lock()
        catalogue = SchemaCatalogue(
            SchemaCatalogue.Config(bootstrap_servers=bootstrap_servers, create_topic=False)
        )
        self._codec = Codec(resolver=catalogue.lookup)
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": "stacx-view",  # required by the client; never joined (assign) nor committed
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "fetch.message.max.bytes": 16 * 1024 * 1024,
                "logger": kafka_logger(),
            }
        )

    def close(self) -> None:
        with self._lock:
            self._consumer.close()

    def refresh(self, *, force: bool = False) -> None:
        """Read what was written since the last refresh (at most once per `min_refresh_interval_s`)."""
        with self._lock:
            if not force and time.monotonic() - self._last_refresh < self.min_refresh_interval_s:
                return
            try:
                for topic in self._positions:
                    self._read_new(topic)
                self.error = None
            except Exception as exc:  # the broker gone, say: the page says so and shows what it has
                self.error = f"cannot read {self.trajectories_topic}: {type(exc).__name__}: {exc}"
                log.warning("%s", self.error)
            self._last_refresh = time.monotonic()

    def fetch(self, partition: int, offset: int) -> Fetched | None:
        """The trajectory at `partition`/`offset` of the trajectories topic (None: not there)."""
        from confluent_kafka import TopicPartition

        with self._lock:
            if (partition, offset) not in self._known:  # never waits on the broker for it
                return None
            self._consumer.assign([TopicPartition(self.trajectories_topic, partition, offset)])
            try:
                deadline = time.monotonic() + self.timeout_s
                while time.monotonic() < deadline:
                    msg: Any = self._consumer.poll(0.2)
                    if msg is None or msg.error() is not None:
                        continue
                    if msg.offset() != offset:
                        return None  # compacted or deleted: the next record came instead
                    try:
                        trajectory = decode_trajectory(msg.value(), self._codec)
                    except _UNDECODABLE as exc:
                        log.warning(
                            "%s/%d@%d does not decode: %s", self.trajectories_topic, partition, offset, exc
                        )
                        return None
                    return Fetched(trajectory, _headers(msg.headers()), partition, offset)
                return None
            finally:
                self._consumer.unassign()

    # ------------------------------------------------------------------------------- reading

    def _partitions(self, topic: str) -> list[int]:
        # all topics: asking for one by name would create it on brokers that auto-create topics
        meta = self._consumer.list_topics(timeout=self.timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        return sorted(meta.partitions)

    def _read_new(self, topic: str) -> None:
        from confluent_kafka import TopicPartition

        positions = self._positions[topic]
        bounds: dict[int, int] = {}
        for p in self._partitions(topic):
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=self.timeout_s, cached=False
            )
            start = max(low, positions.get(p, low))
            positions[p] = start
            if start < high:
                bounds[p] = high
        if not bounds:
            return
        self._consumer.assign([TopicPartition(topic, p, positions[p]) for p in bounds])
        try:
            self._drain(topic, bounds, positions)
        finally:
            self._consumer.unassign()

    def _drain(self, topic: str, bounds: dict[int, int], positions: dict[int, int]) -> None:
        from confluent_kafka import TopicPartition

        todo = dict(bounds)
        deadline = time.monotonic() + self.timeout_s
        while todo and time.monotonic() < deadline:
            messages: list[Any] = self._consumer.consume(2048, 0.2)
            if messages:
                deadline = time.monotonic() + self.timeout_s
            for msg in messages:
                p = msg.partition()
                if msg.error() is not None or p not in todo or msg.offset() >= todo[p]:
                    continue
                self._ingest(topic, msg)
                positions[p] = msg.offset() + 1
                if positions[p] >= todo[p]:
                    del todo[p]
            # compaction and transaction markers leave gaps: the position says where a partition is
            for tp in self._consumer.position([TopicPartition(topic, p) for p in todo]) if todo else []:
                if tp.offset is not None and tp.offset >= 0:
                    positions[tp.partition] = max(positions[tp.partition], tp.offset)
                if positions[tp.partition] >= todo[tp.partition]:
                    del todo[tp.partition]

    def _ingest(self, topic: str, msg: Any) -> None:
        timestamp_ms = msg.timestamp()[1]
        if topic == self.weights_topic:
            self._ingest_weights(msg.value(), timestamp_ms)
            return
        try:
            trajectory = decode_trajectory(msg.value(), self._codec)
        except _UNDECODABLE as exc:
            self.undecodable += 1
            log.debug("undecodable record at %s/%d@%d: %s", topic, msg.partition(), msg.offset(), exc)
            return
        if self.model_name is not None and trajectory.model_name != self.model_name:
            return
        trace_id = trace_id_of(_headers(msg.headers()))
        self.summaries.append(_summary(trajectory, msg.partition(), msg.offset(), timestamp_ms, trace_id))
        self._known.add((msg.partition(), msg.offset()))

    def _ingest_weights(self, value: bytes | None, timestamp_ms: int) -> None:
        if value is None:
            return
        try:
            record = self._codec.decode(value)
        except (SchemaError, ValueError) as exc:
            log.debug("undecodable weights record: %s", exc)
            return
        if not isinstance(record, WeightVersion):
            return
        if self.model_name is not None and record.model_name != self.model_name:
            return
        self.versions.append(VersionPoint(version=record.version, timestamp_ms=timestamp_ms))
