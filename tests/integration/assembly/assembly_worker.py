"""Run `stacx assemble` in a subprocess for integration tests and benchmarks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from stacx.schemas.codec import decode

REPO_ROOT = Path(__file__).resolve().parents[3]
STOPPED_BY_SIGTERM = 128 + signal.SIGTERM
"""Exit status of a worker that `stop()` stopped (SIGTERM), as of every `stacx` command."""
COMPACTED = {"cleanup.policy": "compact"}


def one_group_config(
    fresh_topic: Callable[..., str], bootstrap: str, workdir: Path, prefix: str, *, partitions: int = 1
) -> dict[str, Any]:
    """An assembler config on fresh topics named after `prefix`: groups of 2 trajectories, one
    group per batch, 60 s group timeout, ticks every 0.5 s."""
    return {
        "app_id": f"test-{prefix}-{uuid.uuid4().hex[:10]}",
        "bootstrap_servers": bootstrap,
        "datadir": str(workdir / "data"),
        "tick_interval_s": 0.5,
        "grouping": {"group_size": 2, "group_timeout_s": 60.0},
        "mixture": {"batch_size": 1, "batch_unit": "groups"},
        "trajectories_topic": fresh_topic(f"{prefix}-traj", partitions=partitions),
        "batches_topic": fresh_topic(f"{prefix}-batches", config={"max.message.bytes": "8388608"}),
        "weights_topic": fresh_topic(f"{prefix}-weights"),
        "dlq_topic": fresh_topic(f"{prefix}-dlq"),
        "schemas_topic": fresh_topic(f"{prefix}-schemas", config=COMPACTED),
    }


class AssemblerProcess:
    """`stacx assemble --config FILE` as a child process; its log lines are collected."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / f"assembler-{config['app_id']}.yaml"
        self.config_path.write_text(yaml.safe_dump({"assembler": config}))
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stacx.infra.cli", "assemble", "--config", str(self.config_path)],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip())
                self._changed.notify_all()

    def wait_for_line(self, text: str, timeout_s: float = 120.0) -> str:
        """The first log line containing `text`; fails with the log tail on timeout or exit."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = "\n".join(self.lines[-40:])
                    raise AssertionError(f"assembler never logged {text!r}; log tail:\n{tail}")
                self._changed.wait(timeout=0.5)

    def stop(self, timeout_s: float = 60.0) -> tuple[int, dict[str, int]]:
        """SIGTERM, wait for a clean exit; returns (exit status, final stats). A clean stop
        says so in its last line."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("assembler did not stop within the timeout") from None
        self._print_log()
        if code == STOPPED_BY_SIGTERM:
            assert self.lines[-1] == "stacx assemble: stopped by SIGTERM", self.lines[-5:]
        stats_line = self.wait_for_line("assembler final stats", timeout_s=1)
        return code, json.loads(stats_line.split("assembler final stats", 1)[1].strip())

    def __enter__(self) -> AssemblerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self._print_log()  # the test failed while the worker ran: its log explains why

    def _print_log(self) -> None:
        self._reader.join(timeout=10)
        print(f"--- log of {self.config_path.name} (pytest shows it when the test fails) ---")
        print("\n".join(self.lines))


def consume_records(bootstrap: str, topic: str, count: int, timeout_s: float = 120.0,
                    idle_s: float = 0.0) -> list[tuple[bytes | None, Any, int]]:
    """Read `count` records (key, decoded value, timestamp ms) from the start of `topic`.

    With `idle_s` > 0, keeps reading that long after the count is reached, so extra records show.
    """
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    records: list[tuple[bytes | None, Any, int]] = []
    deadline = time.monotonic() + timeout_s
    idle_until: float | None = None
    try:
        while time.monotonic() < deadline:
            if len(records) >= count:
                idle_until = idle_until or time.monotonic() + idle_s
                if time.monotonic() >= idle_until:
                    break
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            records.append((msg.key(), decode(msg.value()), msg.timestamp()[1]))
    finally:
        consumer.close()
    if len(records) < count:
        raise AssertionError(f"{topic}: {len(records)} of {count} records within {timeout_s} s")
    return records
