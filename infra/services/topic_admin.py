"""What `stacx topics list | describe | gc --run` shows and does: the runs on a cluster, their
topics' sizes, the lag of every consumer group, and the deletion of a finished run.

A run's topics are `stacx.<kind>.<run id>` (trajectories, batches, weights, tasks) plus the
internal topics of its Faust workers (`stacx-assembler-<run id>-...`: ticks, groups, table
changelogs, the leader topic); its consumer groups are named after the run id too."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from stacx.infra.services import kafka_tools
from stacx.infra.services.errors import InfraError
from stacx.schemas import topics

__all__ = [
    "GroupLag",
    "RunSummary",
    "TopicInfo",
    "delete_run",
    "describe",
    "group_lags",
    "run_of",
    "runs",
    "topic_infos",
]

_RUN_KINDS = (*topics.KINDS, topics.ONCALL_TRAJECTORIES.removeprefix("stacx."))
"""The standard kinds, and the on-call join's output (`stacx.oncall.trajectories.<run>`)."""
_RUN_TOPIC = re.compile(r"^stacx\.(?:" + "|".join(re.escape(k) for k in _RUN_KINDS) + r")\.(?P<run>[^.]+)$")
_WORKER_PREFIXES = ("stacx-assembler-", "stacx-oncall-join-")
_GROUP_PREFIXES = (
    "stacx-assembler-",
    "stacx-trainer-",
    "stacx-rollout-weights-",
    "stacx-rollout-",
    "stacx-oncall-join-",
    "stacx-oncall-learner-",
    "stacx-weights-",
    "stacx-tracking-",
)
_TIMEOUT_S = 30.0
_WAIT_S = _TIMEOUT_S + 15.0
"""Longest wait for one admin answer (the request's own timeout plus the client's slack)."""


@dataclass(kw_only=True, slots=True)
class TopicInfo:
    """One topic: its run, partitions, retained records and bytes on disk."""

    name: str
    run: str | None
    """Run id (None: a standard or foreign topic)."""
    partitions: int
    records: int
    """Retained records (end offset - start offset, summed over partitions)."""
    size_bytes: int | None = None
    """Bytes in the brokers' log directories (None: not asked)."""


@dataclass(kw_only=True, slots=True)
class GroupLag:
    """A consumer group's position on one topic."""

    group: str
    topic: str
    committed: int
    """Committed offsets summed over partitions (-1 where none is committed counts as 0)."""
    end: int
    lag: int
    members: int
    state: str


@dataclass(kw_only=True, slots=True)
class RunSummary:
    """A run seen from Kafka."""

    run: str
    topics: list[TopicInfo] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(t.records for t in self.topics)

    @property
    def size_bytes(self) -> int | None:
        sizes = [t.size_bytes for t in self.topics]
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)


def run_of(name: str, known_runs: Iterable[str] = ()) -> str | None:
    """The run id a topic or group name belongs to (None: none).

    `stacx.batches.<run>` names its run; a worker's internal topic or a group
    (`stacx-assembler-<run>-ticks`, `stacx-trainer-<run>`) belongs to the longest known run id
    it starts with after its prefix."""
    match = _RUN_TOPIC.match(name)
    if match:
        return match.group("run")
    for prefix in _GROUP_PREFIXES + _WORKER_PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix) :]
            candidates = [r for r in known_runs if rest == r or rest.startswith(r + "-")]
            if candidates:
                return max(candidates, key=len)
    return None


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def topic_infos(bootstrap: str, *, names: list[str] | None = None, sizes: bool = False) -> list[TopicInfo]:
    """Every topic (or `names`) except Kafka's own, with its run, partitions and record count."""
    admin = _admin(bootstrap)
    meta = admin.list_topics(timeout=_TIMEOUT_S).topics
    wanted = sorted(n for n in meta if not n.startswith("__") and (names is None or n in names))
    parts = {n: sorted(meta[n].partitions) for n in wanted}
    start = _offsets(admin, parts, OffsetSpec.earliest())
    end = _offsets(admin, parts, OffsetSpec.latest())
    runs = {r for n in wanted if (r := run_of(n)) is not None}
    on_disk = _log_sizes(bootstrap, wanted) if sizes and wanted else {}
    return [
        TopicInfo(
            name=n,
            run=run_of(n, runs),
            partitions=len(parts[n]),
            records=sum(end[(n, p)] - start[(n, p)] for p in parts[n]),
            size_bytes=on_disk.get(n, 0) if sizes else None,
        )
        for n in wanted
    ]


def _offsets(admin: AdminClient, parts: dict[str, list[int]], spec: OffsetSpec) -> dict[tuple[str, int], int]:
    request = {TopicPartition(t, p): spec for t, ps in parts.items() for p in ps}
    if not request:
        return {}
    out: dict[tuple[str, int], int] = {}
    for tp, future in admin.list_offsets(request, request_timeout=_TIMEOUT_S).items():
        try:
            out[(tp.topic, tp.partition)] = max(_answer(future, f"list offsets of {tp.topic}").offset, 0)
        except KafkaException:  # a topic being deleted: counted as empty
            out[(tp.topic, tp.partition)] = 0
    return out


def _log_sizes(bootstrap: str, names: list[str], jars: Path | None = None) -> dict[str, int]:
    """Bytes per topic from Kafka's LogDirsCommand (`kafka-log-dirs.sh --describe`)."""
    out = kafka_tools.run_tool(
        kafka_tools.LOG_DIRS,
        "--bootstrap-server",
        bootstrap,
        "--describe",
        "--topic-list",
        ",".join(names),
        jars=jars,
    )
    doc = json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))
    sizes: dict[str, int] = defaultdict(int)
    for broker in doc["brokers"]:
        for log_dir in broker["logDirs"]:
            for part in log_dir["partitions"]:
                sizes[part["partition"].rsplit("-", 1)[0]] += int(part["size"])
    return dict(sizes)


def group_lags(bootstrap: str, *, topics_of_interest: set[str] | None = None) -> list[GroupLag]:
    """Committed offsets and lag of every consumer group on every topic it committed on."""
    admin = _admin(bootstrap)
    listed = _answer(admin.list_consumer_groups(request_timeout=_TIMEOUT_S), "list consumer groups")
    ids = sorted(g.group_id for g in listed.valid)
    if not ids:
        return []
    described = {
        g: _answer(f, f"describe group {g}")
        for g, f in admin.describe_consumer_groups(ids, request_timeout=_TIMEOUT_S).items()
    }
    rows: list[GroupLag] = []
    for group in ids:
        committed = _committed(admin, group, topics_of_interest)
        if not committed:
            continue
        ends = _offsets(admin, _by_topic(committed), OffsetSpec.latest())
        desc = described[group]
        for topic, parts in sorted(_by_topic(committed).items()):
            done = sum(max(committed[(topic, p)], 0) for p in parts)
            end = sum(ends[(topic, p)] for p in parts)
            rows.append(
                GroupLag(
                    group=group,
                    topic=topic,
                    committed=done,
                    end=end,
                    lag=sum(max(ends[(topic, p)] - max(committed[(topic, p)], 0), 0) for p in parts),
                    members=len(desc.members),
                    state=_state_name(desc.state),
                )
            )
    return rows


def _committed(admin: AdminClient, group: str, wanted: set[str] | None) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    future = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=_TIMEOUT_S
    )
    result = _answer(future[group], f"list the offsets of group {group}")
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in result.topic_partitions
        if wanted is None or tp.topic in wanted
    }


def _by_topic(offsets: dict[tuple[str, int], int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for topic, partition in offsets:
        out[topic].append(partition)
    return dict(out)


def _state_name(state: ConsumerGroupState) -> str:
    return str(getattr(state, "name", state)).lower()


def runs(infos: list[TopicInfo], groups: Iterable[str] = ()) -> list[RunSummary]:
    """Topics (and group names) by run."""
    by_run: dict[str, RunSummary] = {}
    for info in infos:
        if info.run is not None:
            by_run.setdefault(info.run, RunSummary(run=info.run)).topics.append(info)
    for group in groups:
        run = run_of(group, by_run)
        if run is not None:
            by_run[run].groups.append(group)
    return sorted(by_run.values(), key=lambda r: r.run)


def describe(bootstrap: str, run: str, *, sizes: bool = False) -> tuple[RunSummary, list[GroupLag]]:
    """One run: its topics and the lag of every group that reads them."""
    infos = topic_infos(bootstrap, sizes=sizes)
    found = [r for r in runs(infos) if r.run == run]
    if not found:
        raise InfraError(f"no topics of run {run!r} at {bootstrap}; `stacx topics list` shows the runs")
    summary = found[0]
    lags = group_lags(bootstrap, topics_of_interest={t.name for t in summary.topics})
    summary.groups = sorted({g.group for g in lags} | set(_run_groups(bootstrap, run)))
    # a worker reading the run under another app id keeps its internal topics under that id
    owned = {t.name for t in summary.topics}
    extra = [
        t for t in infos if t.name not in owned and t.name.startswith(tuple(g + "-" for g in summary.groups))
    ]
    summary.topics += extra
    if extra:
        lags += group_lags(bootstrap, topics_of_interest={t.name for t in extra})
    return summary, lags


def _run_groups(bootstrap: str, run: str) -> list[str]:
    """The groups named after `run` (those without committed offsets too)."""
    admin = _admin(bootstrap)  # held until the answer arrives: a dropped client cancels it
    listed = _answer(admin.list_consumer_groups(request_timeout=_TIMEOUT_S), "list consumer groups")
    return [g.group_id for g in listed.valid if run_of(g.group_id, [run]) == run]


def delete_run(bootstrap: str, run: str, *, dry_run: bool = False) -> tuple[list[str], list[str]]:
    """Delete a finished run's topics (its Faust internals included) and consumer groups;
    (topics, groups) deleted. Refuses while a group of the run has members (still running)."""
    summary, lags = describe(bootstrap, run)
    admin = _admin(bootstrap)
    described = (
        admin.describe_consumer_groups(summary.groups, request_timeout=_TIMEOUT_S) if summary.groups else {}
    )
    active = sorted(g for g, f in described.items() if _answer(f, f"describe group {g}").members)
    if active:
        raise InfraError(
            f"run {run!r} is still running: groups {', '.join(active)} have members; stop it first"
        )
    names = [t.name for t in summary.topics]
    if dry_run:
        return names, summary.groups
    for name, future in admin.delete_topics(names, operation_timeout=_TIMEOUT_S).items():
        _answer(future, f"delete topic {name}", strict=True)
    if summary.groups:
        for group, future in admin.delete_consumer_groups(summary.groups, request_timeout=_TIMEOUT_S).items():
            _answer(future, f"delete group {group}", strict=True)
    return names, summary.groups


def _answer(future: Future[Any], what: str, *, strict: bool = False) -> Any:
    """An admin request's result within a bounded wait: a broker that never answers is an
    `InfraError` naming the request, not a hang. `strict`: a refusal is one too (else raised)."""
    try:
        return future.result(timeout=_WAIT_S)
    except TimeoutError as exc:
        raise InfraError(f"cannot {what}: the broker did not answer in {_WAIT_S:.0f} s") from exc
    except KafkaException as exc:
        if strict:
            raise InfraError(f"cannot {what}: {exc}") from exc
        raise
