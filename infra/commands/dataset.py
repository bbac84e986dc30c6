"""`stacx export` (a topic range -> Parquet) and `stacx import` (Parquet -> events): move
trajectories between Kafka and pandas / Hugging Face `datasets`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    exp = subparsers.add_parser("export", help="write a range of a trajectories topic to a Parquet file")
    exp.add_argument("topic", help="trajectories topic, e.g. stacx.trajectories.<run id>")
    exp.add_argument("dest", help="Parquet file to write")
    exp.add_argument("--from-offset", type=int)
    exp.add_argument("--to-offset", type=int)
    exp.add_argument("--from-time", help="first event time (ISO 8601 or epoch ms)")
    exp.add_argument("--to-time", help="end time, exclusive (ISO 8601 or epoch ms)")
    exp.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $STACX_KAFKA or 127.0.0.1:9092)")
    exp.set_defaults(func=_export)
    imp = subparsers.add_parser(
        "import", help="publish the rows of a Parquet file (from `stacx export`) as events"
    )
    imp.add_argument("source", help="Parquet file")
    imp.add_argument(
        "topic", help="topic to publish to (it must exist: `stacx infra up` creates the standard ones)"
    )
    imp.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $STACX_KAFKA or 127.0.0.1:9092)")
    imp.set_defaults(func=_import)


def _bootstrap(args: argparse.Namespace) -> str:
    from stacx.infra.config import bootstrap_servers

    return str(args.bootstrap or bootstrap_servers({}))


def _export(args: argparse.Namespace) -> int:
    from stacx.consumers.errors import ConsumerError
    from stacx.consumers.parquet import export_topic
    from stacx.consumers.replay import ReplayRange
    from stacx.infra.commands.replay import epoch_ms

    try:
        spec = ReplayRange(
            topic=args.topic, from_offset=args.from_offset, to_offset=args.to_offset,
            from_timestamp_ms=epoch_ms(args.from_time) if args.from_time else None,
            to_timestamp_ms=epoch_ms(args.to_time) if args.to_time else None,
        )  # fmt: skip
        result = export_topic(_bootstrap(args), spec, Path(args.dest))
    except (ConsumerError, ValueError) as exc:
        print(f"stacx export: {exc}", file=sys.stderr)
        return 2
    print(f"exported {result.rows} trajectories of {args.topic} to {args.dest}")
    if result.undecodable:
        print(
            f"stacx export: left out {result.undecodable} undecodable record(s) of {args.topic} "
            f"(the first at {result.first_undecodable})",
            file=sys.stderr,
        )
    if result.other_records:
        print(
            f"stacx export: left out {result.other_records} event(s) that are not trajectories",
            file=sys.stderr,
        )
    return 0


def _import(args: argparse.Namespace) -> int:
    from stacx.consumers.errors import ConsumerError
    from stacx.consumers.parquet import import_file
    from stacx.infra.services.topics import missing_topics

    bootstrap = _bootstrap(args)
    if missing_topics(bootstrap, [args.topic]):
        print(
            f"stacx import: topic {args.topic!r} does not exist at {bootstrap}; create it first",
            file=sys.stderr,
        )
        return 2
    try:
        rows = import_file(bootstrap, Path(args.source), args.topic)
    except (ConsumerError, OSError) as exc:
        print(f"stacx import: {exc}", file=sys.stderr)
        return 2
    print(f"published {rows} trajectories from {args.source} to {args.topic}")
    return 0
