"""`WeightSubscriber`: keep an inference server on the newest published weights.

Follows the compacted `stacx.weights` topic (key = model name, value = `WeightVersion`). At
start-up it reads the topic to its end and applies only the latest version of its model; after
that each newer version is applied as it arrives and older or repeated ones are ignored. A version
number seen with two different content hashes (a trainer restarted without its checkpoint) is
refused loudly: an error line, `num_conflicts`, and the server keeps what it serves. Applying
means `POST /update_weights_from_disk` and confirming the reported `weight_version` with
`GET /get_model_info`: the SGLang HTTP API, so the same subscriber drives the built-in server and
SGLang. It speaks HTTP itself (httpx) because consumers/ does not import rollout/.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
from opentelemetry import metrics, propagate
from opentelemetry.trace import SpanKind

from stacx.consumers.errors import ConsumerError
from stacx.producers.tracing import SECONDS_BUCKETS, context_from_headers, span, tracing_on
from stacx.schemas import topics
from stacx.schemas.records import WeightVersion

__all__ = ["EventSource", "WeightConflictError", "WeightSubscriber", "WeightUpdateError", "subscriber_group"]

_meter = metrics.get_meter("stacx.weights")
_SWAP_SECONDS = _meter.create_histogram(
    "stacx.weights.swap_duration",
    unit="s",
    description="load and confirm one weight version on the server",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)
_SERVED_VERSION = _meter.create_gauge("stacx.weights.served_version", description="version the server serves")

log = logging.getLogger(__name__)


class WeightUpdateError(ConsumerError):
    """The server did not take a weight version (after retries, or it refused the files)."""


class WeightConflictError(WeightUpdateError):
    """A version number arrived with a content hash other than the one first seen for it."""


MAX_REMEMBERED_HASHES = 4096
"""Content hashes remembered per subscriber (newest versions) to recognise conflicts."""


class EventSource(Protocol):
    """What the subscriber needs from `stacx.consumers.EventConsumer` (a fake fits in tests)."""

    def poll(self, timeout: float = 1.0) -> Any: ...

    def total_lag(self, timeout: float = 10.0) -> int: ...

    def assignment(self) -> list[tuple[str, int]]: ...

    def commit(self, events: Any = None) -> None: ...

    def close(self) -> None: ...


def _bootstrap_default() -> str:

    return topics.default_bootstrap()


class WeightSubscriber:
    """Applies each newer `WeightVersion` of one model to one inference server."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        model_name: str
        """Kafka key of the model (or role) this server serves."""
        server_url: str
        """Base URL of the inference server, e.g. http://127.0.0.1:30000."""
        bootstrap_servers: str = field(default_factory=_bootstrap_default)
        """Kafka bootstrap.servers (default: $STACX_KAFKA or 127.0.0.1:9092)."""
        topic: str = topics.WEIGHTS
        """Compacted topic of `WeightVersion` events."""
        group_id: str | None = None
        """Consumer group, one per subscriber (the weights topic has one partition); None:
        `stacx-weights-<run>-<model>-<host>-<server port>` (see `subscriber_group`). The subscriber
        commits what it handled, so operators see its lag, and rereads the compacted topic from
        its start at every start-up."""
        abort_running: bool = False
        """Abort requests running on the old weights instead of letting them finish."""
        request_timeout_s: float = 600.0
        """Timeout of one update call (loading large checkpoints takes a while)."""
        max_attempts: int = 6
        """Tries per version when the server is unreachable or busy (429/5xx)."""
        backoff_s: float = 0.5
        """First retry delay, doubled each try."""
        catch_up_timeout_s: float = 60.0
        """How long start-up may spend reading the topic to its end."""
        rejoin_after_s: float = 60.0
        """A consumer without partitions for this long (its group session was lost, e.g. while
        the broker restarted, and never came back) is replaced by a new one, which catches up."""

        def __post_init__(self) -> None:
            if not self.model_name:
                raise ValueError(
                    "WeightSubscriber.Config.model_name is empty: name the model "
                    "whose versions to follow (the Kafka key on stacx.weights)"
                )

    def __init__(
        self, config: Config, source: EventSource | None = None, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.config = config
        self._owns_source = source is None
        self._source = source if source is not None else self._default_source()
        self._http = httpx.Client(
            base_url=config.server_url, timeout=config.request_timeout_s, transport=transport,
            event_hooks={"request": [_inject_trace_context]},
        )
        self.applied: WeightVersion | None = None
        """Latest version confirmed on the server."""
        self.num_ignored = 0
        """Events skipped: other models, or not newer than `applied`."""
        self.num_conflicts = 0
        """Versions refused because their content hash differs from the one first seen."""
        self._hashes: OrderedDict[int, str] = OrderedDict()

    def _default_source(self) -> EventSource:
        from stacx.consumers.event_consumer import EventConsumer

        group = self.config.group_id or subscriber_group(
            self.config.model_name, self.config.server_url, self.config.topic
        )
        consumer = EventConsumer(
            EventConsumer.Config(
                bootstrap_servers=self.config.bootstrap_servers,
                group_id=group,
                topics=[self.config.topic],
                client_id=f"stacx-weights-{self.config.model_name}",
                auto_offset_reset="earliest",
            )
        )
        # the server may have restarted on its base weights: find the latest version again
        consumer.seek_to_beginning()
        return consumer

    # -- following -----------------------------------------------------------------------------

    def catch_up(self) -> WeightVersion | None:
        """Read the topic to its end and apply only the newest version of our model."""
        latest: WeightVersion | None = None
        latest_event: Any = None
        deadline = time.monotonic() + self.config.catch_up_timeout_s
        while time.monotonic() < deadline:
            event = self._source.poll(0.5)
            if event is not None:
                if self._guarded(self._check_content, event.value) and \
                        self._is_newer(event.value, latest):
                    latest, latest_event = event.value, event
                continue
            if self._source.assignment() and self._source.total_lag() == 0:
                break
        else:
            log.warning(
                "catch-up on %s stopped after %.0fs before reaching the end",
                self.config.topic,
                self.config.catch_up_timeout_s,
            )
        if latest is not None and self._is_newer(latest, self.applied):
            with self._swap_span(latest_event):
                self.apply(latest)
        self._commit()
        return self.applied

    def handle(self, record: Any) -> bool:
        """Apply `record` if it is a newer version of our model; True when applied. Raises
        `WeightConflictError` when its content hash conflicts with an earlier announcement."""
        self._check_content(record)
        if not self._is_newer(record, self.applied):
            self.num_ignored += 1
            return False
        self.apply(record)
        return True

    def run(self, stop: threading.Event | None = None, poll_timeout_s: float = 1.0) -> None:
        """Catch up, then follow until `stop` is set. A version the server refuses is skipped."""
        stop = stop or threading.Event()
        self._guarded(self.catch_up)
        assigned_at = time.monotonic()
        while not stop.is_set():
            try:
                event = self._source.poll(poll_timeout_s)
            except Exception as exc:  # the broker is away: the client reconnects by itself
                log.warning("weights topic: %s: %s", type(exc).__name__, exc)
                stop.wait(poll_timeout_s)
                continue
            if event is not None:
                with self._swap_span(event):
                    self._guarded(self.handle, event.value)
                self._commit(event)
            if self._source.assignment():
                assigned_at = time.monotonic()
            elif time.monotonic() - assigned_at >= self.config.rejoin_after_s:
                self._rejoin()
                assigned_at = time.monotonic()

    def _rejoin(self) -> None:
        """Replace a consumer that lost its partitions for good, then catch up again."""
        if not self._owns_source:
            return
        log.warning("no partition of %s for %.0fs: reconnecting", self.config.topic,
                    self.config.rejoin_after_s)
        try:
            self._source.close()
        except Exception as exc:  # a broken client: replaced anyway
            log.warning("closing the old consumer: %s", exc)
        self._source = self._default_source()
        self._guarded(self.catch_up)

    def _commit(self, event: Any = None) -> None:
        """Commit past `event` (None: everything read): the group's lag shows what is unread."""
        try:
            self._source.commit(event)
        except Exception as exc:  # the broker is away: the next event commits again
            log.warning("weights topic: commit failed: %s", exc)

    def close(self) -> None:
        self._source.close()
        self._http.close()

    def __enter__(self) -> WeightSubscriber:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _swap_span(self, event: Any) -> AbstractContextManager[Any]:
        """A `weights.swap` span continuing the weight event's trace (the trainer step that
        published it); the server's own update span joins it over HTTP."""
        record = getattr(event, "value", None)
        if not tracing_on() or not isinstance(record, WeightVersion):
            return nullcontext()
        if not self._is_newer(record, self.applied):
            return nullcontext()
        return span(
            "stacx.weights", "weights.swap", kind=SpanKind.CONSUMER,
            context=context_from_headers(getattr(event, "headers", None)),
            attributes={"stacx.model_name": record.model_name, "stacx.weight_version": record.version,
                        "stacx.server_url": self.config.server_url},
        )

    def _is_newer(self, record: Any, than: WeightVersion | None) -> bool:
        if not isinstance(record, WeightVersion) or record.model_name != self.config.model_name:
            return False
        return than is None or record.version > than.version

    def _check_content(self, record: Any) -> None:
        """Remember the first content hash of each version; refuse a conflicting one."""
        if not isinstance(record, WeightVersion) or record.model_name != self.config.model_name \
                or not record.content_hash:
            return
        known = self._hashes.get(record.version)
        if known is None:
            self._hashes[record.version] = record.content_hash
            while len(self._hashes) > MAX_REMEMBERED_HASHES:
                self._hashes.popitem(last=False)
            return
        if known != record.content_hash:
            self.num_conflicts += 1
            raise WeightConflictError(
                f"refusing {record.model_name} v{record.version} ({record.content_hash[:19]}… "
                f"from {record.trainer_id or 'an unnamed trainer'}): v{record.version} was "
                f"announced before with {known[:19]}…. A trainer restarted without its "
                "checkpoint (checkpoint.resume: false, or a deleted checkpoint.dir); the server "
                "keeps its current weights")

    @staticmethod
    def _guarded(step: Callable[..., object], *args: Any) -> bool:
        """Run `step`; log a refused update (True: it went through)."""
        try:
            step(*args)
        except WeightUpdateError as exc:
            log.error("weight update skipped: %s", exc)
            return False
        return True

    # -- applying ------------------------------------------------------------------------------

    def apply(self, version: WeightVersion) -> None:
        """Load `version` on the server and confirm it; raises `WeightUpdateError`."""
        expected = str(version.version)
        started = time.perf_counter()
        if self.server_version() != expected:
            body = {
                "model_path": version.path,
                "weight_version": expected,
                "abort_all_requests": self.config.abort_running,
            }
            answer = self._request("POST", "/update_weights_from_disk", body)
            if answer.get("success") is False:
                raise WeightUpdateError(
                    f"server refused {version.model_name} v{expected} from {version.path}: "
                    f"{answer.get('message')}"
                )
            reported = self.server_version()
            if reported != expected:
                raise WeightUpdateError(
                    f"server reports weight_version {reported!r} after loading v{expected}"
                )
        self.applied = version
        labels = {"model_name": version.model_name}
        _SWAP_SECONDS.record(time.perf_counter() - started, labels)
        _SERVED_VERSION.set(version.version, labels)
        log.info(
            "server %s now serves %s v%s (%s)",
            self.config.server_url,
            version.model_name,
            expected,
            version.path,
        )

    def server_version(self) -> str:
        return str(self._request("GET", "/get_model_info").get("weight_version"))

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        delay = self.config.backoff_s
        problem = ""
        for _ in range(self.config.max_attempts):
            try:
                response = self._http.request(method, path, json=body)
            except httpx.TransportError as exc:
                problem = f"{exc!r}"
            else:
                if response.status_code not in (429, 500, 502, 503, 504):
                    return _json_body(response, method, path)
                problem = f"HTTP {response.status_code}"
            time.sleep(delay)
            delay *= 2
        raise WeightUpdateError(
            f"{method} {self.config.server_url}{path} failed "
            f"{self.config.max_attempts} times (last: {problem})",
            retriable=True,
        )


def subscriber_group(model_name: str, server_url: str, topic: str = topics.WEIGHTS) -> str:
    """`stacx-weights-<run>-<model>-<host>-<port>` for a run's topic (`stacx.weights.<run>`),
    `stacx-weights-<model>-<host>-<port>` for the shared one (<host>: the server's address, or this
    machine's host name for a loopback one): one group per inference server and
    run, named so operators find it (`stacx topics describe`, kafka-consumer-groups.sh), the same
    after a restart. The run is in the name so that deleting one run's groups (`stacx topics gc
    --run`) never touches another run's server on the same port."""
    url = urlsplit(server_url)
    run = topic.removeprefix(topics.WEIGHTS + ".") if topic != topics.WEIGHTS else ""
    scope = f"{run}-" if run else ""
    return f"stacx-weights-{scope}{model_name}-{_server_host(url.hostname)}-{url.port or 0}"


LOCAL_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1", "0.0.0.0", "::"})
"""Server addresses that name no machine: the group takes the machine's host name instead."""


def _server_host(address: str | None) -> str:
    """The server's own address when it has one others reach it by (a cluster host's, unique in
    the cluster even where every host reports the same host name, as network namespaces and
    cloned containers do), else this machine's host name."""
    return socket.gethostname() if (address or "") in LOCAL_HOSTS else str(address)


def _inject_trace_context(request: httpx.Request) -> None:
    """W3C `traceparent` of the swap span on the server's update call."""
    propagate.inject(request.headers)


def _json_body(response: httpx.Response, method: str, path: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {"message": response.text[:300]}
    if not isinstance(body, dict):
        body = {"message": str(body)[:300]}
    if response.status_code >= 400 and "success" not in body:
        raise WeightUpdateError(
            f"{method} {path} answered HTTP {response.status_code}: "
            f"{body.get('message') or body.get('error') or body}"
        )
    return body
