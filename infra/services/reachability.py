"""Whether Kafka answers, asked once before a command starts, without librdkafka's log lines.

A client that cannot reach its brokers logs a `FAIL` line per connection attempt on stderr
(hundreds before a command's own timeout). The check's client sends them to a logger that
keeps them, and the command prints one line instead.
"""

from __future__ import annotations

import logging

__all__ = ["kafka_problem"]

_QUIET = logging.getLogger("stacx.kafka.preflight")
_QUIET.setLevel(logging.CRITICAL)  # librdkafka's FAIL/ERROR lines of the check: not shown
_QUIET.propagate = False


def kafka_problem(bootstrap_servers: str, *, timeout_s: float = 10.0, min_brokers: int = 1) -> str | None:
    """None when a broker at `bootstrap_servers` answers a metadata request within
    `timeout_s` and the cluster lists at least `min_brokers`; otherwise one line saying so and how
    to fix it."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0}, logger=_QUIET)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        return (
            f"Kafka at {bootstrap_servers} did not answer within {timeout_s:.0f}s "
            f"({exc.args[0].str()}); start it (`stacx infra up`) or set bootstrap_servers"
        )
    if not metadata.brokers:
        return f"Kafka at {bootstrap_servers} lists no brokers; check bootstrap_servers"
    if len(metadata.brokers) < min_brokers:
        return (f"Kafka at {bootstrap_servers} lists {len(metadata.brokers)} of its {min_brokers} "
                "brokers; start the others")
    return None
