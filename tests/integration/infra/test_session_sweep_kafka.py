"""The test session's sweep (tests/conftest.py) deletes the runs the session made and nothing
else: a pytest session runs alone (its own STACX_HOME) while a user's run appears on the same
broker; when it ends, its own run is gone and the user's topics and group are untouched."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from stacx.infra.pipeline.layout import RunTopics
from stacx.infra.services import topic_admin
from stacx.infra.services.topics import ensure_topics

TESTS = Path(__file__).resolve().parents[2]

INNER = '''
import time
from pathlib import Path

from run_names import run_name

from stacx.infra.pipeline.layout import RunTopics
from stacx.infra.services.topics import ensure_topics


def test_makes_a_run_and_waits() -> None:
    run_id = run_name("inner")
    ensure_topics("{bootstrap}", RunTopics.for_run(run_id, fresh=True).specs())
    Path("{made}").write_text(run_id)
    deadline = time.monotonic() + 180
    while not Path("{go}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
'''


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=30)
        time.sleep(0.2)


def _users_run(bootstrap: str) -> tuple[str, RunTopics, str]:
    """A run a user started by hand: its topics, and its trainer's group with a committed offset."""
    run_id = f"users-own-{uuid.uuid4().hex[:6]}"
    run = RunTopics.for_run(run_id, fresh=True)
    ensure_topics(bootstrap, run.specs())
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(run.batches, key=b"b0", value=b"a batch")
    assert producer.flush(30) == 0
    group = f"stacx-trainer-{run_id}"
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    reader.subscribe([run.batches])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = reader.poll(0.5)
        if msg is not None and not msg.error():
            reader.commit(message=msg, asynchronous=False)
            break
    reader.close()
    return run_id, run, group


def test_the_session_sweep_deletes_its_own_runs_only(kafka_bootstrap: str, tmp_path: Path) -> None:
    made, go = tmp_path / "made", tmp_path / "go"
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(INNER.format(bootstrap=kafka_bootstrap, made=made, go=go))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "STACX_HOME": str(tmp_path / "home"), "STACX_KAFKA": kafka_bootstrap}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", str(test_file)]
    inner = subprocess.Popen(argv, cwd=tmp_path, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    users_run = None
    try:
        _wait_for(made, inner)
        users_run = _users_run(kafka_bootstrap)  # appears while the session runs
        go.touch()
        out, _ = inner.communicate(timeout=300)
        assert inner.returncode == 0, out
        topics = set(admin.list_topics(timeout=30).topics)
        run_id, run, group = users_run
        assert {t.name for t in run.specs()} <= topics, out
        groups = {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result(timeout=60).valid}
        assert group in groups, out
        inner_run = made.read_text()
        assert not {t.name for t in RunTopics.for_run(inner_run, fresh=True).specs()} & topics, out
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait(30)
        if users_run is not None:
            topic_admin.delete_run(kafka_bootstrap, users_run[0])
