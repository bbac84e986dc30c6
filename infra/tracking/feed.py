"""The tracking feed: a consumer thread that reads the run's topics (its own consumer group,
named after the run) and the services' metrics endpoints, and logs figures to the trackers."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stacx.infra.tracking.figures import Point, RunFigures
from stacx.infra.tracking.memory import service_memory
from stacx.infra.tracking.protocols import Outcome
from stacx.infra.tracking.scrape import MetricsEndpoint, ScrapeRates
from stacx.infra.tracking.trackers import TrackerSet
from stacx.schemas.records import TrainingBatch, Trajectory, WeightVersion

__all__ = ["TrackingFeed"]

log = logging.getLogger(__name__)

TABLE_NAME = "trajectories"
COMMIT_EVERY_S = 10.0
SWAP_POLL_S = 0.25
"""How often the server's version is asked for: the publish-to-swap time is known to about this."""


@dataclass(frozen=True, slots=True)
class _Published:
    """A weight version and its Kafka timestamp."""

    weights: WeightVersion
    timestamp_ms: int


class TrackingFeed:
    """Feeds a `TrackerSet` from the run's events; every tracker call happens on its thread."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        bootstrap_servers: str
        """The run's Kafka."""
        topics: list[str]
        """The run's trajectories, batches and weights topics."""
        group_id: str
        """`stacx-tracking-<run id>`: deleted with the run's topics."""
        model_name: str
        """The policy's key on the weights topic (other models' events are not this run's)."""
        endpoints: list[MetricsEndpoint] = field(default_factory=list)
        """Scraped at each new version."""
        drain_timeout_s: float = 60.0
        """At the end, how long to read on until the topics are consumed to their end."""
        summary_min_episodes: int | None = None
        """`TrackingConfig.summary_min_episodes`."""
        model_info_url: str | None = None
        """The inference server's `/get_model_info` (SGLang's API): polled for the version it
        serves, so that each version's publish-to-swap time is known."""

    def __init__(
        self,
        config: Config,
        trackers: TrackerSet,
        figures: RunFigures,
        *,
        run_config: Mapping[str, Any] | None = None,
        service_pids: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        """`service_pids`: the run's services by name and process id now (memory per service)."""
        self.config = config
        self._service_pids = service_pids
        self.trackers = trackers
        self.figures = figures
        self._run_config = run_config
        self._rates = [ScrapeRates(e) for e in config.endpoints]
        self._queued: queue.SimpleQueue[tuple[int, dict[str, float]]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._drain = True
        self._outcome: Outcome = "finished"
        self._thread = threading.Thread(target=self._run, name="stacx-tracking", daemon=True)
        self._last_commit = time.monotonic()
        self._swaps: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        self._swap_watch = threading.Thread(target=self._watch_swaps, name="stacx-swaps", daemon=True)
        self._held: list[tuple[_Published, dict[tuple[str, int], int] | None]] = []
        """Weight versions read but not yet settled: each waits until the other topics are read up
        to where they stood when it was read (one consumer reads its topics in no set order)."""

    def start(self) -> TrackingFeed:
        self._thread.start()
        if self.config.model_info_url is not None:
            self._swap_watch.start()
        return self

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Figures from outside the topics (held-out evaluations); any thread."""
        self._queued.put((step, dict(metrics)))

    def finish(
        self, *, drain: bool = True, outcome: Outcome = "finished", timeout_s: float | None = None
    ) -> None:
        """Read the topics to their end (with `drain`), log what is left, finish the trackers with
        the run's `outcome`."""
        self._drain = drain
        self._outcome = outcome
        self._stop.set()
        limit = self.config.drain_timeout_s + 60.0 if timeout_s is None else timeout_s
        self._thread.join(timeout=limit)
        if self._swap_watch.is_alive():
            self._swap_watch.join(timeout=5.0)
        if self._thread.is_alive():
            log.error(
                "tracking: the feed did not finish within %.0fs; trackers may lack the last figures", limit
            )

    # ----------------------------------------------------------------------------- thread

    def _run(self) -> None:
        if self._run_config is not None:
            self.trackers.log_config(self._run_config)
        consumer = self._consumer()
        try:
            while consumer is not None and not self._stop.is_set():
                self._read(consumer, timeout=0.5)
                self._release_held(consumer)
                self._log_queued()
                self._note_swaps()
            if consumer is not None and self._drain:
                self._drain_topics(consumer)
            self._settle_held()
            self._emit(self.figures.flush())
            self._note_swaps()
            self._log_queued()
            summary = self.figures.summary(self.config.summary_min_episodes)
            if summary is not None:
                self.trackers.log_summary(summary.step, summary.metrics)
            if self.figures.num_revised:
                log.info(
                    "tracking: %d episode(s) arrived after their version's rollout figures were "
                    "first logged; those versions were logged again with them",
                    self.figures.num_revised,
                )
        except Exception as exc:  # a tracker must never stop the run: say so, finish what we have
            log.error("tracking: the feed stopped: %s: %s", type(exc).__name__, exc)
        finally:
            if consumer is not None:
                self._close(consumer)
            self.trackers.finish(self._outcome)

    def _consumer(self) -> Any:
        from stacx.consumers import EventConsumer

        try:
            return EventConsumer(
                EventConsumer.Config(
                    bootstrap_servers=self.config.bootstrap_servers,
                    group_id=self.config.group_id,
                    topics=list(self.config.topics),
                    client_id="stacx-tracking",
                    dlq_topic=None,  # an observer: the services dead-letter what they cannot use
                )
            )
        except Exception as exc:
            log.error("tracking: cannot consume %s: %s; trackers get no figures", self.config.topics, exc)
            return None

    def _read(self, consumer: Any, *, timeout: float) -> int:
        try:
            events = consumer.consume(max_records=256, timeout=timeout)
        except Exception as exc:  # a broker restart, say: the client reconnects
            log.warning("tracking: %s: %s; retrying", type(exc).__name__, exc)
            self._stop.wait(1.0)
            return 0
        for event in events:
            self._dispatch(event.value, event.timestamp_ms)
        if time.monotonic() - self._last_commit >= COMMIT_EVERY_S:
            self._commit(consumer)
        return len(events)

    def _dispatch(self, value: Any, timestamp_ms: int) -> None:
        if getattr(value, "model_name", self.config.model_name) != self.config.model_name:
            return
        if isinstance(value, Trajectory):
            self.figures.observe_trajectory(value, timestamp_ms)
        elif isinstance(value, TrainingBatch):
            self.figures.observe_batch(value, timestamp_ms)
        elif isinstance(value, WeightVersion):
            self.figures.note_published(value.version, timestamp_ms)
            self._held.append((_Published(value, timestamp_ms), None))

    def _release_held(self, consumer: Any) -> None:
        """Settle the held versions whose run topics have been read as far as they stood when the
        version was first looked at here (their ends then)."""
        while self._held:
            weights, marks = self._held[0]
            try:
                offsets = consumer.offsets(5.0)
            except Exception as exc:  # a broker restart, say: try again after the next read
                log.debug("tracking: offsets of %s: %s", self.config.group_id, exc)
                return
            if marks is None:
                marks = {tp: end for tp, (_, end) in offsets.items()}
                self._held[0] = (weights, marks)
            if any(offsets.get(tp, (0, 0))[0] < end for tp, end in marks.items()):
                return
            self._held.pop(0)
            self._settle(weights)

    def _settle_held(self) -> None:
        """At the end (the topics read to their end, or given up on): every held version."""
        while self._held:
            self._settle(self._held.pop(0)[0])

    def _settle(self, published: _Published) -> None:
        points = self.figures.observe_weights(published.weights, published.timestamp_ms)
        if points:
            self.trackers.log_metrics(published.weights.version, {**self._scrape(), **self._memory()})
        self._emit(points)

    def _emit(self, points: list[Point]) -> None:
        for point in points:
            self.trackers.log_metrics(point.step, point.metrics)
            if point.table is not None and point.table.rows:
                self.trackers.log_table(TABLE_NAME, point.step, point.table)

    def _log_queued(self) -> None:
        while True:
            try:
                step, metrics = self._queued.get_nowait()
            except queue.Empty:
                return
            self.trackers.log_metrics(step, metrics)

    def _watch_swaps(self) -> None:
        """Thread: which version the server serves, every `SWAP_POLL_S` (the feed's own thread may
        be busy with a tracker for seconds); each first sighting goes to the feed's thread."""
        import httpx

        url = self.config.model_info_url
        assert url is not None
        seen: set[int] = set()
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.wait(SWAP_POLL_S):
                try:
                    served = str(client.get(url).json().get("weight_version", ""))
                except (httpx.HTTPError, ValueError, AttributeError) as exc:  # a restarting server
                    log.debug("tracking: %s: %s", url, exc)
                    continue
                if served.isdigit() and int(served) not in seen:
                    seen.add(int(served))
                    self._swaps.put((int(served), int(time.time() * 1000)))

    def _note_swaps(self) -> None:
        while True:
            try:
                version, seen_ms = self._swaps.get_nowait()
            except queue.Empty:
                break
            self.figures.note_swap(version, seen_ms)
        self._emit(self.figures.swap_points())

    def _memory(self) -> dict[str, float]:
        if self._service_pids is None:
            return {}
        try:
            return service_memory(self._service_pids())
        except Exception as exc:  # an observer's figure: never stop the feed for it
            log.debug("tracking: memory of the services: %s", exc)
            return {}

    def _scrape(self) -> dict[str, float]:
        import httpx

        figures: dict[str, float] = {}
        for rates in self._rates:
            endpoint = rates.endpoint
            try:
                answer = httpx.get(endpoint.url, headers=dict(endpoint.headers), timeout=2.0)
                answer.raise_for_status()
            except httpx.HTTPError as exc:  # a restarting server: its figures skip this version
                log.debug("tracking: scraping %s: %s", endpoint.url, exc)
                continue
            figures |= rates.figures(answer.text, time.monotonic())
        return figures

    def _drain_topics(self, consumer: Any) -> None:
        deadline = time.monotonic() + self.config.drain_timeout_s
        while time.monotonic() < deadline:
            if self._read(consumer, timeout=0.5) == 0 and consumer.assignment():
                try:
                    if consumer.total_lag(timeout=5.0) == 0:
                        return
                except Exception as exc:
                    log.warning("tracking: lag of %s: %s", self.config.group_id, exc)
        log.warning(
            "tracking: the run's topics were not read to their end within %.0fs; the last "
            "figures may be missing",
            self.config.drain_timeout_s,
        )

    def _commit(self, consumer: Any) -> None:
        self._last_commit = time.monotonic()
        try:
            consumer.commit()
        except Exception as exc:  # progress of an observer only
            log.debug("tracking: commit: %s", exc)

    def _close(self, consumer: Any) -> None:
        self._commit(consumer)
        try:
            consumer.close()
        except Exception as exc:
            log.warning("tracking: closing the consumer: %s", exc)
