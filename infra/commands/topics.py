"""`stacx topics gc`: remove claim-check blobs that no retained record refers to any more."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("topics", help="topic housekeeping: claim-check blob garbage collection")
    sub = p.add_subparsers(dest="topics_command", metavar="ACTION", required=True)
    gc = sub.add_parser(
        "gc",
        help="delete claim-check blobs of a topic that no retained record refers to (older than --grace)",
    )
    gc.add_argument("topics", nargs="*", help="topics to collect (default: every topic folder in the store)")
    gc.add_argument("--store", help="blob store URL (default: $STACX_BLOBS, else ~/.cache/stacx/blobs)")
    gc.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $STACX_KAFKA or 127.0.0.1:9092)")
    gc.add_argument(
        "--grace", type=float, default=24.0, help="hours an unreferenced blob is kept (in-flight publishes)"
    )
    gc.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    gc.add_argument("--json", action="store_true", help="print one JSON object per topic")
    gc.set_defaults(func=_gc)


def _gc(args: argparse.Namespace) -> int:
    from consumers.blob_gc import collect, referenced_in_topic
    from infra.config import bootstrap_servers
    from producers.blobs import FsspecBlobStore

    if args.grace < 0:
        print("stacx topics gc: --grace must be >= 0 hours")
        return 2
    store = FsspecBlobStore(args.store)
    bootstrap = args.bootstrap or bootstrap_servers({})
    topics = args.topics or store.prefixes()
    reports = collect(
        store,
        topics,
        referenced=lambda topic: referenced_in_topic(bootstrap, topic),
        grace_s=args.grace * 3600.0,
        dry_run=args.dry_run,
    )
    verb = "would delete" if args.dry_run else "deleted"
    for report in reports:
        if args.json:
            print(json.dumps(_as_dict(report)))
        elif report.skipped:
            print(f"{report.topic}: left alone ({report.skipped})")
        else:
            print(
                f"{report.topic}: {verb} {len(report.deleted)} orphan blobs "
                f"({report.deleted_bytes / 1e6:.1f} MB), kept {report.kept} in use and {report.young} "
                f"younger than {args.grace:g} h"
            )
    print(f"blob store: {store.root_url}")
    return 1 if any(r.skipped for r in reports) else 0


def _as_dict(report: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(report)
