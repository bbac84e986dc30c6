"""Kafka's own command-line tools, run from the broker's jars (no shell scripts needed).

Operators and tests use them to check STACX from the outside: `ConsumerGroupCommand` (what
`kafka-consumer-groups.sh` runs) lists groups and their lag, `TransactionsCommand
describe-producers` shows the producer ids that idempotent producers wrote with."""

from __future__ import annotations

import subprocess
from pathlib import Path

from stacx.infra.services import kafka
from stacx.infra.services.errors import InfraError

__all__ = ["consumer_groups", "describe_groups", "describe_producers", "run_tool"]

CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"
LOG_DIRS = "org.apache.kafka.tools.LogDirsCommand"
DUMP_LOG = "org.apache.kafka.tools.DumpLogSegments"


def run_tool(main_class: str, *args: str, jars: Path | None = None, timeout_s: float = 120.0) -> str:
    """stdout of `java -cp <jars>/* main_class args...`; raises `InfraError` on failure."""
    libs = jars or kafka.jar_dir()
    if not any(libs.glob("kafka-tools-*.jar")):
        raise InfraError(f"no kafka-tools jar in {libs}: run `stacx infra up` (it resolves the Kafka jars)")
    cmd = [kafka.java_binary(), "-Xmx256m", f"-Dlog4j2.configurationFile={kafka.LOG4J}", "-cp", f"{libs}/*"]
    proc = subprocess.run([*cmd, main_class, *args], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise InfraError(f"{main_class} {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def consumer_groups(bootstrap: str, *, jars: Path | None = None) -> list[str]:
    """Group ids `kafka-consumer-groups.sh --list` shows."""
    out = run_tool(CONSUMER_GROUPS, "--bootstrap-server", bootstrap, "--list", jars=jars)
    return [line.strip() for line in out.splitlines() if line.strip()]


def describe_groups(bootstrap: str, groups: list[str], *, jars: Path | None = None) -> list[dict[str, str]]:
    """Rows of `kafka-consumer-groups.sh --describe --offsets` (GROUP, TOPIC, PARTITION,
    CURRENT-OFFSET, LOG-END-OFFSET, LAG, ...), one dict per partition."""
    args = ["--bootstrap-server", bootstrap, "--describe", "--offsets"]
    for group in groups:
        args += ["--group", group]
    return _table(run_tool(CONSUMER_GROUPS, *args, jars=jars))


def describe_producers(
    bootstrap: str, topic: str, partition: int = 0, *, jars: Path | None = None
) -> list[dict[str, str]]:
    """Rows of `kafka-transactions.sh describe-producers` (ProducerId, ProducerEpoch,
    LastSequence, ...): the idempotent producers that wrote to `topic`/`partition`."""
    args = [
        "--bootstrap-server",
        bootstrap,
        "describe-producers",
        "--topic",
        topic,
        "--partition",
        str(partition),
    ]
    return _table(run_tool(TRANSACTIONS, *args, jars=jars))


def _table(text: str) -> list[dict[str, str]]:
    """Whitespace-separated tables with a header line (repeated headers are skipped)."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            header = None
            continue
        if header is None or cells == header:
            header = cells
            continue
        rows.append(dict(zip(header, cells, strict=False)))
    return rows
