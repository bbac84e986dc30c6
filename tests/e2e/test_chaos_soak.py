"""The chaos soak, short, on the shipped defaults (failure policy, staleness filter and restart
budget as shipped; the 10-minute soak of `bench/chaos.py` is in bench/RESULTS.md):
`bench/chaos.py --quick` kills services (whole process groups, the
trainer's launcher alone, one trainer rank alone) and restarts the broker while the pipeline
trains, then audits the topics, the assembler's state, the trainer's lineage and dead letters and
the versions the server loaded.

The soak runs on a broker of its own (the jars `stacx infra up` installed, its own STACX_HOME,
ports and data): a user's run on the local broker, started first, keeps its topics, its group
and its broker. Needs Kafka, Docker and the sandbox image. Checks that nothing is lost or trained
twice and that nothing is left behind; the learning under fire is measured by the full benchmark
(docs/performance.md), not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from process_checks import alive, run_processes, run_to_the_end
from run_names import run_name

from stacx.infra.pipeline.layout import RunTopics
from stacx.infra.services import kafka, topic_admin
from stacx.infra.services.topics import ensure_topics

REPO = Path(__file__).resolve().parents[2]


def _chaos(name: str, *flags: str) -> list[str]:
    """`bench/chaos.py --quick` for run `name`: tiny SFT, tasks and batches."""
    return [sys.executable, str(REPO / "bench" / "chaos.py"), "--quick", "--name", name, *flags]


@pytest.fixture
def users_run(kafka_bootstrap: str) -> Iterator[tuple[str, RunTopics, Consumer]]:
    """A run a user has going on the local broker: its topics, a record, and its trainer's group
    with a committed offset and a live member."""
    run_id = f"users-own-{uuid.uuid4().hex[:6]}"
    run = RunTopics.for_run(run_id, fresh=True)
    ensure_topics(kafka_bootstrap, run.specs())
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(run.batches, key=b"b0", value=b"a batch")
    assert producer.flush(30) == 0
    member = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"stacx-trainer-{run_id}",
                       "auto.offset.reset": "earliest", "session.timeout.ms": 45000,
                       # the member sits idle through the soak (minutes between polls), as a
                       # trainer does inside a long step: it stays in its group on heartbeats
                       "max.poll.interval.ms": 3_600_000})
    member.subscribe([run.batches])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = member.poll(0.5)
        if msg is not None and not msg.error():
            member.commit(message=msg, asynchronous=False)
            break
    yield run_id, run, member
    member.close()
    topic_admin.delete_run(kafka_bootstrap, run_id)


def _untouched(bootstrap: str, run_id: str, run: RunTopics, member: Consumer) -> None:
    member.poll(0.1)  # a live member: still in its group
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert {t.name for t in run.specs()} <= set(admin.list_topics(timeout=30).topics)
    group = f"stacx-trainer-{run_id}"
    (described,) = admin.describe_consumer_groups([group]).values()
    assert len(described.result(timeout=60).members) == 1
    (committed,) = member.committed(member.assignment(), timeout=30)
    assert committed.offset == 1


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_short_soak_under_kills_loses_nothing_and_leaves_nothing(
        kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path,
        users_run: tuple[str, RunTopics, Consumer]) -> None:
    shared_broker = kafka.running_pid()
    assert shared_broker is not None and alive(shared_broker), "the local broker of `stacx infra up`"
    name = run_name("chaos")
    out = run_to_the_end(_chaos(name, "--json", "--minutes", "4", "--interval-s", "20",
                                 "--seed", "1"), cwd=tmp_path, timeout_s=1400, what="the soak")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    shown = json.dumps(result, indent=1)  # the whole audit when an assertion fails
    assert result["pipeline_error"] is None, shown
    assert result["broker"] == "private" and result["broker_restarts"] >= 1, shown
    assert result["kills"] >= 3 and result["kills_by_victim"].get("trainer-rank", 0) >= 1, shown
    assert result["policy_versions"] >= 2 and result["trained_batches"] >= 2, shown
    for key in ("lost", "trained_twice", "trainer_dead_letters", "version_regressions",
                "served_regressions", "served_unannounced", "served_behind", "orphans",
                "leaked_containers"):
        assert result[key] == 0, (key, shown)
    assert result["server_loads"] >= 1, shown
    # the user's broker was never restarted, and their run kept its topics, group and member
    assert kafka.running_pid() == shared_broker and alive(shared_broker)
    _untouched(kafka_bootstrap, *users_run)
    shared = set(AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=30).topics)
    assert not [t for t in shared if result["run_id"] in t], "the soak's topics are on its own broker"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_mid_soak_stops_every_service_and_sandbox(
        kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path) -> None:
    name = run_name("chaos-term")
    proc = subprocess.Popen(_chaos(name, "--no-broker", "--minutes", "5", "--interval-s", "5", "--seed", "2"),
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # until the first strike: the services run and episodes are in flight
        lines.append(line)
        if "chaos: " in line and " at policy version " in line:
            break
    assert proc.poll() is None, "".join(lines[-30:])
    assert run_processes(f"{name}-"), "the run's services should be running"
    proc.terminate()
    _, rest = proc.communicate(timeout=300)
    stderr = "".join(lines) + rest
    assert proc.returncode == 128 + 15, stderr[-3000:]
    assert stderr.count("stopped by SIGTERM") == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[stderr.index("Traceback") - 1000:][:4000]
    assert run_processes(f"{name}-") == []
    owners = [c.labels.get("stacx.sandbox.owner", "")
              for c in docker_client.containers.list(all=True, filters={"label": "stacx.sandbox.owner"})]
    assert not [o for o in owners if o.startswith(f"stacx-{name}-")]
