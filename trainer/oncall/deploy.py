"""Deployed versions: the history file and the weights topic the serving fleet follows.

`versions.jsonl` (in the learner's state directory) records every decision: the baseline, each
candidate promoted or rejected with both evaluation reports, and rollbacks. The weights topic is
compacted (the latest version per model is what servers load), so the history lives in the file.
A deployed version number is allocated as one more than any number seen in the file or on the
topic, so a number never carries two contents; a rollback deploys the old weights under a new
number, and servers (which only move forward) take it like any update.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stacx.schemas import topics
from stacx.schemas.records import WeightVersion, now_ms
from stacx.trainer.errors import ConfigError, TrainerError

log = logging.getLogger(__name__)

__all__ = ["Deployments", "KafkaWeightLog", "VersionHistory", "WeightLog"]


class WeightLog(Protocol):
    """Where deployed versions are announced (the weights topic; a list in tests)."""

    def latest(self, model_name: str) -> WeightVersion | None: ...

    def publish(self, version: WeightVersion) -> None: ...

    def close(self) -> None: ...


class KafkaWeightLog:
    """The compacted weights topic: `latest` reads it to its end, `publish` waits for the ack."""

    def __init__(self, bootstrap_servers: str, topic: str = topics.WEIGHTS) -> None:
        from stacx.producers import EventProducer

        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.producer = EventProducer(
            EventProducer.Config(bootstrap_servers=bootstrap_servers, client_id="stacx-oncall")
        )

    def latest(self, model_name: str, timeout_s: float = 120.0) -> WeightVersion | None:
        from stacx.consumers import EventConsumer

        consumer = EventConsumer(
            EventConsumer.Config(
                bootstrap_servers=self.bootstrap_servers,
                topics=[self.topic],
                group_id=f"stacx-oncall-versions-{uuid.uuid4().hex[:8]}",
                client_id="stacx-oncall",
            )
        )
        found: WeightVersion | None = None
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                event = consumer.poll(0.5)
                if event is not None:
                    if isinstance(event.value, WeightVersion) and event.value.model_name == model_name:
                        found = event.value
                    continue
                if consumer.assignment() and self._caught_up(consumer):
                    return found
        finally:
            consumer.close()
        raise TrainerError(
            f"{self.topic} was not read to its end within {timeout_s:.0f} s "
            f"(Kafka at {self.bootstrap_servers} unavailable?)"
        )

    @staticmethod
    def _caught_up(consumer: Any) -> bool:
        try:
            return bool(consumer.total_lag() == 0)
        except Exception as exc:  # KafkaException while a broker restarts: ask again
            log.warning("weights topic lag unknown (%s); retrying", exc)
            return False

    def publish(self, version: WeightVersion) -> None:
        self.producer.publish(self.topic, version, key=version.model_name).result(timeout=180)

    def close(self) -> None:
        self.producer.close()


class VersionHistory:
    """Append-only JSON lines, one per decision (`kind`: baseline, promoted, rejected, rollback)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def append(self, entry: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"at_ms": now_ms(), **entry}) + "\n")
            f.flush()
            os.fsync(f.fileno())


@dataclass(slots=True)
class Deployments:
    """Promotion and rollback over a `VersionHistory` and a `WeightLog`."""

    history: VersionHistory
    log: WeightLog
    model_name: str

    def next_version(self) -> int:
        current = self.log.latest(self.model_name)
        seen = [int(e["deployed_version"]) for e in self.history.entries() if "deployed_version" in e]
        return max([current.version if current else 0, *seen]) + 1

    def deploy(self, path: str, *, step: int, metadata: dict[str, str]) -> WeightVersion:
        version = WeightVersion(
            model_name=self.model_name,
            version=self.next_version(),
            path=path,
            step=step,
            trainer_id="stacx-oncall",
            metadata=metadata,
        )
        self.log.publish(version)
        return version

    def rollback(self, to_version: int) -> WeightVersion:
        """Deploy the weights of deployed version `to_version` again, under a new number."""
        entries = [e for e in self.history.entries() if e.get("deployed_version") == to_version]
        if not entries:
            known = sorted({e["deployed_version"] for e in self.history.entries() if "deployed_version" in e})
            raise ConfigError(
                f"rollback: version {to_version} was never deployed here; deployed versions: {known}"
            )
        target = entries[0]
        version = self.deploy(
            target["path"], step=int(target.get("step", 0)), metadata={"rollback_to": str(to_version)}
        )
        self.history.append(
            {
                "kind": "rollback",
                "deployed_version": version.version,
                "rollback_to": to_version,
                "path": target["path"],
                "step": target.get("step", 0),
                "report": target.get("report"),
            }
        )
        return version
