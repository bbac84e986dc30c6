"""`stacx infra smoke`: prove the local services work end to end, in seconds."""

from __future__ import annotations

import subprocess
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from stacx.infra.services.errors import InfraError
from stacx.infra.services.sandbox_image import IMAGE


def kafka_round_trip(bootstrap: str) -> str:
    """Publish one record to a fresh topic and read it back."""
    topic = f"stacx.smoke.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    try:
        payload = f"hello from stacx {uuid.uuid4()}".encode()
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
        producer.produce(topic, payload, key=b"smoke")
        if producer.flush(30) != 0:
            raise InfraError(f"the smoke record was not delivered to {topic} at {bootstrap}")
        received = _read_one(bootstrap, topic)
        if received != payload:
            raise InfraError(f"read back {received!r} from {topic}, expected {payload!r}")
    finally:
        _delete(admin, topic)
    return f"Kafka: published and read back one record through {bootstrap}"


def _delete(admin: AdminClient, topic: str, timeout_s: float = 30.0) -> None:
    """Delete the smoke topic and wait for it: a request left pending when the process exits is
    never sent, and every `stacx infra up` would leave one topic behind."""
    for future in admin.delete_topics([topic], operation_timeout=timeout_s).values():
        try:
            future.result(timeout_s)
        except KafkaException as exc:  # the round trip's own result matters more
            print(f"could not delete the smoke topic {topic}: {exc}")


def _read_one(bootstrap: str, topic: str, timeout_s: float = 30.0) -> bytes | None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"smoke-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                return message.value()
    finally:
        consumer.close()
    return None


def sandbox_command() -> str:
    """Run `python3 -c` in a throw-away sandbox container without network."""
    cmd = [
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        "--user",
        "1000:1000",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--read-only",
        IMAGE,
        "python3",
        "-c",
        "import platform; print('sandbox python', platform.python_version())",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise InfraError(f"the sandbox container failed ({' '.join(cmd)}): {proc.stderr.strip()}")
    return f"Docker: {proc.stdout.strip()} (in {IMAGE}, --network none)"
