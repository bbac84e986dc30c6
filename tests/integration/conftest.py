"""Fixtures of the integration tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient


@pytest.fixture
def app_ids(kafka_bootstrap: str) -> Iterator[list[str]]:
    """Faust app ids a test uses; their internal topics (ticks, groups, changelogs) are deleted
    after, like every topic whose name starts with one of them (a test may add any such prefix)."""
    ids: list[str] = []
    yield ids
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    doomed = [t for t in admin.list_topics(timeout=10).topics if t.startswith(tuple(ids))]
    for future in admin.delete_topics(doomed).values() if doomed else []:
        with contextlib.suppress(Exception):  # housekeeping only: a topic already gone is fine
            future.result(timeout=30)
