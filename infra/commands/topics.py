"""`stacx topics list | describe | gc`: the runs on the cluster, their sizes and consumer lag;
deletion of a finished run's topics; claim-check blob garbage collection."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("topics", help="topic housekeeping: runs, sizes, lag, deletion, blob gc")
    sub = p.add_subparsers(dest="topics_command", metavar="ACTION", required=True)
    lst = sub.add_parser("list", help="runs (and other topics) with records and bytes on disk")
    _common(lst)
    lst.add_argument("--all", action="store_true", help="also list topics that belong to no run")
    lst.set_defaults(func=_list)
    desc = sub.add_parser("describe", help="one run: its topics, sizes and the lag of every consumer group")
    desc.add_argument("run", help="run id (`stacx topics list` shows them), e.g. quickstart-20261130-120000")
    _common(desc)
    desc.set_defaults(func=_describe)
    gc = sub.add_parser(
        "gc",
        help="delete claim-check blobs no retained record refers to; with --run, a finished run's topics",
    )
    gc.add_argument("topics", nargs="*", help="topics to collect (default: every topic folder in the store)")
    gc.add_argument("--run", action="append", default=[], help="delete this finished run's topics and groups")
    gc.add_argument("--store", help="blob store URL (default: $STACX_BLOBS, else ~/.cache/stacx/blobs)")
    gc.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $STACX_KAFKA or 127.0.0.1:9092)")
    gc.add_argument(
        "--grace", type=float, default=24.0, help="hours an unreferenced blob is kept (in-flight publishes)"
    )
    gc.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    gc.add_argument("--json", action="store_true", help="print one JSON object per topic")
    gc.set_defaults(func=_gc)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $STACX_KAFKA or 127.0.0.1:9092)")
    p.add_argument(
        "--no-sizes", action="store_true", help="skip bytes on disk (needs Java and the Kafka jars)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _bootstrap(args: argparse.Namespace) -> str:
    from stacx.infra.config import bootstrap_servers

    return str(args.bootstrap or bootstrap_servers({}))


def _mb(size: int | None) -> str:
    return "?" if size is None else f"{size / 1e6:.1f} MB"


def _list(args: argparse.Namespace) -> int:
    from stacx.infra.services import topic_admin
    from stacx.infra.services.errors import InfraError

    try:
        infos = topic_admin.topic_infos(_bootstrap(args), sizes=not args.no_sizes)
    except InfraError as exc:  # no Java or jars for the sizes: --no-sizes works without them
        print(f"stacx topics list: {exc}")
        return 2
    summaries = topic_admin.runs(infos)
    others = [t for t in infos if t.run is None] if args.all else []
    if args.json:
        doc = {
            "runs": [
                {**dataclasses.asdict(r), "records": r.records, "size_bytes": r.size_bytes} for r in summaries
            ],
            "other_topics": [dataclasses.asdict(t) for t in others],
        }
        print(json.dumps(doc))
        return 0
    for r in summaries:
        print(f"{r.run}: {len(r.topics)} topics, {r.records} records, {_mb(r.size_bytes)}")
    for t in others:
        print(f"  {t.name}: {t.partitions} partitions, {t.records} records, {_mb(t.size_bytes)}")
    if not summaries:
        print("no runs (per-run topics are named stacx.<kind>.<run id>)")
    return 0


def _describe(args: argparse.Namespace) -> int:
    from stacx.infra.services import topic_admin
    from stacx.infra.services.errors import InfraError

    try:
        summary, lags = topic_admin.describe(_bootstrap(args), args.run, sizes=not args.no_sizes)
    except InfraError as exc:
        print(f"stacx topics describe: {exc}")
        return 2
    if args.json:
        print(json.dumps({"run": dataclasses.asdict(summary), "lag": [dataclasses.asdict(g) for g in lags]}))
        return 0
    print(f"run {summary.run}: {summary.records} records, {_mb(summary.size_bytes)}")
    for t in summary.topics:
        print(f"  topic {t.name}: {t.partitions} partitions, {t.records} records, {_mb(t.size_bytes)}")
    for g in lags:
        print(
            f"  group {g.group} ({g.state}, {g.members} members) on {g.topic}: "
            f"committed {g.committed}/{g.end}, lag {g.lag}"
        )
    return 0


def _gc(args: argparse.Namespace) -> int:
    if args.grace < 0:
        print("stacx topics gc: --grace must be >= 0 hours")
        return 2
    if args.run:
        return _gc_runs(args)
    return _gc_blobs(args)


def _gc_runs(args: argparse.Namespace) -> int:
    from stacx.consumers.blob_gc import delete_topic_blobs
    from stacx.infra.services import topic_admin
    from stacx.infra.services.errors import InfraError
    from stacx.producers.blobs import FsspecBlobStore

    verb = "would delete" if args.dry_run else "deleted"
    code = 0
    for run in args.run:
        try:
            names, groups = topic_admin.delete_run(_bootstrap(args), run, dry_run=args.dry_run)
        except InfraError as exc:
            print(f"stacx topics gc: {exc}")
            code = 1
            continue
        blobs = delete_topic_blobs(FsspecBlobStore(args.store), names, dry_run=args.dry_run)
        num_blobs, num_bytes = sum(len(r.deleted) for r in blobs), sum(r.deleted_bytes for r in blobs)
        if args.json:
            print(json.dumps({"run": run, "topics": names, "groups": groups, "blobs": num_blobs,
                              "blob_bytes": num_bytes, "dry_run": args.dry_run}))
        else:
            print(f"{run}: {verb} {len(names)} topics ({', '.join(names)}), {len(groups)} groups "
                  f"and {num_blobs} blobs ({num_bytes / 1e6:.1f} MB)")
    return code


def _gc_blobs(args: argparse.Namespace) -> int:
    from stacx.consumers.blob_gc import collect, referenced_in_topic
    from stacx.producers.blobs import FsspecBlobStore

    store = FsspecBlobStore(args.store)
    bootstrap = _bootstrap(args)
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
            print(json.dumps(dataclasses.asdict(report)))
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
