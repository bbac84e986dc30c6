"""Benchmark: replay throughput (trajectories/s) from a retained topic through the assembler's
stages into encoded batches, vs a plain consume -> decode loop over the same topic, same run.

  plain   stacx.consumers.replay.read_range (confluent-kafka) -> stacx.schemas.codec decode of every record
  replay  read_range -> ReplayAssembler (group, filter, mix, pack, encode batches), as `stacx replay`
Both read the whole preloaded topic; rates count input trajectories over wall time from the first
read to the last batch. `ratio` = replay rate / plain rate. Last stdout line: the JSON figures.

    .venv/bin/python bench/replay.py --json [--trajectories 4000] [--tokens 512]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from stacx.consumers.assembly.testing import make_trajectory  # noqa: E402
from stacx.consumers.replay import ReplayAssembler, ReplayRange, read_range  # noqa: E402
from stacx.infra.config import build  # noqa: E402
from stacx.schemas.codec import Codec, encode  # noqa: E402
from stacx.schemas.topics import default_bootstrap  # noqa: E402


def _preload(bootstrap: str, topic: str, args: argparse.Namespace) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4",
                         "enable.idempotence": True})  # fmt: skip
    count = 0
    for g in range(args.trajectories // args.group_size):
        for i in range(args.group_size):
            traj = make_trajectory(f"group-{g}", i, num_prompt=args.tokens // 2,
                                   num_completion=args.tokens - args.tokens // 2)  # fmt: skip
            producer.produce(topic, key=traj.group_id.encode(), value=encode(traj))
            producer.poll(0)
            count += 1
    assert producer.flush(60) == 0
    return count


def _plain(bootstrap: str, topic: str) -> dict[str, Any]:
    codec = Codec()
    start, cpu = time.perf_counter(), time.process_time()
    records = read_range(bootstrap, ReplayRange(topic=topic))
    for record in records:
        codec.decode(record.value)
    wall = time.perf_counter() - start
    return {
        "records": len(records),
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu,
        "rate": len(records) / wall,
    }


def _replay(bootstrap: str, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    config = build(
        ReplayAssembler.Config,
        {"grouping": {"group_size": args.group_size}, "mixture": {"batch_size": args.batch_size}},
        where="bench",
    )
    start, cpu = time.perf_counter(), time.process_time()
    records = read_range(bootstrap, ReplayRange(topic=topic))
    result = ReplayAssembler(config, Codec()).assemble(records)
    wall = time.perf_counter() - start
    return {
        "records": len(records),
        "batches": len(result.batches),
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu,
        "rate": len(records) / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=4000)
    parser.add_argument("--tokens", type=int, default=512, help="tokens per trajectory")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8, help="groups per batch")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print only the JSON figures")
    args = parser.parse_args()
    bootstrap = default_bootstrap()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"bench.replay.{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, num_partitions=args.partitions, replication_factor=1)])[
        topic
    ].result(30)
    try:
        count = _preload(bootstrap, topic, args)
        plain = _plain(bootstrap, topic)
        replay = _replay(bootstrap, topic, args)
    finally:
        for future in admin.delete_topics([topic]).values():
            try:
                future.result(timeout=30)
            except Exception:
                pass
    figures = {
        "trajectories": count,
        "tokens_per_trajectory": args.tokens,
        "group_size": args.group_size,
        "batch_groups": args.batch_size,
        "partitions": args.partitions,
        "plain_traj_per_s": round(plain["rate"], 1),
        "replay_traj_per_s": round(replay["rate"], 1),
        "replay_batches": replay["batches"],
        "ratio": round(replay["rate"] / plain["rate"], 3),
        "plain_cpu_s": round(plain["cpu_s"], 2),
        "replay_cpu_s": round(replay["cpu_s"], 2),
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }
    if not args.json:
        print(json.dumps({"plain": plain, "replay": replay}, indent=2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
