"""A single-node Apache Kafka (KRaft) on loopback, from Maven Central jars, run on Java 17.

`up()` resolves the jars once (`mvn dependency:copy-dependencies` over `infra/pom.xml`) into
`$STACX_HOME/kafka/<version>/libs`, formats the storage with `kafka.tools.StorageTool`, starts
`kafka.Kafka` and waits until the broker answers a metadata request.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from stacx.infra import paths
from stacx.infra.services import tools
from stacx.infra.services.errors import InfraError
from stacx.infra.services.processes import (
    pid_alive,
    port_open,
    read_pid,
    require_free_port,
    stop_pid,
    tail,
)

POM = Path(__file__).resolve().parent.parent / "pom.xml"
LOG4J = Path(__file__).resolve().parent.parent / "log4j2.xml"
HOST = "127.0.0.1"


@dataclass(kw_only=True, slots=True)
class KafkaConfig:
    """How the local broker is run."""

    port: int = field(default_factory=lambda: int(os.environ.get("STACX_KAFKA_PORT", "9092")))
    """Client listener on 127.0.0.1 (env STACX_KAFKA_PORT)."""
    controller_port: int = field(
        default_factory=lambda: int(os.environ.get("STACX_KAFKA_CONTROLLER_PORT", "9093"))
    )
    """KRaft controller listener on 127.0.0.1 (env STACX_KAFKA_CONTROLLER_PORT)."""
    heap: str = "1g"
    """JVM heap (-Xmx)."""
    start_timeout_s: float = 90.0
    """How long `up` waits for the broker to answer a metadata request."""

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"


def kafka_version() -> str:
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    if not match:
        raise InfraError(f"{POM} has no <kafka.version> property")
    return match.group(1)


def home() -> Path:
    return paths.stacx_home() / "kafka"


def jar_dir() -> Path:
    """Directory holding the broker and tools jars (classpath `<dir>/*`)."""
    return home() / kafka_version() / "libs"


def data_dir() -> Path:
    return home() / "data"


def log_file() -> Path:
    return paths.logs_dir() / "kafka.log"


def pid_file() -> Path:
    return paths.run_dir() / "kafka.pid"


# -- jars --------------------------------------------------------------------------------------


def ensure_jars() -> Path:
    """Resolve the Kafka jars from Maven Central once per machine."""
    libs = jar_dir()
    if (libs / ".complete").exists():
        return libs
    tools.ensure(["mvn"], say=lambda line: print(f"[stacx infra] {line}"))
    partial = libs.with_name("libs.partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [
        "mvn",
        "-q",
        "-B",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={partial}",
        "-DincludeScope=runtime",
    ]
    print(f"[stacx infra] resolving Apache Kafka {kafka_version()} jars with Maven (once per machine)")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise InfraError(_maven_failure(proc.stdout + proc.stderr))
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    (libs / ".complete").write_text(kafka_version())
    return libs


def _maven_failure(output: str) -> str:
    last = "\n".join(output.strip().splitlines()[-15:])
    if re.search(r"UnknownHost|Connection refused|Could not transfer|Network is unreachable", output):
        return (
            "Maven could not reach Maven Central to download the Kafka jars. Check the network "
            "or configure a mirror in ~/.m2/settings.xml, then rerun `stacx infra up`.\n" + last
        )
    return f"`mvn dependency:copy-dependencies -f {POM}` failed:\n{last}"


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise InfraError(
            "Java 17+ is needed to run Kafka; install it with "
            "`apt-get install openjdk-17-jre-headless` or set JAVA_HOME"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)', out)
    if not match or int(match.group(1)) < 17:
        raise InfraError(
            f"{java} is not Java 17+ ({out.splitlines()[0] if out else '?'}); "
            "install openjdk-17 or point JAVA_HOME at a JDK 17+"
        )
    return java


# -- configuration and storage -------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class ClusterBroker:
    """One broker of a KRaft cluster (combined broker and controller) on a host's address."""

    node_id: int
    """1-based: this broker's place among the cluster's broker hosts."""
    address: str
    """Listens (client and controller) on this address and advertises it."""
    port: int
    controller_port: int
    voters: str
    """`controller.quorum.voters`: `id@address:controller_port` of every broker host."""
    cluster_id: str
    """The KRaft cluster id every broker formats its storage with."""
    data_dir: Path
    """This broker's log directory."""
    heap: str = "1g"

    @property
    def replication(self) -> int:
        """Copies of the broker's internal topics (offsets, transactions): 3 at most."""
        return min(3, self.voters.count("@"))

    @property
    def bootstrap(self) -> str:
        return f"{self.address}:{self.port}"


def cluster_id_for(name: str) -> str:
    """A KRaft cluster id derived from `name` (every host formats its storage with the same id,
    without asking the others): 22 URL-safe base64 characters of a UUID5, never starting with '-'."""
    raw = uuid.uuid5(uuid.NAMESPACE_URL, f"stacx-kafka:{name}").bytes
    text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return text if not text.startswith("-") else "A" + text[1:]


def cluster_properties(broker: ClusterBroker) -> dict[str, str]:
    """server.properties of one broker of a cluster: internal topics replicated over the brokers
    (3 copies, 2 in sync, on three or more)."""
    replicas = str(broker.replication)
    min_isr = str(2 if broker.replication >= 3 else 1)
    return {
        **_common_properties(broker.data_dir),
        "node.id": str(broker.node_id),
        "controller.quorum.voters": broker.voters,
        "listeners": f"PLAINTEXT://{broker.address}:{broker.port},CONTROLLER://{broker.address}:{broker.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{broker.address}:{broker.port}",
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
    }


def prepare_cluster_broker(broker: ClusterBroker) -> list[str]:
    """Write the broker's server.properties, format its storage once (the cluster's id), and
    return the command line that runs it (for a supervisor to start and restart)."""
    java, libs = java_binary(), ensure_jars()
    broker.data_dir.mkdir(parents=True, exist_ok=True)
    properties = broker.data_dir.parent / f"server-{broker.node_id}.properties"
    props = cluster_properties(broker)
    properties.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    if not (broker.data_dir / "meta.properties").exists():
        _format(java, libs, properties, broker.cluster_id)
    return broker_argv(java, libs, properties, heap=broker.heap, logs_dir=broker.data_dir.parent)


def _common_properties(log_dirs: Path) -> dict[str, str]:
    return {
        "process.roles": "broker,controller",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dirs),
        "num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
        "message.max.bytes": str(64 * 1024 * 1024),
        "replica.fetch.max.bytes": str(64 * 1024 * 1024),
        "socket.request.max.bytes": str(256 * 1024 * 1024),
        "auto.create.topics.enable": "false",  # a mistyped topic name fails instead of appearing
        "log.cleaner.backoff.ms": "5000",
    }


def write_server_properties(config: KafkaConfig) -> Path:
    props = {
        **_common_properties(data_dir()),
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{config.controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{config.port},CONTROLLER://{HOST}:{config.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{config.port}",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
    }
    path = home() / "server.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def new_cluster_id() -> str:
    """A random KRaft cluster id as Kafka makes them (`Uuid.randomUuid`): 22 URL-safe base64
    characters, never starting with '-' (the storage tool would read it as an option: one id in 64)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def format_storage(java: str, libs: Path, properties: Path) -> None:
    """Format the KRaft log directory once (kept across restarts)."""
    if (data_dir() / "meta.properties").exists():
        return
    _format(java, libs, properties, new_cluster_id())


def _format(java: str, libs: Path, properties: Path, cluster_id: str) -> None:
    cmd = [
        java,
        "-cp",
        f"{libs}/*",
        f"-Dlog4j2.configurationFile={LOG4J}",
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id,
        "-c",
        str(properties),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise InfraError(f"kafka.tools.StorageTool format failed:\n{proc.stdout}{proc.stderr}")


# -- lifecycle -----------------------------------------------------------------------------------


def running_pid() -> int | None:
    return read_pid(pid_file())


def up(config: KafkaConfig) -> str:
    """Start the broker unless ours already runs; return a one-line status."""
    pid = running_pid()
    if pid is not None and broker_answers(config.bootstrap):
        return f"Kafka already running at {config.bootstrap} (pid {pid})"
    if pid is not None:
        wait_ready(config, pid, started=time.monotonic())
        return f"Kafka running at {config.bootstrap} (pid {pid})"
    require_free_port(HOST, config.port, "the Kafka broker", "STACX_KAFKA_PORT")
    require_free_port(HOST, config.controller_port, "the KRaft controller", "STACX_KAFKA_CONTROLLER_PORT")
    java = java_binary()
    libs = ensure_jars()
    properties = write_server_properties(config)
    format_storage(java, libs, properties)
    pid = _spawn(java, libs, properties, config)
    wait_ready(config, pid, started=time.monotonic())
    return f"Kafka started at {config.bootstrap} (pid {pid}, log {log_file()})"


def broker_argv(java: str, libs: Path, properties: Path, *, heap: str, logs_dir: Path) -> list[str]:
    """The command line of one broker process."""
    return [
        java,
        f"-Xmx{heap}",
        "-Xms256m",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J}",
        f"-Dkafka.logs.dir={logs_dir}",
        "-cp",
        f"{libs}/*",
        "kafka.Kafka",
        str(properties),
    ]


def _spawn(java: str, libs: Path, properties: Path, config: KafkaConfig) -> int:
    cmd = broker_argv(java, libs, properties, heap=config.heap, logs_dir=paths.logs_dir())
    with open(log_file(), "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    pid_file().write_text(str(proc.pid))
    return proc.pid


def wait_ready(config: KafkaConfig, pid: int, started: float) -> None:
    while time.monotonic() - started < config.start_timeout_s:
        if not pid_alive(pid):
            pid_file().unlink(missing_ok=True)
            raise InfraError(
                f"the Kafka broker exited during start-up; last lines of {log_file()}:\n{tail(log_file())}"
            )
        if port_open(HOST, config.port) and broker_answers(config.bootstrap):
            return
        time.sleep(0.5)
    raise InfraError(
        f"the Kafka broker did not answer within {config.start_timeout_s:.0f}s; "
        f"last lines of {log_file()}:\n{tail(log_file())}"
    )


def broker_answers(bootstrap: str, timeout_s: float = 5.0) -> bool:
    """True when a broker at `bootstrap` answers a metadata request (librdkafka's connection
    FAIL lines of the probe are not shown)."""
    from stacx.infra.services.reachability import kafka_problem

    return kafka_problem(bootstrap, timeout_s=timeout_s) is None


def down() -> str:
    pid = running_pid()
    if pid is None:
        pid_file().unlink(missing_ok=True)
        return "Kafka: not running (nothing started by stacx)"
    stop_pid(pid, timeout_s=60)
    pid_file().unlink(missing_ok=True)
    return f"Kafka: stopped pid {pid}"


def status(config: KafkaConfig) -> str:
    pid = running_pid()
    if pid is None:
        return f"Kafka: not running (log {log_file()})"
    state = "answering" if broker_answers(config.bootstrap) else "NOT answering"
    return (
        f"Kafka {kafka_version()}: pid {pid}, {state} at {config.bootstrap}, "
        f"data {data_dir()}, log {log_file()}"
    )
