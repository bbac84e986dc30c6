"""`stacx schemas`: list the event schemas, check evolution against the catalogue, register them."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("schemas", help="event schemas: list, check compatibility, register")
    sub = p.add_subparsers(dest="schemas_command", metavar="ACTION", required=True)

    ls = sub.add_parser("list", help="local schemas and every version registered in the catalogue")
    _common(ls)
    ls.add_argument("--offline", action="store_true", help="only the local schemas (no broker)")
    ls.set_defaults(func=_list)

    check = sub.add_parser("check", help="fail on a change incompatible with any registered version")
    _common(check)
    check.add_argument(
        "--mode",
        default="FULL",
        choices=["BACKWARD", "FORWARD", "FULL"],
        help="BACKWARD: new readers read old data; FORWARD: old readers read new data; FULL (default): both",
    )
    check.add_argument(
        "--schema",
        action="append",
        default=[],
        metavar="FILE",
        help="check this .avsc instead of the built-in schemas (repeatable)",
    )
    check.set_defaults(func=_check)

    reg = sub.add_parser("register", help="check, then register the built-in schemas in the catalogue")
    _common(reg)
    reg.set_defaults(func=_register)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $STACX_KAFKA or 127.0.0.1:9092)")
    p.add_argument("--topic", help="catalogue topic (default: stacx.schemas)")


def _catalogue(args: argparse.Namespace) -> Any:
    from stacx.infra.config import bootstrap_servers
    from stacx.schemas.catalogue import SchemaCatalogue
    from stacx.schemas.topics import SCHEMAS

    config = SchemaCatalogue.Config(
        bootstrap_servers=args.bootstrap or bootstrap_servers({}), topic=args.topic or SCHEMAS, timeout_s=10.0
    )
    return SchemaCatalogue(config)


def _read_catalogue(args: argparse.Namespace) -> Any | None:
    catalogue = _catalogue(args)
    try:
        catalogue.refresh()
    except Exception as exc:  # broker down: KafkaException, SchemaError
        print(
            f"cannot read the schema catalogue {catalogue.config.topic!r} at "
            f"{catalogue.config.bootstrap_servers}: {exc}\nstart the broker with "
            "`stacx infra up`, or use --offline",
            file=sys.stderr,
        )
        return None
    return catalogue


def _list(args: argparse.Namespace) -> int:
    from stacx.schemas.codec import builtin_schemas

    local = {i.fingerprint for i in builtin_schemas()}
    rows = [(i.name, i.fingerprint, "local (current)") for i in builtin_schemas()]
    if not args.offline:
        catalogue = _read_catalogue(args)
        if catalogue is None:
            return 2
        rows = [
            (n, f, s + (", registered" if f in {r.fingerprint for r in catalogue.registered()} else ""))
            for n, f, s in rows
        ]
        rows += [
            (i.name, i.fingerprint, "registered")
            for i in catalogue.registered()
            if i.fingerprint not in local
        ]
    width = max(len(r[0]) for r in rows)
    for name, fingerprint, status in sorted(rows):
        print(f"{name:<{width}}  {fingerprint}  {status}")
    return 0


def _candidates(args: argparse.Namespace) -> list[Any]:
    from pathlib import Path

    from stacx.schemas.codec import builtin_schemas, load_schema

    if not getattr(args, "schema", None):
        return list(builtin_schemas())
    return [load_schema(Path(path).read_text(encoding="utf-8")) for path in args.schema]


def _problems(args: argparse.Namespace, catalogue: Any, mode: str) -> dict[str, list[str]]:
    from stacx.schemas.compat import Compatibility, compatibility_problems

    found: dict[str, list[str]] = {}
    for info in _candidates(args):
        versions = [v.schema for v in catalogue.registered(info.name) if v.fingerprint != info.fingerprint]
        problems = compatibility_problems(info.schema, versions, Compatibility(mode))
        print(
            f"{info.name} {info.fingerprint}: {len(versions)} other registered version(s), "
            f"{'INCOMPATIBLE' if problems else 'ok'}"
        )
        if problems:
            found[info.name] = problems
    return found


def _check(args: argparse.Namespace) -> int:
    catalogue = _read_catalogue(args)
    if catalogue is None:
        return 2
    found = _problems(args, catalogue, args.mode)
    for name, problems in found.items():
        for problem in problems:
            print(f"  {name}: {problem}", file=sys.stderr)
    return 1 if found else 0


def _register(args: argparse.Namespace) -> int:
    catalogue = _read_catalogue(args)
    if catalogue is None:
        return 2
    if _problems(args, catalogue, "FULL"):
        print("not registering: fix the incompatible schemas first (`stacx schemas check`)", file=sys.stderr)
        return 1
    for info in _candidates(args):
        catalogue.register(info)
    catalogue.close()
    print(f"registered {len(_candidates(args))} schema(s) in {catalogue.config.topic}")
    return 0
