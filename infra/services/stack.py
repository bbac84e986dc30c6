"""All local services together: what `stacx infra up | down | status` does."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from stacx.infra.services import docker_engine, jaeger, kafka, sandbox_image, tools
from stacx.infra.services.errors import InfraError
from stacx.infra.services.topics import ensure_topics
from stacx.schemas.topics import BOOTSTRAP_ENV, TopicPolicy


@dataclass(kw_only=True, slots=True)
class StackConfig:
    """Which local services `stacx infra up` manages."""

    kafka: kafka.KafkaConfig = field(default_factory=kafka.KafkaConfig)
    """The local broker (ignored when `bootstrap_servers` points at an existing cluster)."""
    bootstrap_servers: str | None = field(default_factory=lambda: os.environ.get(BOOTSTRAP_ENV))
    """An existing Kafka cluster to use instead of the local broker (env STACX_KAFKA)."""
    docker: bool = True
    """Start (or check) the Docker engine and build the sandbox base image."""
    topics: TopicPolicy = field(default_factory=TopicPolicy)
    """Replication, partitions, retention and compression of the standard topics."""
    jaeger: jaeger.JaegerConfig = field(default_factory=jaeger.JaegerConfig)
    """The local trace backend (OTLP in, query API out, all on 127.0.0.1)."""
    tracing_backend: bool = field(
        default_factory=lambda: os.environ.get("STACX_TRACE_BACKEND", "1").lower() not in {"0", "false", "no"}
    )
    """Build (once) and start Jaeger; it is cheap when idle, and the tracing tests need it
    (env STACX_TRACE_BACKEND=0 to leave it out)."""
    browser: bool = field(
        default_factory=lambda: os.environ.get("STACX_BROWSER_TOOLS", "1").lower() not in {"0", "false", "no"}
    )
    """Install Chromium and its WebDriver, which the browser tests of `stacx view` drive
    (env STACX_BROWSER_TOOLS=0 to leave them out)."""

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_servers or self.kafka.bootstrap


DOCKER_TOOLS = ("docker", "dockerd", "debootstrap")
TRACING_TOOLS = ("go",)
BROWSER_TOOLS = ("chromium", "chromedriver")


def up(config: StackConfig, say: Callable[[str], None] = print) -> None:
    needed = [
        name
        for name in tools.TOOLS
        if (config.docker or name not in DOCKER_TOOLS)
        and (config.tracing_backend or name not in TRACING_TOOLS)
        and (config.browser or name not in BROWSER_TOOLS)
    ]
    tools.ensure(needed, say=say)
    if config.bootstrap_servers:
        if not kafka.broker_answers(config.bootstrap_servers):
            raise InfraError(
                f"no Kafka broker answers at {config.bootstrap_servers} "
                f"(from {BOOTSTRAP_ENV} / bootstrap_servers); check the address"
            )
        say(f"Kafka: using the existing cluster at {config.bootstrap_servers} (local broker skipped)")
    else:
        say(kafka.up(config.kafka))
    for line in ensure_topics(config.bootstrap, policy=config.topics):
        say(line)
    if config.docker:
        say(docker_engine.up())
        say(sandbox_image.up())
    if config.tracing_backend:
        say(jaeger.up(config.jaeger))


def down(say: Callable[[str], None] = print) -> None:
    say(kafka.down())
    say(jaeger.down())
    say(docker_engine.down())


def status(config: StackConfig) -> list[tuple[bool, str]]:
    """(healthy, line) for each service."""
    if config.bootstrap_servers:
        answers = kafka.broker_answers(config.bootstrap_servers)
        state = "answering" if answers else "NOT answering"
        kafka_line = (answers, f"Kafka: external cluster {config.bootstrap_servers}, {state}")
    else:
        kafka_line = (
            kafka.running_pid() is not None and kafka.broker_answers(config.bootstrap),
            kafka.status(config.kafka),
        )
    engine = docker_engine.status()
    if not engine[0]:
        image = (False, f"sandbox image {sandbox_image.IMAGE}: unknown (the Docker engine does not answer)")
    else:
        image = (sandbox_image.image_exists(), sandbox_image.status())
    lines = [kafka_line, engine, image]
    if config.tracing_backend:
        lines.append(jaeger.status(config.jaeger))
    return lines
