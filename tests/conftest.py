"""Shared fixtures: the real local services started by `stacx infra up` (make test does it).

Integration tests fail loudly, never skip, when a service that `make test` should have started
is missing: the message says how to start it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from process_checks import run_processes
from run_names import SESSION_PREFIX

from stacx.schemas import topics

SANDBOX_IMAGE = "stacx/sandbox:bookworm"
START_HINT = "start the local services with `.venv/bin/stacx infra up` (`make test` does this)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if "integration" in path.parts or "e2e" in path.parts:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """bootstrap.servers of a live broker (STACX_KAFKA or the local default)."""
    from confluent_kafka.admin import AdminClient

    bootstrap = topics.default_bootstrap()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.list_topics(timeout=10)
    except Exception as exc:  # KafkaException: broker down
        pytest.fail(f"no Kafka broker answers at {bootstrap} ({exc}); {START_HINT}", pytrace=False)
    return bootstrap


@pytest.fixture
def fresh_topic(kafka_bootstrap: str) -> Iterator[Callable[..., str]]:
    """Factory: `fresh_topic("trajectories", partitions=4, config={...})` -> a new unique topic."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    created: list[str] = []

    def make(stem: str = "test", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"test.{stem}.{uuid.uuid4().hex[:10]}"
        future = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
        )[name]
        future.result(timeout=30)
        created.append(name)
        return name

    yield make
    if created:
        for future in admin.delete_topics(created).values():
            try:
                future.result(timeout=30)
            except Exception:
                pass


def _run_ids(bootstrap: str) -> set[str] | None:
    """The runs with topics on the broker (`stacx.<kind>.<run>`); None when it does not answer."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from stacx.infra.services.topic_admin import run_of

    try:
        names = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=5).topics
    except KafkaException:
        return None
    return {run for name in names if (run := run_of(name)) is not None}


@pytest.fixture(scope="session", autouse=True)
def _runs_started_by_the_tests_are_deleted() -> Iterator[None]:
    """Pipelines the tests start (quickstart, own tasks, SIGTERM, replay...) are named with
    `run_names.run_name`, under this session's prefix. Left on the broker they pile up
    (thousands of topics after a few dozen sessions, and every Faust worker then decodes their
    metadata), so after the session the runs under that prefix are deleted like `stacx topics gc
    --run` does. Nothing else is touched: a user's runs, and another session's, keep their
    topics and groups. Housekeeping only: without a broker it does nothing."""
    yield
    sweep_session_runs(topics.default_bootstrap(), SESSION_PREFIX)


def sweep_session_runs(bootstrap: str, prefix: str) -> None:
    """Delete the runs whose id starts with `prefix` (a session's own). A run whose group still
    has members is retried while no process of that run is alive and for at most
    STALE_MEMBER_WAIT_S (a member killed with -9 stays until its session times out)."""
    from stacx.infra.services.errors import InfraError
    from stacx.infra.services.topic_admin import delete_run

    found = _run_ids(bootstrap)
    waiting = sorted(run for run in found or () if run.startswith(prefix))
    deadline = time.monotonic() + STALE_MEMBER_WAIT_S
    while waiting:
        left = []
        for run in waiting:
            try:
                delete_run(bootstrap, run)
            except InfraError as exc:  # still running, or the broker went away
                left.append((run, exc))
        waiting = [run for run, _ in left if not run_processes(run) and time.monotonic() < deadline]
        for run, exc in left:
            if run not in waiting:
                print(f"left run {run} on the broker: {exc}")
        if waiting:
            time.sleep(5.0)


STALE_MEMBER_WAIT_S = 60.0
"""Longest wait for the consumer-group members of killed processes to time out (45 s at most)."""


@pytest.fixture
def fresh_group() -> str:
    """A consumer group id no other test uses."""
    return f"test-group-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def docker_client():  # type: ignore[no-untyped-def]
    """Docker SDK client of a live engine."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.fail(f"no Docker engine answers ({exc}); {START_HINT}", pytrace=False)
    return client


@pytest.fixture(scope="session")
def sandbox_image(docker_client) -> str:  # type: ignore[no-untyped-def]
    """Name of the sandbox base image built by `stacx infra up`."""
    import docker.errors

    try:
        docker_client.images.get(SANDBOX_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"sandbox image {SANDBOX_IMAGE} is missing; {START_HINT}", pytrace=False)
    return SANDBOX_IMAGE


@pytest.fixture
def app_ids(kafka_bootstrap: str) -> Iterator[list[str]]:
    """Faust app ids a test uses; their internal topics (ticks, groups, changelogs) are deleted
    after, like every topic whose name starts with one of them (a test may add any such prefix)."""
    from confluent_kafka.admin import AdminClient

    ids: list[str] = []
    yield ids
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    doomed = [t for t in admin.list_topics(timeout=10).topics if t.startswith(tuple(ids))]
    for future in admin.delete_topics(doomed).values() if doomed else []:
        with contextlib.suppress(Exception):  # housekeeping only: a topic already gone is fine
            future.result(timeout=30)
