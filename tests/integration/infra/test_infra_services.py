"""The real local services started by `stacx infra up`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from confluent_kafka.admin import AdminClient

from stacx.infra.services import kafka, smoke
from stacx.schemas import topics

STACX = str(Path(sys.executable).with_name("stacx"))


def _smoke_topics(bootstrap: str) -> set[str]:
    names = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    return {n for n in names if n.startswith("stacx.smoke.")}


def test_produce_consume_round_trip(kafka_bootstrap: str) -> None:
    assert "read back one record" in smoke.kafka_round_trip(kafka_bootstrap)


def test_the_smoke_command_leaves_no_topic_behind(kafka_bootstrap: str, sandbox_image: str) -> None:
    """`stacx infra smoke` (and `infra up`, which runs it) deletes its topic before it exits."""
    before = _smoke_topics(kafka_bootstrap)
    proc = subprocess.run([STACX, "infra", "smoke"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "read back one record" in proc.stdout
    assert _smoke_topics(kafka_bootstrap) == before


def test_infra_up_again_is_a_no_op(kafka_bootstrap: str, sandbox_image: str) -> None:
    pid_before = kafka.running_pid()
    proc = subprocess.run([STACX, "infra", "up"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if pid_before is not None:  # our local broker (not an external cluster)
        assert "Kafka already running" in proc.stdout
        assert kafka.running_pid() == pid_before
    assert "created" not in proc.stdout  # every topic already existed
    assert "Docker engine already running" in proc.stdout
    assert f"sandbox image {sandbox_image}: present" in proc.stdout


def test_all_topics_exist_with_their_configs(kafka_bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    present = admin.list_topics(timeout=10).topics
    assert {spec.name for spec in topics.TOPICS} <= set(present)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topics.WEIGHTS)
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["cleanup.policy"].value == "compact"


def test_status_reports_live_services(kafka_bootstrap: str, sandbox_image: str) -> None:
    proc = subprocess.run([STACX, "infra", "status"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
    assert "Docker engine" in proc.stdout and "running" in proc.stdout
    assert "present" in proc.stdout


def _run_in_sandbox(image: str, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--user", "1000:1000", image, "python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sandbox_image_runs_python(sandbox_image: str) -> None:
    proc = _run_in_sandbox(sandbox_image, "print(6 * 7)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "42"


def test_sandbox_has_no_network(sandbox_image: str) -> None:
    code = (
        "import os, socket\n"
        "print(sorted(os.listdir('/sys/class/net')))\n"
        "s = socket.socket(); s.settimeout(3)\n"
        "try:\n"
        "    s.connect(('1.1.1.1', 53)); print('CONNECTED')\n"
        "except OSError as exc:\n"
        "    print('blocked', exc.errno)\n"
    )
    proc = _run_in_sandbox(sandbox_image, code)
    assert proc.returncode == 0, proc.stderr
    interfaces, outcome = proc.stdout.strip().splitlines()
    assert interfaces == "['lo']"
    assert outcome.startswith("blocked")


def test_every_tool_the_code_runs_was_installed_by_infra_up(kafka_bootstrap: str, sandbox_image: str) -> None:
    from stacx.infra.services import tools

    absent = tools.missing()
    assert not absent, (
        "after `stacx infra up` these programs are still not on PATH (infra/services/tools.py should "
        "have installed them): " + ", ".join(f"{t.executable} (package {t.package})" for t in absent)
    )
