"""Real implementations of the rollout seams: sandbox gateways, inference client, Kafka.

Third-party imports happen inside the constructors, so importing this module is cheap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

from stacx.rollout.errors import InferenceCallError
from stacx.rollout.gateways import GatewayEnvironments, GatewaySession
from stacx.rollout.protocols import Generation, SamplingParams
from stacx.schemas import topics
from stacx.schemas.records import Trajectory, WeightVersion

__all__ = [
    "GatewayEnvironments",
    "GatewaySession",
    "InferenceAdapter",
    "KafkaTrajectoryPublisher",
    "WeightsFollower",
]

log = logging.getLogger(__name__)


class InferenceAdapter:
    """Adapts `stacx.rollout.inference.InferenceClient` (built-in server or SGLang) to the evaluator's
    `InferenceClient` protocol: our `SamplingParams` in, a `Generation` out.

    `client.generate(input_ids, sampling, return_logprob=True)` must return an object (or dict)
    with output_ids, logprobs, weight_version and finish_reason.
    """

    def __init__(self, client: Any, sampling_type: Any = None) -> None:
        self.client = client
        if sampling_type is None:
            from stacx.rollout.inference.sampling import SamplingParams as sampling_type
        self.sampling_type = sampling_type

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        sampling = self.sampling_type(
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            stop=list(params.stop),
            stop_token_ids=list(params.stop_token_ids),
        )
        try:
            out = await self.client.generate(list(input_ids), sampling, return_logprob=True)
        except Exception as exc:
            raise InferenceCallError(f"{type(exc).__name__}: {exc}") from exc
        return _generation(out)


def _field(out: Any, *names: str) -> Any:
    for name in names:
        if isinstance(out, dict) and name in out:
            return out[name]
        if hasattr(out, name):
            return getattr(out, name)
    raise InferenceCallError(f"inference answer lacks {names[0]!r} ({type(out).__name__})")


def _generation(out: Any) -> Generation:
    ids = [int(x) for x in _field(out, "output_ids")]
    lps = [float(x) for x in _field(out, "logprobs", "output_token_logprobs")]
    version = _field(out, "weight_version")
    reason = _field(out, "finish_reason")
    if isinstance(reason, dict):  # SGLang: {"type": "stop", ...}
        reason = reason.get("type", "stop")
    return Generation(
        output_ids=ids, logprobs=lps, weight_version=_version(version), finish_reason=str(reason)
    )


def _version(value: Any) -> int | None:
    """SGLang reports weight_version as text ("default" before any update)."""
    try:
        return int(str(value))
    except ValueError:
        return None


CLOSE_TIMEOUT_S = 20.0
"""Longest wait for the broker's acknowledgements when a rollout stops (Kafka may be gone)."""


class KafkaTrajectoryPublisher:
    """Publishes trajectories to `stacx.trajectories`, keyed by group id."""

    def __init__(
        self, producer: Any = None, *, bootstrap_servers: str | None = None, topic: str = topics.TRAJECTORIES
    ) -> None:
        if producer is None:
            from stacx.producers import EventProducer

            config = EventProducer.Config(client_id="stacx-rollout")
            if bootstrap_servers:
                config.bootstrap_servers = bootstrap_servers
            producer = EventProducer(config)
        self.producer = producer
        self.topic = topic

    async def publish(self, trajectory: Trajectory) -> None:
        await self.producer.publish_async(self.topic, trajectory, key=trajectory.group_id)

    async def close(self) -> None:
        """Deliver what is queued within `CLOSE_TIMEOUT_S`, then stop: with Kafka away, a stopping
        rollout ends in bounded time (the undelivered trajectories are logged as failed)."""
        await asyncio.to_thread(self.producer.close, CLOSE_TIMEOUT_S)


def follower_group(model_name: str) -> str:
    """`stacx-rollout-weights-<model>-<host>-<pid>`: one group per rollout worker process."""
    return f"stacx-rollout-weights-{model_name}-{socket.gethostname()}-{os.getpid()}"


class WeightsFollower:
    """Follows the compacted `stacx.weights` topic in a thread; `current()` is the newest version
    published for `model_name` (starting from `initial`)."""

    def __init__(
        self,
        model_name: str,
        *,
        bootstrap_servers: str | None = None,
        topic: str = topics.WEIGHTS,
        initial: int = 0,
        consumer: Any = None,
        group_id: str | None = None,
    ) -> None:
        self.model_name = model_name
        self._version = initial
        self._hashes: dict[int, str] = {}
        self.num_conflicts = 0
        """Announcements refused: a version number seen before with another content hash."""
        self.group_id = group_id or follower_group(model_name)
        """Consumer group (committed after each version: its lag is visible to operators)."""
        if consumer is None:
            consumer = self._make(bootstrap_servers, topic, self.group_id)
        self._consumer = consumer
        self._stop = threading.Event()
        self.caught_up = threading.Event()
        """Set once a poll came back empty with partitions assigned."""
        self._thread = threading.Thread(target=self._loop, name="stacx-weights", daemon=True)
        self._thread.start()

    @staticmethod
    def _make(bootstrap_servers: str | None, topic: str, group_id: str) -> Any:
        from stacx.consumers import EventConsumer

        config = EventConsumer.Config(topics=[topic], group_id=group_id, auto_offset_reset="earliest")
        if bootstrap_servers:
            config.bootstrap_servers = bootstrap_servers
        consumer = EventConsumer(config)
        consumer.seek_to_beginning()  # the newest version is found again after every start
        return consumer

    def current(self) -> int:
        return self._version

    def observe(self, record: WeightVersion) -> None:
        if record.model_name != self.model_name:
            return
        known = self._hashes.setdefault(record.version, record.content_hash)
        if record.content_hash and known and known != record.content_hash:
            self.num_conflicts += 1
            log.error(
                "refusing %s v%d (%s): announced before with %s; a trainer restarted without its checkpoint",
                self.model_name,
                record.version,
                record.content_hash[:19],
                known[:19],
            )
            return
        if record.version > self._version:
            log.info("policy %s is now at version %d", self.model_name, record.version)
            self._version = record.version

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                event = self._consumer.poll(0.2)
            except Exception as exc:  # keep following; the manager keeps the last version
                log.warning("weights follower: %s", exc)
                self._stop.wait(1.0)
                continue
            if event is not None and isinstance(event.value, WeightVersion):
                self.observe(event.value)
                self._commit(event)
            elif event is None and self._assigned():
                self.caught_up.set()  # nothing more to read right now: the latest is applied

    def _commit(self, event: Any) -> None:
        try:
            self._consumer.commit(event)
        except Exception as exc:  # the broker is away: the next version commits again
            log.warning("weights follower: commit failed: %s", exc)

    def _assigned(self) -> bool:
        assignment = getattr(self._consumer, "assignment", None)
        return bool(assignment()) if callable(assignment) else True

    def wait_caught_up(self, timeout_s: float) -> bool:
        """Block until the topic was read to its end once (True) or `timeout_s` passed."""
        return self.caught_up.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()
