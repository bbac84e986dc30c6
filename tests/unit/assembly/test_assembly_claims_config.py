"""Claim checks at the edges, and `stacx assemble` config loading."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from stacx.consumers.assembly import (
    AssemblerApp,
    BatchEncoder,
    FailurePolicy,
    PackedGroup,
    PartialPolicy,
    decode_trajectory,
    pack_batch,
)
from stacx.consumers.assembly.errors import InvalidTrajectoryError
from stacx.consumers.assembly.testing import make_trajectory
from stacx.infra.commands.assemble import build_config
from stacx.infra.config import ConfigError
from stacx.producers.blobs import FsspecBlobStore
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import decode, encode
from stacx.schemas.records import TrainingBatch, WeightVersion


def test_claim_checked_trajectories_are_fetched(tmp_path: Path) -> None:
    traj = make_trajectory("g", 0)
    url, digest = FsspecBlobStore(str(tmp_path)).put(encode(traj), prefix="t")
    claim = ClaimCheck(uri=url, size_bytes=1, sha256=digest, record_type="stacx.Trajectory")
    assert decode_trajectory(encode(claim)).trajectory_id == traj.trajectory_id
    with pytest.raises(InvalidTrajectoryError, match="WeightVersion"):
        decode_trajectory(encode(WeightVersion(model_name="m", version=1, path="/p")))


def test_large_batches_leave_through_the_blob_store(tmp_path: Path) -> None:
    trajs = [make_trajectory("g", i, num_completion=400) for i in range(4)]
    batch = pack_batch([PackedGroup(group_id="g", trajectories=trajs)], model_name="m")
    small = BatchEncoder(BatchEncoder.Config(blob_store_url=str(tmp_path)))
    assert decode(small.encode(batch), TrainingBatch).batch_id == batch.batch_id
    tight = BatchEncoder(
        BatchEncoder.Config(claim_check_threshold_bytes=2048, blob_store_url=str(tmp_path))
    )
    claim = decode(tight.encode(batch))
    assert isinstance(claim, ClaimCheck) and claim.record_id == batch.batch_id
    stored = decode(FsspecBlobStore.get(claim.uri, sha256=claim.sha256), TrainingBatch)
    assert stored.trajectory_ids == batch.trajectory_ids


def _args(*flags: str, config: str | None = None) -> argparse.Namespace:
    """`stacx assemble`'s parsed command line: `--config` and the field flags generated from
    AssemblerApp.Config (`--grouping.group_size 4`)."""
    from stacx.infra.cli import build_parser

    argv = ["assemble", *(["--config", config] if config else []), *flags]
    return build_parser(argv).parse_args(argv)


def test_config_file_and_flags_build_the_component_configs(tmp_path: Path) -> None:
    path = tmp_path / "asm.yaml"
    path.write_text(
        "bootstrap_servers: kafka:9092\n"
        "assembler:\n"
        "  app_id: a1\n"
        "  partitions: 4\n"
        "  grouping: {group_size: 4, partial_policy: pad}\n"
        "  filtering: {failure_policy: mask, max_staleness: null}\n"
        "  mixture: {batch_size: 2, task_ratios: {math: 1, code: 3}}\n"
    )
    flags = ("--mixture.batch_size", "6", "--grouping.group_timeout_s", "9")
    config = build_config(_args(*flags, config=str(path)))
    assert isinstance(config, AssemblerApp.Config)
    assert config.bootstrap_servers == "kafka:9092" and config.app_id == "a1"
    assert config.grouping.group_size == 4 and config.grouping.group_timeout_s == 9.0
    assert config.grouping.partial_policy is PartialPolicy.PAD
    assert config.filtering.failure_policy is FailurePolicy.MASK
    assert config.filtering.max_staleness is None
    assert config.mixture.batch_size == 6 and config.mixture.task_ratios == {"math": 1, "code": 3}


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("assembler:\n  grouping: {group_sise: 4}\n")
    with pytest.raises(ConfigError, match="group_sise"):
        build_config(_args(config=str(path)))
    with pytest.raises(ConfigError, match="group_size"):
        build_config(_args("--grouping.group_size", "0", "--partitions", "1"))


def test_fast_rejoin_settings_are_validated_and_reach_faust() -> None:
    from stacx.consumers.assembly import AssemblerApp, AssemblyConfigError

    with pytest.raises(AssemblyConfigError, match="heartbeat_interval_s"):
        AssemblerApp.Config(partitions=1, session_timeout_s=6, heartbeat_interval_s=3)
    with pytest.raises(AssemblyConfigError, match="grouping.max_clock_step_s"):
        AssemblerApp.Config(partitions=1, tick_interval_s=5)
    app = AssemblerApp(AssemblerApp.Config(partitions=2, group_instance_id="assembler-0"),
                       forwarder=None).app
    assert app.conf.broker_session_timeout == 10.0
    assert app.conf.consumer_group_instance_id == "assembler-0"


def test_standby_replicas_are_validated_and_reach_faust() -> None:
    from stacx.consumers.assembly import AssemblerApp, AssemblyConfigError

    with pytest.raises(AssemblyConfigError, match="standby_replicas"):
        AssemblerApp.Config(partitions=1, standby_replicas=-1)
    default = AssemblerApp(AssemblerApp.Config(partitions=2), forwarder=None).app
    assert default.conf.table_standby_replicas == 0  # Faust's own default is 1
    app = AssemblerApp(AssemblerApp.Config(partitions=2, standby_replicas=1), forwarder=None).app
    assert app.conf.table_standby_replicas == 1


def test_consumer_fetch_size_is_validated_and_reaches_faust() -> None:
    from stacx.consumers.assembly import AssemblerApp, AssemblyConfigError

    with pytest.raises(AssemblyConfigError, match="consumer_max_fetch_bytes"):
        AssemblerApp.Config(partitions=1, consumer_max_fetch_bytes=0)
    default = AssemblerApp(AssemblerApp.Config(partitions=2), forwarder=None).app
    assert default.conf.consumer_max_fetch_size == 8 * 1024 * 1024  # Faust's own default is 1 MiB


@pytest.mark.parametrize("wait_ms", [0, 1501])
def test_the_fetch_wait_is_validated(wait_ms: int) -> None:
    from stacx.consumers.assembly import AssemblerApp, AssemblyConfigError

    with pytest.raises(AssemblyConfigError, match="fetch_max_wait_ms"):
        AssemblerApp.Config(partitions=1, fetch_max_wait_ms=wait_ms)


@pytest.mark.parametrize(("overrides", "expected"), [({}, 100), ({"fetch_max_wait_ms": 250}, 250)])
async def test_the_workers_kafka_consumer_waits_at_most_the_configured_time(
    overrides: dict[str, int], expected: int
) -> None:
    from stacx.consumers.assembly import AssemblerApp

    config = AssemblerApp.Config(partitions=2, **overrides)
    app = AssemblerApp(config, forwarder=None).app
    consumer = app.consumer._thread._create_worker_consumer(app.transport)  # type: ignore[attr-defined]
    try:
        assert consumer._fetch_max_wait_ms == expected  # Faust's own is 1,500 ms
        assert consumer._max_partition_fetch_bytes == config.consumer_max_fetch_bytes  # Faust's settings stay
    finally:
        await consumer.stop()


def test_the_worker_producer_writes_fast_lz4() -> None:
    from aiokafka import codec
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from stacx.consumers.assembly import AssemblerApp

    def batch(compression: int) -> bytes:  # a v2 record batch of one record, its 61-byte header cut
        builder = DefaultRecordBatchBuilder(2, compression, 0, -1, -1, -1, 2**20)
        builder.append(0, timestamp=1, key=None, value=payload, headers=[])
        return bytes(builder.build())[61:]

    AssemblerApp(AssemblerApp.Config(partitions=1), forwarder=None)
    payload = b"".join(i.to_bytes(4, "little") for i in range(20_000)) + b"tail" * 999
    records = batch(0)
    assert codec.lz4_encode(records, level=0) != codec.lz4_encode(records, level=9)
    assert batch(3) == codec.lz4_encode(records, level=0)  # 3: lz4
