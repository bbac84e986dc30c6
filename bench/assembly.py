"""Benchmark: trajectories/s through the Faust assembler vs a plain confluent-kafka loop.

Both read the same preloaded trajectories topic in the same run:
  baseline   confluent-kafka consume -> decode (stacx.schemas.codec) -> produce the event unchanged
  assembler  the `stacx assemble` worker (in this process): group, filter, mix, pack, produce
Rates count input trajectories from the first event consumed to the last output written.
`ratio` = assembler rate / baseline rate (best of `--runs` rounds each). CPU seconds are this
process's (the assembler's include its start-up and shutdown).

Scale-out: `stacx assemble` worker processes (one, then two, in one consumer group) on a fresh
`--partitions`-partition topic each; the workers start on the empty topic, and once the group is
stable the trajectories (built and encoded once beforehand, written lz4-compressed like every
STACX producer) are written, so no rebalance falls inside the measurement and the writer takes
little CPU from the workers (0.2-0.4 s for the whole input). Rate: the trajectories of all the
batches over the time from the input's first write to the last batch's timestamp: the time the
job takes, start-up and tail included (the bench reads no batch meanwhile: it polls the batches
topic's end offset, and reads the batches' timestamps afterwards). The work:
`--scale-out-trajectories` (65,536 by default, 7-12 s of work for one worker or two) per run,
`--scale-out-rounds` (3) rounds of one worker then two, same work and settings on both sides;
`scale_out_ratio` = the best two-worker rate / the best one-worker rate (the rates of every run
are listed). Each scale-out run also
reports the CPU per trajectory of the workers and of the local broker (found by its `kafka.Kafka`
JVM), and the cores busy on the whole machine meanwhile. The default run takes about 4 minutes.
Last stdout line: the JSON figure object.

    .venv/bin/python bench/assembly.py --json [--trajectories 4096] [--tokens 512] [--runs 3]
        [--scale-out-trajectories 65536] [--scale-out-rounds 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from stacx.consumers.assembly import (  # noqa: E402
    AssemblerApp,
    AssemblyStats,
    GroupAssembler,
    MixturePlanner,
)
from stacx.consumers.assembly.testing import make_trajectory  # noqa: E402
from stacx.schemas import topics  # noqa: E402
from stacx.schemas.codec import decode, encode  # noqa: E402
from stacx.schemas.records import Trajectory  # noqa: E402


def _create_topics(admin: AdminClient, names: dict[str, int]) -> None:
    cfg = {"max.message.bytes": str(topics.BATCHES_MAX_MESSAGE_BYTES)}
    new = [NewTopic(n, num_partitions=p, replication_factor=1, config=cfg) for n, p in names.items()]
    for future in admin.create_topics(new).values():
        future.result(timeout=30)


def _encoded_trajectories(args: argparse.Namespace, count: int | None = None) -> list[tuple[bytes, bytes]]:
    """(key, value) of every input trajectory (`count`, default `--trajectories`), encoded ahead
    of the measurement."""
    records = []
    for g in range((count or args.trajectories) // args.group_size):
        for i in range(args.group_size):
            half = args.tokens // 2
            traj = make_trajectory(f"group-{g}", i, num_prompt=half, num_completion=args.tokens - half)
            records.append((traj.group_id.encode(), encode(traj)))
    return records


def _preload(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> int:
    """Write the pre-encoded trajectories, lz4-compressed like every STACX producer: the writer
    spends little CPU next to the workers it feeds (it used to build and gzip each record as it
    went, which capped the input rate below what two workers read)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "compression.type": "lz4",
            "message.max.bytes": 16 * 1024 * 1024,
        }
    )
    for key, value in records:
        producer.produce(topic, key=key, value=value)
        producer.poll(0)
    producer.flush(60)
    return len(records)


def run_baseline(bootstrap: str, source: str, sink: str, expected: int) -> dict[str, float]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    consumer.subscribe([source])
    seen, started = 0, 0.0
    cpu0 = time.process_time()
    deadline = time.monotonic() + 300
    while seen < expected and time.monotonic() < deadline:
        for msg in consumer.consume(500, timeout=1.0):
            if msg.error():
                continue
            started = started or time.monotonic()
            decode(msg.value(), Trajectory)
            producer.produce(sink, key=msg.key(), value=msg.value())
            producer.poll(0)
            seen += 1
    producer.flush(60)
    elapsed = time.monotonic() - started
    consumer.close()
    return {
        "trajectories": seen,
        "seconds": elapsed,
        "rate": seen / elapsed,
        "cpu_s": time.process_time() - cpu0,
    }


def _watch_batches(
    bootstrap: str, topic: str, expected: int, out: dict[str, Any], stats: AssemblyStats
) -> None:
    """Thread: wait for `expected` batches, note the last one's timestamp, SIGTERM the worker.

    Also samples the process CPU time when the first trajectory is seen and at the last batch.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + 600
    out["batches"], out["last_ms"] = 0, 0
    while out["batches"] < expected and time.monotonic() < deadline:
        msg = consumer.poll(0.05)
        if stats.first_event_ms and "cpu_first" not in out:
            out["cpu_first"] = time.process_time()
        if msg is None or msg.error():
            continue
        out["batches"] += 1
        out["last_ms"] = max(out["last_ms"], msg.timestamp()[1])
    out["cpu_last"] = time.process_time()
    consumer.close()
    os.kill(os.getpid(), signal.SIGTERM)


def _records_written(bootstrap: str, app_id: str) -> dict[str, int]:
    """Records in the worker's own topics (table changelogs, groups, ticks) and its outputs:
    what the assembler wrote to Kafka, per topic suffix."""
    from confluent_kafka import TopicPartition

    admin = AdminClient({"bootstrap.servers": bootstrap})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"})
    written: dict[str, int] = {}
    for name, meta in admin.list_topics(timeout=10).topics.items():
        if not name.startswith(app_id):
            continue
        total = 0
        for partition in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=10)
            total += high - low
        written[name[len(app_id) + 1 :]] = total
    consumer.close()
    return written


def run_assembler(
    bootstrap: str, names: dict[str, str], args: argparse.Namespace, expected_batches: int, app_id: str
) -> dict[str, Any]:
    config = AssemblerApp.Config(
        app_id=app_id,
        bootstrap_servers=bootstrap,
        datadir=f"/tmp/stacx-bench-assembly-{uuid.uuid4().hex[:8]}",
        stats_interval_s=0,
        grouping=GroupAssembler.Config(group_size=args.group_size),
        mixture=MixturePlanner.Config(batch_size=args.batch_size),
        **names,
    )
    assembler = AssemblerApp(config)
    watched: dict[str, Any] = {}
    watcher = threading.Thread(
        target=_watch_batches,
        args=(bootstrap, config.batches_topic, expected_batches, watched, assembler.stats),
        daemon=True,
    )
    watcher.start()
    cpu0 = time.process_time()
    stopped_by = assembler.run(loglevel="warning")  # the watcher's SIGTERM
    cpu_s = time.process_time() - cpu0
    watcher.join(timeout=30)
    stats = assembler.stats
    complete = watched.get("batches", 0) >= expected_batches and stats.first_event_ms
    if stopped_by is not signal.SIGTERM or not complete:
        raise SystemExit(
            f"assembler failed (stopped by {stopped_by}, {watched.get('batches')} of "
            f"{expected_batches} batches, stats {stats.as_dict()})"
        )
    elapsed = (watched["last_ms"] - stats.first_event_ms) / 1000
    written = _records_written(bootstrap, app_id)
    return {
        "trajectories": stats.trajectories,
        "batches": watched["batches"],
        "kafka_writes_per_input": round(sum(written.values()) / stats.trajectories, 3),
        "writes": written,
        "seconds": elapsed,
        "rate": stats.trajectories / elapsed,
        "cpu_s": cpu_s,
        "processing_cpu_s": watched["cpu_last"] - watched["cpu_first"],
        "stats": stats.as_dict(),
    }


def _wait_stable(admin: AdminClient, group: str, members: int, timeout_s: float = 180.0) -> None:
    """Until the consumer group `group` is stable with `members` members."""
    from confluent_kafka import ConsumerGroupState

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = admin.describe_consumer_groups([group])[group].result(timeout=10)
            if found.state == ConsumerGroupState.STABLE and len(found.members) == members:
                return
        except Exception:  # the group does not exist yet
            pass
        time.sleep(1.0)
    raise SystemExit(f"consumer group {group} never became stable with {members} members")


def _wait_for_batches(bootstrap: str, topic: str, expected: int, timeout_s: float = 900.0) -> None:
    """Until `topic` (one partition) holds `expected` records: its end offset, polled every 0.2 s,
    so the bench reads no batch while the workers run."""
    from confluent_kafka import TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"})
    deadline = time.monotonic() + timeout_s
    try:
        while consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] < expected:
            if time.monotonic() > deadline:
                raise SystemExit(f"{topic}: fewer than {expected} batches within {timeout_s:.0f}s")
            time.sleep(0.2)
    finally:
        consumer.close()


def _batch_times(bootstrap: str, topic: str, expected: int, timeout_s: float = 900.0) -> list[int]:
    """Timestamps (ms) of the first `expected` batches on `topic`."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    times: list[int] = []
    deadline = time.monotonic() + timeout_s
    while len(times) < expected and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            times.append(msg.timestamp()[1])
    consumer.close()
    if len(times) < expected:
        raise SystemExit(f"{topic}: {len(times)} of {expected} batches within {timeout_s:.0f}s")
    return sorted(times)


def _cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> float:
    """User + system CPU seconds of the worker processes so far."""
    return sum(_cpu_each(procs))


def _cpu_each(procs: list[subprocess.Popen[bytes]]) -> list[float]:
    """User + system CPU seconds of each worker process so far."""
    import psutil

    return [sum(psutil.Process(p.pid).cpu_times()[:2]) for p in procs]


def _broker_process() -> Any:
    """The local Kafka broker's process (a JVM running `kafka.Kafka`), or None."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        if "kafka.Kafka" in (proc.info["cmdline"] or []):
            return proc
    return None


def _cpu_snapshot(
    procs: list[subprocess.Popen[bytes]], broker: Any
) -> tuple[float, float, float, float, float, float]:
    """(workers' CPU s, broker's CPU s, whole machine's busy CPU s, its iowait s, bytes written to
    its disks, monotonic time)."""
    import psutil

    machine = psutil.cpu_times()
    iowait = getattr(machine, "iowait", 0.0)
    busy = sum(machine) - machine.idle - iowait
    broker_s = sum(broker.cpu_times()[:2]) if broker is not None else 0.0
    disk = psutil.disk_io_counters()
    written = float(disk.write_bytes) if disk is not None else 0.0
    return _cpu_seconds(procs), broker_s, busy, iowait, written, time.monotonic()


def run_workers(
    bootstrap: str, args: argparse.Namespace, num_workers: int, records: list[tuple[bytes, bytes]]
) -> dict[str, Any]:
    """`num_workers` `stacx assemble` processes on a fresh topic: trajectories/s, steady state."""
    run = f"{uuid.uuid4().hex[:8]}-w{num_workers}"
    names = {
        "trajectories_topic": f"bench.asm.traj.{run}",
        "batches_topic": f"bench.asm.batches.{run}",
        "weights_topic": f"bench.asm.weights.{run}",
        "dlq_topic": f"bench.asm.dlq.{run}",
    }
    app_id = f"bench-asm-{run}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    _create_topics(
        admin,
        {
            names["trajectories_topic"]: args.partitions,
            names["batches_topic"]: 1,
            names["weights_topic"]: 1,
            names["dlq_topic"]: 1,
        },
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="stacx-bench-asm-") as workdir:
            for i in range(num_workers):
                config = {
                    "app_id": app_id,
                    "bootstrap_servers": bootstrap,
                    "stats_interval_s": 0,
                    "standby_replicas": args.standby_replicas,
                    "datadir": f"{workdir}/worker-{i}",
                    "grouping": {"group_size": args.group_size},
                    "mixture": {"batch_size": args.batch_size},
                    **names,
                }
                path = Path(workdir) / f"worker-{i}.yaml"
                path.write_text(json.dumps({"assembler": config}))  # JSON is YAML
                log_file = open(Path(workdir) / f"worker-{i}.log", "wb")  # noqa: SIM115
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "stacx.infra.cli", "assemble", "--config", str(path)],
                        cwd=Path(__file__).resolve().parents[1],
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                    )
                )
            _wait_stable(admin, app_id, num_workers)
            time.sleep(3.0)  # let the table recovery of the last assignment finish
            broker = _broker_process()
            before, each_before = _cpu_snapshot(procs, broker), _cpu_each(procs)
            started_ms = time.time() * 1000
            count = _preload(bootstrap, names["trajectories_topic"], records)
            expected = count // (args.group_size * args.batch_size)
            _wait_for_batches(bootstrap, names["batches_topic"], expected)
            after, each_after = _cpu_snapshot(procs, broker), _cpu_each(procs)
            times = _batch_times(bootstrap, names["batches_topic"], expected)
            cpu_s, broker_cpu_s, busy_s, iowait_s, written, wall_s = (
                a - b for a, b in zip(after, before, strict=True)
            )
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        doomed = [*names.values(), *(t for t in admin.list_topics(timeout=10).topics if t.startswith(app_id))]
        for future in admin.delete_topics(doomed).values():
            try:
                future.result(timeout=30)
            except Exception:
                pass
    seconds = max((times[-1] - started_ms) / 1000, 1e-3)
    return {
        "workers": num_workers,
        "batches": len(times),
        "seconds": seconds,
        "first_batch_s": round((times[0] - started_ms) / 1000, 2),
        "rate": len(times) * args.group_size * args.batch_size / seconds,
        "cpu_ms_per_trajectory": round(1000 * cpu_s / count, 3),
        "broker_cpu_ms_per_trajectory": round(1000 * broker_cpu_s / count, 3) if broker else None,
        # cores in use on the whole machine from the input's first write to the last batch
        "machine_cores_busy": round(busy_s / wall_s, 2),
        "worker_cores_busy": round(cpu_s / wall_s, 2),
        "cores_busy_by_worker": [
            round((a - b) / wall_s, 2) for a, b in zip(each_after, each_before, strict=True)
        ],
        "measured_s": round(wall_s, 2),
        "iowait_cores": round(iowait_s / wall_s, 2),
        "disk_write_mb_per_s": round(written / wall_s / 1e6, 1),
        "cores": os.cpu_count(),
    }


def _round_in_child(argv: list[str]) -> dict[str, Any]:
    """One baseline + assembler round in a fresh process (a Faust worker runs once per process)."""
    cmd = [sys.executable, __file__, *argv, "--runs", "1", "--no-scale-out", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"bench round failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return figures


def run_rounds(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """`--runs` rounds of the single-process comparison, then the scale-out runs."""
    rounds = []
    for r in range(args.runs):
        rounds.append(_round_in_child(argv))
        print(f"[bench.assembly] round {r + 1}: {json.dumps(rounds[-1])}", file=sys.stderr, flush=True)
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    if not args.no_scale_out:
        records = _encoded_trajectories(args, args.scale_out_trajectories)
        for r in range(args.scale_out_rounds):
            for workers in (1, 2):
                runs[workers].append(run_workers(args.bootstrap, args, workers, records))
                print(
                    f"[bench.assembly] scale-out round {r + 1}, {workers} worker process(es): "
                    f"{runs[workers][-1]['rate']:.0f} trajectories/s "
                    f"(load {os.getloadavg()[0]:.1f})",
                    file=sys.stderr,
                    flush=True,
                )
    scale = {n: max(found, key=lambda run: run["rate"]) for n, found in runs.items() if found}
    ratios = [r["ratio"] for r in rounds]
    return {
        "ratio": min(ratios, default=None),
        "ratios": ratios,
        "kafka_writes_per_input": rounds[0]["kafka_writes_per_input"] if rounds else None,
        "scale_out_ratio": round(scale[2]["rate"] / scale[1]["rate"], 3) if scale else None,
        "one_worker_traj_per_s": round(scale[1]["rate"], 1) if scale else None,
        "scale_out_rates": {n: [round(run["rate"], 1) for run in found] for n, found in runs.items()},
        "scale_out_trajectories": args.scale_out_trajectories if scale else None,
        "two_workers_traj_per_s": round(scale[2]["rate"], 1) if scale else None,
        "cpu_ms_per_trajectory": {n: r["cpu_ms_per_trajectory"] for n, r in scale.items()},
        "broker_cpu_ms_per_trajectory": {n: r["broker_cpu_ms_per_trajectory"] for n, r in scale.items()},
        "machine_cores_busy": {n: r["machine_cores_busy"] for n, r in scale.items()},
        "worker_cores_busy": {n: r["worker_cores_busy"] for n, r in scale.items()},
        "cores_busy_by_worker": {n: r["cores_busy_by_worker"] for n, r in scale.items()},
        "scale_out_seconds": {n: round(r["seconds"], 2) for n, r in scale.items()},
        "first_batch_s": {n: r["first_batch_s"] for n, r in scale.items()},
        "scale_out_measured_s": {n: r["measured_s"] for n, r in scale.items()},
        "iowait_cores": {n: r["iowait_cores"] for n, r in scale.items()},
        "disk_write_mb_per_s": {n: r["disk_write_mb_per_s"] for n, r in scale.items()},
        "standby_replicas": args.standby_replicas,
        "rounds": rounds,
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON figures")
    parser.add_argument("--bootstrap", default=topics.default_bootstrap())
    parser.add_argument("--trajectories", type=int, default=4096)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8, help="groups per batch")
    parser.add_argument("--tokens", type=int, default=512, help="tokens per trajectory")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="rounds of baseline and assembler")
    parser.add_argument(
        "--scale-out-trajectories", type=int, default=65536, help="trajectories per scale-out run"
    )
    parser.add_argument("--scale-out-rounds", type=int, default=3, help="rounds of one and two workers")
    parser.add_argument("--standby-replicas", type=int, default=0, help="scale-out workers (default 0)")
    parser.add_argument("--no-scale-out", action="store_true", help="skip the worker-process runs")
    argv = sys.argv[1:]
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.runs != 1 or not args.no_scale_out:
        print(json.dumps(run_rounds(args, [a for a in argv if a != "--json"])))
        return

    run = uuid.uuid4().hex[:8]
    names = {
        "trajectories_topic": f"bench.asm.traj.{run}",
        "batches_topic": f"bench.asm.batches.{run}",
        "weights_topic": f"bench.asm.weights.{run}",
        "dlq_topic": f"bench.asm.dlq.{run}",
    }
    baseline_sink = f"bench.asm.baseline.{run}"
    app_id = f"bench-asm-{run}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    _create_topics(
        admin,
        {
            names["trajectories_topic"]: args.partitions,
            baseline_sink: 1,
            names["batches_topic"]: 1,
            names["weights_topic"]: 1,
            names["dlq_topic"]: 1,
        },
    )
    try:
        count = _preload(args.bootstrap, names["trajectories_topic"], _encoded_trajectories(args))
        baseline = run_baseline(args.bootstrap, names["trajectories_topic"], baseline_sink, count)
        expected_batches = count // (args.group_size * args.batch_size)
        assembler = run_assembler(args.bootstrap, names, args, expected_batches, app_id)
    finally:
        doomed = [*names.values(), baseline_sink]
        doomed += [t for t in admin.list_topics(timeout=10).topics if t.startswith(app_id)]
        for future in admin.delete_topics(doomed).values():
            try:
                future.result(timeout=30)
            except Exception:
                pass
    figures = {
        "ratio": round(assembler["rate"] / baseline["rate"], 3),
        "trajectories": count,
        "tokens_per_trajectory": args.tokens,
        "group_size": args.group_size,
        "batch_groups": args.batch_size,
        "partitions": args.partitions,
        "baseline_traj_per_s": round(baseline["rate"], 1),
        "assembler_traj_per_s": round(assembler["rate"], 1),
        "assembler_batches": assembler["batches"],
        "kafka_writes_per_input": assembler["kafka_writes_per_input"],
        "writes": assembler["writes"],
        "baseline_cpu_s": round(baseline["cpu_s"], 2),
        "assembler_cpu_s": round(assembler["cpu_s"], 2),
        "assembler_processing_cpu_s": round(assembler["processing_cpu_s"], 2),
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }
    if not args.json:
        print(json.dumps({"baseline": baseline, "assembler": assembler}, indent=2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
